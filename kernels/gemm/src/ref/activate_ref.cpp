// The gemm feed-forward's activation, scalar: the generic variant's, and the vector paths' tail
// (Note [GEMM feed-forward] in gemm_ffn.cpp; the mirrors are x86/avx2/activate_avx2.cpp and
// x86/avx512/activate_zmm.cpp).
#include <frt_kern/util.h>

#include <cmath>
#include <cstring>

#include "gemm_act.h"
#include "gemm_tiles.h"

namespace frt::kern {
namespace {

using namespace gemm_act;

float exp1(float x) {
  x = kExpHi < x ? kExpHi : x;  // as _mm256_min_ps(hi, x): NaN stays
  x = kExpLo > x ? kExpLo : x;  // as _mm256_max_ps(lo, x)
  const float fx = std::floor(x * kLog2e + 0.5f);
  x = x - fx * kLn2Hi;
  x = x - fx * kLn2Lo;
  float y = kP[0];
  for (int i = 1; i < 6; ++i) y = y * x + kP[i];
  y = y * (x * x) + (x + 1.0f);
  if (std::isnan(fx)) return y;  // NaN: no exponent to build
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(fx) + 127) << 23;
  float pow2;
  std::memcpy(&pow2, &bits, 4);
  return y * pow2;
}

float act1(int32_t act, float g) {
  if (act == FRT_ACT_GELU) {
    const float x = g * kInvSqrt2;
    const float ax = std::fabs(x);
    const float t = 1.0f / (kAsP * ax + 1.0f);
    float poly = kAs[0];
    for (int i = 1; i < 5; ++i) poly = poly * t + kAs[i];
    poly = poly * t;
    const float erf_abs = 1.0f - poly * exp1(0.0f - ax * ax);
    const float erf = std::signbit(x) ? -erf_abs : erf_abs;
    return (0.5f * g) * (1.0f + erf);
  }
  float z = g;  // silu
  if (act == FRT_ACT_GELU_TANH) z = kTwoSqrt2OverPi * (kCubic * ((g * g) * g) + g);
  return g / (1.0f + exp1(0.0f - z));
}

}  // namespace

void gemm_activate_ref(int32_t act, const float* in, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = act1(act, in[i]);
}

}  // namespace frt::kern
