// Single to half for the packers (the scales and mins they store as FRT_F16); the other way is
// frt_f16_to_f32 in frt_kernel_abi.h, the one definition the kernels share.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace frt::detail {

// Single to half, round to nearest even (finite inputs; overflow saturates to infinity).
inline uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds past 65504
  if (ax < 0x38800000u) {  // below the smallest normal half: subnormal or zero
    float af;
    std::memcpy(&af, &ax, sizeof af);
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(af * 16777216.0f)));
  }
  const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((rounded - 0x38000000u) >> 13));
}

}  // namespace frt::detail
