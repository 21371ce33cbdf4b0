// The gemm feed-forward's activation sixteen at a time (Note [GEMM feed-forward] in gemm_ffn.cpp):
// the AVX2 path's IEEE operations in the same order on twice the lanes (x86/avx2/activate_avx2.cpp;
// the scalar mirror ref/activate_ref.cpp takes the tail), so the same bits at half the
// instructions. The avx512vnni and amx variants use it.
#include "gemm_act.h"
#include "gemm_tiles.h"
#include "x86/avx512/gemm_zmm.h"

namespace frt::kern {
namespace {

using namespace gemm_act;

inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(kExpLo), _mm512_min_ps(_mm512_set1_ps(kExpHi), x));
  const __m512 fx = _mm512_floor_ps(
      _mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _mm512_set1_ps(0.5f)));
  x = _mm512_sub_ps(x, _mm512_mul_ps(fx, _mm512_set1_ps(kLn2Hi)));
  x = _mm512_sub_ps(x, _mm512_mul_ps(fx, _mm512_set1_ps(kLn2Lo)));
  __m512 y = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm512_add_ps(_mm512_mul_ps(y, x), _mm512_set1_ps(kP[i]));
  y = _mm512_add_ps(_mm512_mul_ps(y, _mm512_mul_ps(x, x)), _mm512_add_ps(x, _mm512_set1_ps(1.0f)));
  const __m512i n = _mm512_add_epi32(_mm512_cvttps_epi32(fx), _mm512_set1_epi32(127));
  return _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(n, 23)));
}

// act(g) for FRT_ACT_SILU, FRT_ACT_GELU_TANH or FRT_ACT_GELU.
inline __m512 act16(int32_t act, __m512 g) {
  const __m512 one = _mm512_set1_ps(1.0f), zero = _mm512_setzero_ps();
  if (act == FRT_ACT_GELU) {
    const __m512i sign = _mm512_set1_epi32(static_cast<int32_t>(0x80000000u));
    const __m512 x = _mm512_mul_ps(g, _mm512_set1_ps(kInvSqrt2));
    const __m512 ax = _mm512_castsi512_ps(_mm512_andnot_si512(sign, _mm512_castps_si512(x)));
    const __m512 t =
        _mm512_div_ps(one, _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(kAsP), ax), one));
    __m512 poly = _mm512_set1_ps(kAs[0]);
    for (int i = 1; i < 5; ++i)
      poly = _mm512_add_ps(_mm512_mul_ps(poly, t), _mm512_set1_ps(kAs[i]));
    poly = _mm512_mul_ps(poly, t);
    const __m512 e = exp16(_mm512_sub_ps(zero, _mm512_mul_ps(ax, ax)));
    const __m512 erf_abs = _mm512_sub_ps(one, _mm512_mul_ps(poly, e));
    const __m512 erf = _mm512_castsi512_ps(_mm512_xor_si512(
        _mm512_castps_si512(erf_abs), _mm512_and_si512(sign, _mm512_castps_si512(x))));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), g), _mm512_add_ps(one, erf));
  }
  __m512 z = g;
  if (act == FRT_ACT_GELU_TANH) {
    const __m512 g3 = _mm512_mul_ps(_mm512_mul_ps(g, g), g);
    z = _mm512_mul_ps(_mm512_set1_ps(kTwoSqrt2OverPi),
                      _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(kCubic), g3), g));
  }
  return _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_sub_ps(zero, z))));
}

}  // namespace

void gemm_activate_zmm(int32_t act, const float* in, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, act16(act, _mm512_loadu_ps(in + i)));
  gemm_activate_ref(act, in + i, out + i, n - i);
}

}  // namespace frt::kern
