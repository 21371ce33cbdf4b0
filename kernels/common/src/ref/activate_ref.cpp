// The feed-forwards' epilogue, scalar: the definition every variant's fast path must match.
#include <frt_kern/panels.h>

#include <cmath>

namespace frt::kern {
namespace {

float act_of(int32_t act, float g) {
  if (act == FRT_ACT_SILU) return g / (1.0f + std::exp(-g));
  if (act == FRT_ACT_GELU) return 0.5f * g * (1.0f + std::erf(g * 0.7071067811865476f));
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
}

}  // namespace

void activate_ref(int32_t act, const float* g, const float* bias, const float* mul, float* out,
                  int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = act_of(act, g[i] + (bias != nullptr ? bias[i] : 0.0f));
    out[i] = mul != nullptr ? v * mul[i] : v;
  }
}

}  // namespace frt::kern
