// What flashrt/gemm's AVX2 sources share: eight activation elements as fp32.
#pragma once

#include <immintrin.h>

#include "gemm_tiles.h"

namespace frt::kern {

inline __m256 gemm_load8(const void* x, int32_t dt, int64_t i) {
  if (dt == FRT_F32) return _mm256_loadu_ps(static_cast<const float*>(x) + i);
  const __m128i h =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(x) + i));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

}  // namespace frt::kern
