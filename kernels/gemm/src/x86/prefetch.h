// What the int4 tiles of both x86 paths (x86/avx2/w4a8_blocks_avx2.cpp, x86/avx512/
// w4a8_blocks_zmm.cpp) share: how far ahead they prefetch their panel, and their scales' prefetch.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "gemm_tiles.h"

namespace frt::kern {

// How far ahead of its loads the int4 tiles (zmm and AVX2) prefetch their panel. The panel is
// half the int8 tile's bytes per weight and its scales (and mins) are streams of their own; with
// the hardware prefetchers alone the zmm tile fell behind when the guest streamed twice its usual
// bandwidth, and the AVX2 one on a single thread read 62-81% of the bandwidth against 88-95%
// with it (bench/results/avx2/w4a8_prefetch.json). (The int8 tiles did not gain from it.)
inline constexpr int64_t kGemmPrefetchAhead = 2048;

// The scales (and mins) of block b + 8: streams of their own, read once per block, prefetched at
// the weights' distance (kGemmPrefetchAhead is 8 blocks of panel).
template <bool Mins>
inline void prefetch_block_scales(const uint16_t* sp, const uint16_t* mp, int64_t b) {
  _mm_prefetch(reinterpret_cast<const char*>(sp + (b + 8) * FRT_PANEL), _MM_HINT_T0);
  if constexpr (Mins)
    _mm_prefetch(reinterpret_cast<const char*>(mp + (b + 8) * FRT_PANEL), _MM_HINT_T0);
}

// int4_super_gemm's records (FRT_SUPER4_RECORD bytes per super-block of eight blocks): blocks
// b % 8 = 0..4 of a super-block each prefetch one line of the next one's record, a super-block
// (2048 bytes of panel) ahead, the weights' distance.
inline void prefetch_super_record(const uint8_t* records, int64_t b) {
  static_assert(FRT_SUPER4_RECORD <= 64 * FRT_SUPER4_GROUPS);
  const int64_t line = b % FRT_SUPER4_GROUPS;
  if (line * 64 < FRT_SUPER4_RECORD)
    _mm_prefetch(reinterpret_cast<const char*>(
                     records + (b / FRT_SUPER4_GROUPS + 1) * FRT_SUPER4_RECORD + line * 64),
                 _MM_HINT_T0);
}

}  // namespace frt::kern
