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

}  // namespace

void quantize_row_u7_zmm(const void* x, int32_t dt, int64_t k, uint8_t* u, float* scale,
                         int32_t* zero) {
  U7Range range;
  int64_t i = 0;
  // Masked past k: the lanes left out are 0, and 0 is inside [lo, hi] from the start.
  __m512 vlo = _mm512_setzero_ps(), vhi = vlo;
  __mmask16 vnan = 0;
  for (; i < k; i = std::min(i + 16, k)) {
    const __m512 v = gemm_load16(x, dt, i, k - i);
    vlo = _mm512_min_ps(vlo, v);
    vhi = _mm512_max_ps(vhi, v);
    vnan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  alignas(64) float l[16], h[16];
  _mm512_store_ps(l, vlo);
  _mm512_store_ps(h, vhi);
  for (int j = 0; j < 16; ++j)
    range.lo = std::min(range.lo, l[j]), range.hi = std::max(range.hi, h[j]);
  range.nan = vnan != 0;
  float inv;
  if (!u7_params_ref(range, k, u, scale, zero, &inv)) return;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i vz = _mm512_set1_epi32(*zero), top = _mm512_set1_epi32(127);
  for (i = 0; i < k; i = std::min(i + 16, k)) {  // quantize_one's steps, sixteen at a time
    const __m512i v =
        _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(gemm_load16(x, dt, i, k - i), vinv)), vz);
    gemm_store16_bytes(u + i, _mm512_min_epi32(_mm512_max_epi32(v, _mm512_setzero_si512()), top),
                       k - i);
  }
  u7_quantize_ref(x, dt, k, k, inv, *zero, u);  // the zeros on to the quad boundary
}

void w8a8_rows_tile_4x16_zmm(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
                             int64_t rows, const float* bias, float* tile) {
  with_tile_rows(rows,
                 [&](auto r) { w8a8_rows_tile_zmm<decltype(r)::value>(w, p, q, r0, bias, tile); });
}

}  // namespace frt::kern
