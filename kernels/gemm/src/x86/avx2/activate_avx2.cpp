// The gemm feed-forward's activation eight at a time (Note [GEMM feed-forward] in gemm_ffn.cpp):
// the scalar mirror's IEEE operations in the same order (ref/activate_ref.cpp), which takes the
// tail. The avx2 variant uses it (avx512vnni and amx: x86/avx512/activate_zmm.cpp).
#include <immintrin.h>

#include "gemm_act.h"
#include "gemm_tiles.h"

namespace frt::kern {
namespace {

using namespace gemm_act;

inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(kExpLo), _mm256_min_ps(_mm256_set1_ps(kExpHi), x));
  const __m256 fx = _mm256_floor_ps(
      _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _mm256_set1_ps(0.5f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(kLn2Hi)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(kLn2Lo)));
  __m256 y = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(kP[i]));
  y = _mm256_add_ps(_mm256_mul_ps(y, _mm256_mul_ps(x, x)), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i n = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
  return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23)));
}

inline __m256 act8(int32_t act, __m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  if (act == FRT_ACT_GELU) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 x = _mm256_mul_ps(g, _mm256_set1_ps(kInvSqrt2));
    const __m256 ax = _mm256_andnot_ps(sign, x);
    const __m256 t =
        _mm256_div_ps(one, _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(kAsP), ax), one));
    __m256 poly = _mm256_set1_ps(kAs[0]);
    for (int i = 1; i < 5; ++i)
      poly = _mm256_add_ps(_mm256_mul_ps(poly, t), _mm256_set1_ps(kAs[i]));
    poly = _mm256_mul_ps(poly, t);
    const __m256 e = exp8(_mm256_sub_ps(zero, _mm256_mul_ps(ax, ax)));
    const __m256 erf_abs = _mm256_sub_ps(one, _mm256_mul_ps(poly, e));
    const __m256 erf = _mm256_xor_ps(erf_abs, _mm256_and_ps(sign, x));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g), _mm256_add_ps(one, erf));
  }
  __m256 z = g;
  if (act == FRT_ACT_GELU_TANH) {
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    z = _mm256_mul_ps(_mm256_set1_ps(kTwoSqrt2OverPi),
                      _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(kCubic), g3), g));
  }
  return _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, z))));
}

}  // namespace

void gemm_activate_avx2(int32_t act, const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, act8(act, _mm256_loadu_ps(in + i)));
  gemm_activate_ref(act, in + i, out + i, n - i);
}

}  // namespace frt::kern
