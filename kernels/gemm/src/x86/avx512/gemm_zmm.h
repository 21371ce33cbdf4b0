// What flashrt/gemm's zmm sources share (the avx512vnni variant, and its test-only emulation
// through SIMDe, frt_kern/zmm.h): masked sixteen-lane loads and byte stores.
#pragma once

#include <frt_kern/zmm.h>

#include <bit>

#include "gemm_tiles.h"

namespace frt::kern {

// The first n lanes of sixteen (all for n >= 16).
inline __mmask16 gemm_lanes(int64_t n) {
  return n >= 16 ? __mmask16{0xffff} : static_cast<__mmask16>((1u << n) - 1u);
}

// Elements i .. i + min(n, 16) of x as fp32; the loads touch only those, other lanes are 0.
inline __m512 gemm_load16(const void* x, int32_t dt, int64_t i, int64_t n) {
  const __mmask16 m = gemm_lanes(n);
  if (dt == FRT_F32) return _mm512_maskz_loadu_ps(m, static_cast<const float*>(x) + i);
  const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(x) + i);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Sixteen int32 already within int8 range as bytes, the first min(n, 16) stored.
inline void gemm_store16_bytes(void* p, __m512i v, int64_t n) {
  _mm_mask_storeu_epi8(p, gemm_lanes(n), _mm512_cvtsepi32_epi8(v));
}

#if defined(FRT_ZMM_BF16)
// vcvtneps2bf16 (AVX512-BF16); in the emulated build (FRT_ZMM_SIMDE) by the SDM's
// convert_fp32_to_bfloat16: a zero or denormal to a zero of its sign, infinity truncated, a NaN
// truncated and made quiet, a normal number rounded to nearest even (ties to even by adding
// 0x7fff plus the kept part's last bit).
inline __m256i gemm_cvtneps_bf16(__m512 f) {
#if defined(FRT_ZMM_SIMDE)
  alignas(64) uint32_t in[16];
  alignas(32) uint16_t out[16];
  _mm512_store_si512(in, _mm512_castps_si512(f));
  for (int i = 0; i < 16; ++i) {
    const uint32_t x = in[i], magnitude = x & 0x7fffffffu;
    if ((x & 0x7f800000u) == 0)
      out[i] = static_cast<uint16_t>((x >> 16) & 0x8000u);
    else if (magnitude > 0x7f800000u)
      out[i] = static_cast<uint16_t>((x >> 16) | 0x40u);
    else if (magnitude == 0x7f800000u)
      out[i] = static_cast<uint16_t>(x >> 16);
    else
      out[i] = static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
  }
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(out));
#else
  return std::bit_cast<__m256i>(_mm512_cvtneps_pbh(f));
#endif
}
#endif

// Sixteen fp32 as bf16 by f32_to_bf16's rounding (nearest even; a NaN keeps its sign and top bits,
// made quiet). With AVX512-BF16 (the amx variant, FRT_ZMM_BF16) one vcvtneps2bf16 rounds every
// lane the same way except a denormal one, which it flushes to zero; a vector holding one (rare)
// takes the integer path, so the bits are every variant's. The integer path is ten vector
// operations more, a third of the per-row form's finish of sixteen outputs.
inline __m256i gemm_bf16_16(__m512 f) {
  const __m512i bits = _mm512_castps_si512(f);
  const __m512i magnitude = _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff));
#if defined(FRT_ZMM_BF16)
  // Denormal: 1 <= magnitude <= 0x7fffff, as magnitude - 1 (unsigned, zero wraps) < 0x7fffff.
  const __mmask16 denormal = _mm512_cmpgt_epu32_mask(
      _mm512_set1_epi32(0x007fffff), _mm512_sub_epi32(magnitude, _mm512_set1_epi32(1)));
  if (denormal == 0) return gemm_cvtneps_bf16(f);
#endif
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(magnitude, _mm512_set1_epi32(0x7f800000));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}

// Sixteen results of row r, columns c0 .. c0 + cols (cols <= 16), into y in its dtype (bf16 by
// gemm_bf16_16).
inline void gemm_store16_y(__m512 f, int64_t r, int64_t c0, int64_t cols, void* y, int32_t y_dtype,
                           int64_t ldy) {
  const __mmask16 m = gemm_lanes(cols);
  if (y_dtype == FRT_F32) {
    _mm512_mask_storeu_ps(static_cast<float*>(y) + r * ldy + c0, m, f);
    return;
  }
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + r * ldy + c0, m, gemm_bf16_16(f));
}

// The per-row form's epilogue for panel p's sixteen columns (Note [W8A8 rows]): the panel's
// column sums, scales and bias, then row() in finish()'s order: float(acc - z * colsum) *
// (sx * sc) + b. The zmm and AMX tiles share it, so their bits agree.
struct RowsEpilogue {
  __m512i colsum;
  __m512 scale, bias;

  RowsEpilogue(const frt_packed_weight* w, int64_t p, const float* b) {
    alignas(64) float panel_bias[FRT_PANEL];
    gemm_panel_bias(w, p, b, panel_bias);
    const float* cs = static_cast<const float*>(w->mins) + p * FRT_PANEL;  // column sums
    colsum = _mm512_cvtps_epi32(_mm512_loadu_ps(cs));
    scale = _mm512_loadu_ps(static_cast<const float*>(w->scales) + p * FRT_PANEL);
    bias = _mm512_load_ps(panel_bias);
  }
  __m512 row(__m512i acc, int32_t z, float sx) const {
    const __m512i i = _mm512_sub_epi32(acc, _mm512_mullo_epi32(_mm512_set1_epi32(z), colsum));
    return _mm512_add_ps(
        _mm512_mul_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(_mm512_set1_ps(sx), scale)), bias);
  }
};

}  // namespace frt::kern
