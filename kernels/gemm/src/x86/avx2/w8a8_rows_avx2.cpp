// The per-row form (Note [W8A8 rows] in ref/w8a8_rows_ref.cpp) with AVX2: row quantization eight
// and thirty-two at a time, and the 4-row x FRT_PANEL tile with vpmaddubsw + vpmaddwd. The same
// integers and fp32 bits as the reference.
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>

#include "gemm_tiles.h"
#include "x86/avx2/gemm_avx2.h"

namespace frt::kern {
namespace {

// quantize_one's steps (ref/w8a8_rows_ref.cpp) on eight elements.
inline __m256i quantize8_avx2(const void* x, int32_t dt, int64_t i, __m256 inv, __m256i z) {
  const __m256i v =
      _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(gemm_load8(x, dt, i), inv)), z);
  return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_setzero_si256()), _mm256_set1_epi32(127));
}

template <int R>
void w8a8_rows_tile_avx2(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
                         const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  const uint8_t* a[R];
  __m256i acc[R][2];
  for (int r = 0; r < R; ++r) {
    a[r] = q.u + (r0 + r) * q.lda;
    acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < kq; ++t) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + t * 64));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + t * 64 + 32));
    for (int r = 0; r < R; ++r) {
      int32_t quad;
      std::memcpy(&quad, a[r] + 4 * t, 4);
      const __m256i av = _mm256_set1_epi32(quad);
      acc[r][0] =
          _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(av, w0), ones));
      acc[r][1] =
          _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(av, w1), ones));
    }
  }
  alignas(32) float b[FRT_PANEL];
  gemm_panel_bias(w, p, bias, b);
  const float* sc = static_cast<const float*>(w->scales) + p * FRT_PANEL;
  const float* cs = static_cast<const float*>(w->mins) + p * FRT_PANEL;  // column sums
  const __m256i colsum[2] = {_mm256_cvtps_epi32(_mm256_loadu_ps(cs)),
                             _mm256_cvtps_epi32(_mm256_loadu_ps(cs + 8))};
  for (int r = 0; r < R; ++r) {
    const __m256 sx = _mm256_set1_ps(q.scale[r0 + r]);
    const __m256i z = _mm256_set1_epi32(q.zero[r0 + r]);
    for (int h = 0; h < 2; ++h) {
      const __m256i i = _mm256_sub_epi32(acc[r][h], _mm256_mullo_epi32(z, colsum[h]));
      const __m256 f =
          _mm256_mul_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(sx, _mm256_loadu_ps(sc + 8 * h)));
      _mm256_store_ps(tile + r * FRT_PANEL + 8 * h, _mm256_add_ps(f, _mm256_load_ps(b + 8 * h)));
    }
  }
}

}  // namespace

void quantize_row_u7_avx2(const void* x, int32_t dt, int64_t k, uint8_t* u, float* scale,
                          int32_t* zero) {
  U7Range range;
  int64_t i = 0;
  __m256 vlo = _mm256_setzero_ps(), vhi = vlo, vnan = vlo;
  for (; i + 8 <= k; i += 8) {
    const __m256 v = gemm_load8(x, dt, i);
    vlo = _mm256_min_ps(vlo, v);
    vhi = _mm256_max_ps(vhi, v);
    vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float l[8], h[8];
  _mm256_store_ps(l, vlo);
  _mm256_store_ps(h, vhi);
  for (int j = 0; j < 8; ++j)
    range.lo = std::min(range.lo, l[j]), range.hi = std::max(range.hi, h[j]);
  range.nan = _mm256_movemask_ps(vnan) != 0;
  u7_range_ref(x, dt, i, k, &range);
  float inv;
  if (!u7_params_ref(range, k, u, scale, zero, &inv)) return;
  const int32_t z = *zero;
  i = 0;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i vz = _mm256_set1_epi32(z);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (; i + 32 <= k; i += 32) {
    const __m256i ab = _mm256_packs_epi32(quantize8_avx2(x, dt, i, vinv, vz),
                                          quantize8_avx2(x, dt, i + 8, vinv, vz));
    const __m256i cd = _mm256_packs_epi32(quantize8_avx2(x, dt, i + 16, vinv, vz),
                                          quantize8_avx2(x, dt, i + 24, vinv, vz));
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + i), bytes);
  }
  u7_quantize_ref(x, dt, i, k, inv, z, u);
}

void w8a8_rows_tile_4x16_avx2(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
                              int64_t rows, const float* bias, float* tile) {
  with_tile_rows(rows,
                 [&](auto r) { w8a8_rows_tile_avx2<decltype(r)::value>(w, p, q, r0, bias, tile); });
}

}  // namespace frt::kern
