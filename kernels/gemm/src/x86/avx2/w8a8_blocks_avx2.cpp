// The block form (Note [W8A8 blocks] in ref/w8a8_blocks_ref.cpp) with AVX2: full blocks quantized
// thirty-two at a time (a partial last block by the reference), and the 4-row x FRT_PANEL tile
// with vpsignb + vpmaddubsw. The same integers and fp32 bits as the reference.
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gemm_tiles.h"
#include "x86/avx2/gemm_avx2.h"

namespace frt::kern {
namespace {

// One full block of 32: the same amax, scale and rounding as the scalar loop (cvtps rounds to
// nearest even, as nearbyint does in the default mode), so both paths write the same bytes.
inline void quantize_block_avx2(const void* x, int32_t dt, int64_t i0, int8_t* a, float* d) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], m = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    v[j] = gemm_load8(x, dt, i0 + 8 * j);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  const float amax = _mm_cvtss_f32(h);
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  *d = amax / 127.0f;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i q[4];
  for (int j = 0; j < 4; ++j)
    q[j] =
        _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[j], vinv)), lo), hi);
  const __m256i w =
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + i0), _mm256_permutevar8x32_epi32(w, order));
}

template <int R>
void w8a8_blocks_tile_avx2(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                           const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  const int8_t* a[R];
  const float* d[R];
  for (int r = 0; r < R; ++r) {
    a[r] = q.a + (r0 + r) * q.lda;
    d[r] = q.d + (r0 + r) * q.ldd;
  }
  // The fp32 sums live in the tile (touched once per block), so the inner loop keeps its 2R
  // integer accumulators and the weights in registers without spilling.
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) _mm256_store_ps(tile + r * FRT_PANEL + 8 * h, _mm256_setzero_ps());
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t t0 = 0, b = 0; t0 < kq; t0 += kQuadsPerBlock, ++b) {
    const int64_t t1 = std::min(kq, t0 + kQuadsPerBlock);
    __m256i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t t = t0; t < t1; ++t) {
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + t * 64));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + t * 64 + 32));
      const __m256i m0 = _mm256_abs_epi8(w0), m1 = _mm256_abs_epi8(w1);
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        std::memcpy(&quad, a[r] + 4 * t, 4);
        const __m256i av = _mm256_set1_epi32(quad);
        acc[r][0] = _mm256_add_epi32(
            acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(m0, _mm256_sign_epi8(av, w0)), ones));
        acc[r][1] = _mm256_add_epi32(
            acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(m1, _mm256_sign_epi8(av, w1)), ones));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 db = _mm256_set1_ps(d[r][b]);
      for (int h = 0; h < 2; ++h) {
        float* f = tile + r * FRT_PANEL + 8 * h;
        _mm256_store_ps(
            f, _mm256_add_ps(_mm256_load_ps(f), _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][h]), db)));
      }
    }
  }
  alignas(32) float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  const float* sc = static_cast<const float*>(w->scales) + p * FRT_PANEL;
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      float* f = tile + r * FRT_PANEL + 8 * h;
      _mm256_store_ps(f,
                      _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(f), _mm256_loadu_ps(sc + 8 * h)),
                                    _mm256_load_ps(bb + 8 * h)));
    }
}

}  // namespace

void quantize_row_s8_blocks_avx2(const void* x, int32_t dt, int64_t k, int8_t* a, float* d) {
  const int64_t blocks = div_up(k, kGemmActBlock);
  int64_t i = 0;
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 bad = _mm256_setzero_ps();
  for (; i + 8 <= k; i += 8)  // |x| == inf or NaN (unordered)
    bad = _mm256_or_ps(
        bad, _mm256_cmp_ps(_mm256_andnot_ps(sign, gemm_load8(x, dt, i)), inf, _CMP_NLT_UQ));
  if (_mm256_movemask_ps(bad) != 0 || !s8_finite_ref(x, dt, i, k)) return s8_nan_row_ref(k, a, d);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kGemmActBlock, i1 = std::min(k, i0 + kGemmActBlock);
    if (i1 - i0 == kGemmActBlock)
      quantize_block_avx2(x, dt, i0, a, d + b);
    else
      s8_block_ref(x, dt, i0, i1, a, d + b);
  }
  s8_pad_ref(k, a);
}

void w8a8_blocks_tile_4x16_avx2(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                                int64_t r0, int64_t rows, const float* bias, float* tile) {
  with_tile_rows(
      rows, [&](auto r) { w8a8_blocks_tile_avx2<decltype(r)::value>(w, p, q, r0, bias, tile); });
}

}  // namespace frt::kern
