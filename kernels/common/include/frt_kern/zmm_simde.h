// TEST ONLY. The AVX-512 names of the zmm paths on an AVX2 CPU: SIMDe's native aliases, plus the
// few intrinsics SIMDe 0.7.4 (Debian bookworm's libsimde-dev) does not provide.
//
// Note [Emulated zmm variant]: the avx512vnni variant's zmm paths must be right on the AVX-512
// machines that run them natively, while the development machine (Zen 3) has AVX2 only. So the
// build compiles the very same sources a second time with AVX2 flags, FRT_ZMM and FRT_ZMM_SIMDE,
// into a separate test-only root (<build>/kernel_test_root, never in metadata.json, never
// installed), and the kernel tests run it as the variant "avx512vnni-simde" next to generic,
// avx2 and the real avx512vnni (which they skip on CPUs without the ISA). Each gap below is a
// lane-wise op done on the two 256-bit halves with the AVX2 instruction of the same definition
// (same rounding, same out-of-range result), or a masked memory access done element by element,
// which touches exactly the elements the mask selects, as the hardware does. Missing in SIMDe
// 0.7.4 and used here: the int32 <-> fp32 conversions (rounding and truncating), the byte
// and word widenings to int32, cvtph, masked loads and stores (every one of them), the
// dword-to-word narrowing and the unsigned dword compare. SIMDe has vpdpbusd, abs_epi8,
// movepi8_mask, the masked byte subtract and the saturating narrowings.
#pragma once

#if !defined(FRT_ZMM_SIMDE)
#error "zmm_simde.h is for the test-only emulated build (FRT_ZMM_SIMDE)"
#endif

#include <immintrin.h>

#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#include <cstdint>

namespace frt::kern::simde_gaps {

inline __m512i join(__m256i lo, __m256i hi) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}
inline __m512 join(__m256 lo, __m256 hi) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1);
}
inline __m256i lo256(__m512i v) { return _mm512_castsi512_si256(v); }
inline __m256i hi256(__m512i v) { return _mm512_extracti64x4_epi64(v, 1); }
inline __m256 lo256(__m512 v) { return _mm512_castps512_ps256(v); }
inline __m256 hi256(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

inline __m512 cvtepi32_ps(__m512i v) {
  return join(_mm256_cvtepi32_ps(lo256(v)), _mm256_cvtepi32_ps(hi256(v)));
}
inline __m512i cvtps_epi32(__m512 v) {
  return join(_mm256_cvtps_epi32(lo256(v)), _mm256_cvtps_epi32(hi256(v)));
}
inline __m512i cvttps_epi32(__m512 v) {
  return join(_mm256_cvttps_epi32(lo256(v)), _mm256_cvttps_epi32(hi256(v)));
}
inline __m512i cvtepi8_epi32(__m128i v) {
  return join(_mm256_cvtepi8_epi32(v), _mm256_cvtepi8_epi32(_mm_srli_si128(v, 8)));
}
inline __m512i cvtepu8_epi32(__m128i v) {
  return join(_mm256_cvtepu8_epi32(v), _mm256_cvtepu8_epi32(_mm_srli_si128(v, 8)));
}
inline __m512i cvtepu16_epi32(__m256i v) {
  return join(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(v)),
              _mm256_cvtepu16_epi32(_mm256_extracti128_si256(v, 1)));
}
inline __m512 cvtph_ps(__m256i v) {
  return join(_mm256_cvtph_ps(_mm256_castsi256_si128(v)),
              _mm256_cvtph_ps(_mm256_extracti128_si256(v, 1)));
}

inline __m512 maskz_loadu_ps(__mmask16 k, const void* p) {
  alignas(64) float v[16] = {};
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) v[i] = static_cast<const float*>(p)[i];
  return _mm512_load_ps(v);
}
inline __m256i maskz_loadu_epi16_256(__mmask16 k, const void* p) {
  alignas(32) uint16_t v[16] = {};
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) v[i] = static_cast<const uint16_t*>(p)[i];
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(v));
}
inline void mask_storeu_epi8_128(void* p, __mmask16 k, __m128i v) {
  alignas(16) uint8_t s[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(s), v);
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) static_cast<uint8_t*>(p)[i] = s[i];
}

inline void mask_storeu_ps(void* p, __mmask16 k, __m512 v) {
  alignas(64) float s[16];
  _mm512_store_ps(s, v);
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) static_cast<float*>(p)[i] = s[i];
}
inline void mask_storeu_epi16_256(void* p, __mmask16 k, __m256i v) {
  alignas(32) uint16_t s[16];
  _mm256_store_si256(reinterpret_cast<__m256i*>(s), v);
  for (int i = 0; i < 16; ++i)
    if ((k >> i) & 1) static_cast<uint16_t*>(p)[i] = s[i];
}
// vpmovdw: each lane's low 16 bits.
inline __m256i cvtepi32_epi16(__m512i v) {
  alignas(64) uint32_t s[16];
  alignas(32) uint16_t d[16];
  _mm512_store_si512(s, v);
  for (int i = 0; i < 16; ++i) d[i] = static_cast<uint16_t>(s[i]);
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(d));
}
inline __mmask16 cmpgt_epu32_mask(__m512i a, __m512i b) {
  alignas(64) uint32_t x[16], y[16];
  _mm512_store_si512(x, a);
  _mm512_store_si512(y, b);
  __mmask16 k = 0;
  for (int i = 0; i < 16; ++i) k |= static_cast<__mmask16>((x[i] > y[i] ? 1u : 0u) << i);
  return k;
}

}  // namespace frt::kern::simde_gaps

// The compiler's own declarations of these (immintrin.h) need AVX-512 to inline: the calls are
// redirected, as SIMDe's aliases redirect the rest.
#define _mm512_cvtepi32_ps(v) ::frt::kern::simde_gaps::cvtepi32_ps(v)
#define _mm512_cvtps_epi32(v) ::frt::kern::simde_gaps::cvtps_epi32(v)
#define _mm512_cvttps_epi32(v) ::frt::kern::simde_gaps::cvttps_epi32(v)
#define _mm512_cvtepi8_epi32(v) ::frt::kern::simde_gaps::cvtepi8_epi32(v)
#define _mm512_cvtepu8_epi32(v) ::frt::kern::simde_gaps::cvtepu8_epi32(v)
#define _mm512_cvtepu16_epi32(v) ::frt::kern::simde_gaps::cvtepu16_epi32(v)
#define _mm512_cvtph_ps(v) ::frt::kern::simde_gaps::cvtph_ps(v)
#define _mm512_maskz_loadu_ps(k, p) ::frt::kern::simde_gaps::maskz_loadu_ps(k, p)
#define _mm256_maskz_loadu_epi16(k, p) ::frt::kern::simde_gaps::maskz_loadu_epi16_256(k, p)
#define _mm_mask_storeu_epi8(p, k, v) ::frt::kern::simde_gaps::mask_storeu_epi8_128(p, k, v)
#define _mm512_mask_storeu_ps(p, k, v) ::frt::kern::simde_gaps::mask_storeu_ps(p, k, v)
#define _mm256_mask_storeu_epi16(p, k, v) ::frt::kern::simde_gaps::mask_storeu_epi16_256(p, k, v)
#define _mm512_cvtepi32_epi16(v) ::frt::kern::simde_gaps::cvtepi32_epi16(v)
#define _mm512_cmpgt_epu32_mask(a, b) ::frt::kern::simde_gaps::cmpgt_epu32_mask(a, b)
