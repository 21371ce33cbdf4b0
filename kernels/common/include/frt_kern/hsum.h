// Horizontal sums of one vector: the eight lanes of a ymm (AVX2) and, in the zmm paths
// (FRT_ZMM), the sixteen of a zmm. One definition for the dot products and the attention, so
// every caller adds its lanes in the same order.
#pragma once

#if defined(FRT_ZMM)
#include <frt_kern/zmm.h>
#elif defined(__AVX2__)
#include <immintrin.h>
#endif

namespace frt::kern {

#if defined(__AVX2__)
inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
#endif

#if defined(FRT_ZMM)
inline float hsum(__m512 v) {
  return hsum(_mm256_add_ps(_mm512_castps512_ps256(v),
                            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}
#endif

}  // namespace frt::kern
