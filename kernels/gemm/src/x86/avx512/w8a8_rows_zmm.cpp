// The per-row form (Note [W8A8 rows] in ref/w8a8_rows_ref.cpp) with zmm: row quantization sixteen
// lanes at a time (masked past k), and the 4-row x FRT_PANEL tile with one vpdpbusd per row and
// quad (one zmm holds the panel's quad: 16 columns x 4 k). The same integers and fp32 bits as the
// reference.
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>

#include "gemm_tiles.h"
#include "x86/avx512/gemm_zmm.h"

namespace frt::kern {
namespace {

template <int R>
void w8a8_rows_tile_zmm(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
                        const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  const uint8_t* a[R];
  __m512i acc[R];
  for (int r = 0; r < R; ++r) {
    a[r] = q.u + (r0 + r) * q.lda;
    acc[r] = _mm512_setzero_si512();
  }
  for (int64_t t = 0; t < kq; ++t) {
    const __m512i wv = _mm512_loadu_si512(wp + t * 64);
    for (int r = 0; r < R; ++r) {
      int32_t quad;
      std::memcpy(&quad, a[r] + 4 * t, 4);
      acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(quad), wv);
    }
  }
  const RowsEpilogue e(w, p, bias);
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(tile + r * FRT_PANEL, e.row(acc[r], q.zero[r0 + r], q.scale[r0 + r]));
}

// Sixteen whole elements at i, as fp32.
template <int32_t DT>
__m512 load16(const void* x, int64_t i) {
  if constexpr (DT == FRT_F32) return _mm512_loadu_ps(static_cast<const float*>(x) + i);
  const __m256i h =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(x) + i));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Note [Row quantizer speed]: the row's range with four pairs of accumulators (a min or max waits
// four cycles on the one before, so one pair held the pass to sixteen elements per four cycles),
// and its bytes 64 at a time, packed with saturating packs (the values are in 0..127 already, so
// the packs change nothing) and stored at once instead of four narrowing stores. The same bytes
// in 0.75 of the time (2048 rows of 3072 bf16 on the Xeon, one thread: 853 -> 644 ns a row, half
// of it now the row's read from memory; bench/results/amx/gemm_ablation.json).
template <int32_t DT>
void quantize_row_u7(const void* x, int64_t k, uint8_t* u, float* scale, int32_t* zero) {
  // Lanes left out are 0, and 0 is inside [lo, hi] from the start.
  __m512 lo[4], hi[4];
  for (int j = 0; j < 4; ++j) lo[j] = hi[j] = _mm512_setzero_ps();
  __mmask16 nan = 0;
  int64_t i = 0;
  for (; i + 64 <= k; i += 64)
    for (int j = 0; j < 4; ++j) {
      const __m512 v = load16<DT>(x, i + 16 * j);
      lo[j] = _mm512_min_ps(lo[j], v);
      hi[j] = _mm512_max_ps(hi[j], v);
      nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    }
  for (; i < k; i = std::min(i + 16, k)) {  // masked past k
    const __m512 v = gemm_load16(x, DT, i, k - i);
    lo[0] = _mm512_min_ps(lo[0], v);
    hi[0] = _mm512_max_ps(hi[0], v);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  // A NaN lane leaves lo and hi order-dependent; the row is then refused as a whole below.
  U7Range range;
  alignas(64) float l[16], h[16];
  _mm512_store_ps(l, _mm512_min_ps(_mm512_min_ps(lo[0], lo[1]), _mm512_min_ps(lo[2], lo[3])));
  _mm512_store_ps(h, _mm512_max_ps(_mm512_max_ps(hi[0], hi[1]), _mm512_max_ps(hi[2], hi[3])));
  for (int j = 0; j < 16; ++j)
    range.lo = std::min(range.lo, l[j]), range.hi = std::max(range.hi, h[j]);
  range.nan = nan != 0;
  float inv;
  if (!u7_params_ref(range, k, u, scale, zero, &inv)) return;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i vz = _mm512_set1_epi32(*zero), top = _mm512_set1_epi32(127);
  auto quantize16 = [&](__m512 v) {  // quantize_one's steps, sixteen at a time
    const __m512i q = _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v, vinv)), vz);
    return _mm512_min_epi32(_mm512_max_epi32(q, _mm512_setzero_si512()), top);
  };
  // packs then packus leave lane L's four dwords as rows j = 0..3's elements 4L..4L+3.
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  for (i = 0; i + 64 <= k; i += 64) {
    const __m512i w01 =
        _mm512_packs_epi32(quantize16(load16<DT>(x, i)), quantize16(load16<DT>(x, i + 16)));
    const __m512i w23 =
        _mm512_packs_epi32(quantize16(load16<DT>(x, i + 32)), quantize16(load16<DT>(x, i + 48)));
    _mm512_storeu_si512(u + i, _mm512_permutexvar_epi32(order, _mm512_packus_epi16(w01, w23)));
  }
  for (; i < k; i = std::min(i + 16, k))
    gemm_store16_bytes(u + i, quantize16(gemm_load16(x, DT, i, k - i)), k - i);
  u7_quantize_ref(x, DT, k, k, inv, *zero, u);  // the zeros on to the quad boundary
}

}  // namespace

void quantize_row_u7_zmm(const void* x, int32_t dt, int64_t k, uint8_t* u, float* scale,
                         int32_t* zero) {
  if (dt == FRT_F32)
    quantize_row_u7<FRT_F32>(x, k, u, scale, zero);
  else
    quantize_row_u7<FRT_BF16>(x, k, u, scale, zero);
}

void w8a8_rows_tile_4x16_zmm(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
                             int64_t rows, const float* bias, float* tile) {
  with_tile_rows(rows,
                 [&](auto r) { w8a8_rows_tile_zmm<decltype(r)::value>(w, p, q, r0, bias, tile); });
}

}  // namespace frt::kern
