// Small helpers every kernel source shares: bf16 conversion, work splitting, workspace carving.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>

namespace frt::kern {

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even; NaN stays NaN (quiet), infinities stay infinite.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// Element i of a scale (or min) array stored in dtype (FRT_F32 or FRT_F16).
inline float scale_at(const void* base, int64_t i, int32_t dtype) {
  return dtype == FRT_F16 ? frt_f16_to_f32(static_cast<const uint16_t*>(base)[i])
                          : static_cast<const float*>(base)[i];
}

inline int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t align64(int64_t bytes) { return (bytes + 63) & ~int64_t{63}; }

// Thread ith of nth takes the contiguous share [begin, end) of `count` items, so each thread
// streams one contiguous stretch of the packed weight.
struct Range {
  int64_t begin, end;
};
inline Range split(int64_t count, int32_t ith, int32_t nth) {
  const int64_t per = count / nth, extra = count % nth;
  const int64_t begin = ith * per + (ith < extra ? ith : extra);
  return {begin, begin + per + (ith < extra ? 1 : 0)};
}

inline int32_t fail(frt_error* err, int32_t code, const char* fmt, auto... args) {
  if (err != nullptr) {
    err->code = code;
    std::snprintf(err->message, sizeof err->message, fmt, args...);
  }
  return code;
}

inline int32_t ok(frt_error* err) {
  if (err != nullptr) {
    err->code = FRT_OK;
    err->message[0] = '\0';
  }
  return FRT_OK;
}

inline const char* dtype_name(int32_t dt) {
  return dt == FRT_F32 ? "f32" : dt == FRT_BF16 ? "bf16" : dt == FRT_F16 ? "f16" : "unknown dtype";
}

}  // namespace frt::kern
