// Where the AVX-512 weight-only panels take a group's scale (and an int4 group's min) from: stored
// per group, or decoded from a super-block record. Shared by the FMA panels (panels_avx512.cpp)
// and the amx variant's tiles (panels_amx.cpp), so both apply a group the same way.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/zmm.h>

#include <cstdint>

namespace frt::kern {

// The sixteen scales (or mins) of a group from element i, in their stored dtype.
inline __m512 load_scales16(const void* base, int64_t i, int32_t dtype) {
  if (dtype == FRT_F16)
    return _mm512_cvtph_ps(_mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(base) + i)));
  return _mm512_loadu_ps(static_cast<const float*>(base) + i);
}

// Where a group's scale (and an int4 group's min) come from, as in panels_avx2.cpp: stored per
// group, or codes under the super-block's f16 scales (int4_super: s = d * sc, mn = -(dmin * m);
// int8_super: s = d * sc).
struct StoredScales {
  const frt_packed_weight* w;
  int64_t s0;  // the panel's first group scale
  __m512 scale(int64_t g) const {
    return load_scales16(w->scales, s0 + g * FRT_PANEL, w->scale_dtype);
  }
  // res + mn * xs
  __m512 add_min(int64_t g, __m512 xs, __m512 res) const {
    return _mm512_fmadd_ps(load_scales16(w->mins, s0 + g * FRT_PANEL, w->scale_dtype), xs, res);
  }
};
struct SuperScales {
  const uint8_t* records;  // the panel's first super record
  static __m512 coded(const uint8_t* rec, int unit_at, int codes_at, int64_t g) {
    const __m512 unit =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + unit_at)));
    const __m128i codes = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(rec + codes_at + (g % FRT_SUPER4_GROUPS) * FRT_PANEL));
    return _mm512_mul_ps(unit, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes)));
  }
  const uint8_t* record(int64_t g) const {
    return records + (g / FRT_SUPER4_GROUPS) * FRT_SUPER4_RECORD;
  }
  __m512 scale(int64_t g) const { return coded(record(g), 0, FRT_SUPER4_SC_AT, g); }
  // res - (dmin * m) * xs: the same rounding as res + (-(dmin * m)) * xs.
  __m512 add_min(int64_t g, __m512 xs, __m512 res) const {
    return _mm512_fnmadd_ps(coded(record(g), FRT_SUPER4_DMIN_AT, FRT_SUPER4_M_AT, g), xs, res);
  }
};

struct Super8Scales {
  const uint8_t* records;  // the panel's first super record (FRT_W_INT8_SUPER)
  __m512 scale(int64_t g) const {
    const uint8_t* rec = records + (g / FRT_SUPER8_GROUPS) * FRT_SUPER8_RECORD;
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec)));
    const __m128i codes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(
        rec + FRT_SUPER8_SC_AT + (g % FRT_SUPER8_GROUPS) * FRT_PANEL));
    return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)));
  }
};

// res += s * acc + mn * xs for one group: the min enters once per group through the row's group
// sum, sum (q s + mn) x = s sum q x + mn sum x.
template <typename Scales>
inline __m512 apply_group(const Scales& sc, int64_t g, float xs, __m512 acc, __m512 res) {
  return _mm512_fmadd_ps(sc.scale(g), acc, sc.add_min(g, _mm512_set1_ps(xs), res));
}

}  // namespace frt::kern
