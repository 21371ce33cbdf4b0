// The feed-forwards' epilogue with AVX2 + FMA: eight activations at a time.
//
// Note [Vector activations]: the scalar epilogue called std::tanh / std::erf / std::exp once per
// intermediate element (8192 per row at Phi-1.5's widths), ~36 us per call of a 34 MB int8 FFN:
// 3% of the call, enough to make the fused seat slower than two projection seats with torch's
// vectorised GELU between them. Here every activation is a rational function of one vector exp:
//   silu(g)      = g / (1 + e^-g)
//   gelu_tanh(g) = 0.5 g (1 + tanh u) = g / (1 + e^-2u),  u = sqrt(2/pi) (g + 0.044715 g^3)
//   gelu(g)      = 0.5 g (1 + erf(g / sqrt 2)), erf by Abramowitz & Stegun 7.1.26 (|err| <= 1.5e-7)
// exp is exp_avx2.h's (Cephes' expf, ~2 ulp).
// Clamps take the input as their second operand, so a NaN input stays NaN.
#include <frt_kern/exp_avx2.h>
#include <frt_kern/panels.h>
#include <immintrin.h>

namespace frt::kern {
namespace {

// g / (1 + e^(-s g)): silu at s = 1; gelu_tanh with the cubic folded into s g.
inline __m256 logistic_times(__m256 g, __m256 z) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(g, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), z))));
}

inline __m256 gelu_erf(__m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 sign_mask = _mm256_set1_ps(-0.0f);
  const __m256 x = _mm256_mul_ps(g, _mm256_set1_ps(0.7071067811865476f));
  const __m256 ax = _mm256_andnot_ps(sign_mask, x);
  const __m256 t = _mm256_div_ps(one, _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), ax, one));
  __m256 poly = _mm256_set1_ps(1.061405429f);
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-1.453152027f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(1.421413741f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(-0.284496736f));
  poly = _mm256_fmadd_ps(poly, t, _mm256_set1_ps(0.254829592f));
  poly = _mm256_mul_ps(poly, t);
  const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(ax, ax)));
  const __m256 erf_abs = _mm256_fnmadd_ps(poly, e, one);
  const __m256 erf = _mm256_or_ps(erf_abs, _mm256_and_ps(sign_mask, x));  // odd
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g), _mm256_add_ps(one, erf));
}

inline __m256 activate8(int32_t act, __m256 g) {
  if (act == FRT_ACT_SILU) return logistic_times(g, g);
  if (act == FRT_ACT_GELU) return gelu_erf(g);
  // 2u = 2 sqrt(2/pi) (g + 0.044715 g^3)
  const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
  const __m256 two_u = _mm256_mul_ps(_mm256_set1_ps(1.5957691216057308f),
                                     _mm256_fmadd_ps(_mm256_set1_ps(0.044715f), g3, g));
  return logistic_times(g, two_u);
}

}  // namespace

void activate_avx2(int32_t act, const float* g, const float* bias, const float* mul, float* out,
                   int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(g + i);
    if (bias != nullptr) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + i));
    v = activate8(act, v);
    if (mul != nullptr) v = _mm256_mul_ps(v, _mm256_loadu_ps(mul + i));
    _mm256_storeu_ps(out + i, v);
  }
  // The tail through the scalar definition (widths that are not a multiple of 8).
  if (i < n)
    activate_ref(act, g + i, bias != nullptr ? bias + i : nullptr,
                 mul != nullptr ? mul + i : nullptr, out + i, n - i);
}

}  // namespace frt::kern
