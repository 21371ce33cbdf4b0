// Helpers the per-ISA halves of flashrt/gemm share (gemm_kernels.cpp, gemm_blocks.cpp): reading
// an activation element or eight, a panel's bias, and the tile's row-count dispatch. The tiles
// come in three builds: zmm with vpdpbusd where FRT_ZMM is set (the avx512vnni variant), AVX2
// elsewhere the flags allow it, the scalar reference otherwise.
#pragma once

#include <frt_kern/util.h>

#include <type_traits>

#include "gemm_op.h"

#if defined(FRT_ZMM)  // the avx512vnni variant (and its test-only emulation)
#include <frt_kern/zmm.h>
#elif defined(__AVX2__)
#include <immintrin.h>
#endif

namespace frt::kern {

inline float gemm_load_x(const void* x, int32_t dt, int64_t i) {
  return dt == FRT_F32 ? static_cast<const float*>(x)[i]
                       : bf16_to_f32(static_cast<const uint16_t*>(x)[i]);
}

#if defined(__AVX2__)
inline __m256 gemm_load8(const void* x, int32_t dt, int64_t i) {
  if (dt == FRT_F32) return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  const __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

#if defined(FRT_ZMM)
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
#endif

#if defined(FRT_ZMM) || defined(__AVX2__)
// How far ahead of its loads the int4 tiles (zmm and AVX2) prefetch their panel. The panel is
// half the int8 tile's bytes per weight and its scales (and mins) are streams of their own; with
// the hardware prefetchers alone the zmm tile fell behind when the guest streamed twice its usual
// bandwidth, and the AVX2 one on a single thread read 62-81% of the bandwidth against 88-95%
// with it (bench/results/avx2/w4a8_prefetch.json). (The int8 tiles did not gain from it.)
inline constexpr int64_t kGemmPrefetchAhead = 2048;
#endif

// The bias of panel p's columns (zero past n or without a bias).
inline void gemm_panel_bias(const frt_packed_weight* w, int64_t p, const float* bias, float* out) {
  const int64_t c0 = p * FRT_PANEL;
  for (int64_t j = 0; j < FRT_PANEL; ++j)
    out[j] = (bias != nullptr && c0 + j < w->n) ? bias[c0 + j] : 0.0f;
}

// Calls tile(std::integral_constant<int, R>) for R = rows in 1..4: tiles are templates on R.
template <class Tile>
void with_tile_rows(int64_t rows, Tile&& tile) {
  switch (rows) {
    case 4:
      return tile(std::integral_constant<int, 4>{});
    case 3:
      return tile(std::integral_constant<int, 3>{});
    case 2:
      return tile(std::integral_constant<int, 2>{});
    default:
      return tile(std::integral_constant<int, 1>{});
  }
}

}  // namespace frt::kern
