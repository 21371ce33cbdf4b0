// How the weight-only panels (kernels/common/src/x86/*/panels_*.cpp) prefetch their weights:
// one distance and one block-loop helper for the AVX2 and the AVX-512 panels.
#pragma once

#include <cstdint>

namespace frt::kern {

// How far ahead of the loads a row prefetches: the panel streams from DRAM, and the hardware
// prefetcher alone left two cores at ~21 GB/s; 2 KiB ahead measured ~27 GB/s (of ~29 read; Zen 3,
// the AVX2 panels).
#ifndef FRT_PREFETCH_BYTES
#define FRT_PREFETCH_BYTES 2048
#endif
inline constexpr int64_t kPrefetchBytes = FRT_PREFETCH_BYTES;

// Note [Block prefetch]: a block of rows spends ~10 cycles of FMAs on each 32 bytes of a panel,
// so it reads the panel at a few GB/s per thread, and a call whose weights came from DRAM ran far
// slower than in cache (int8 g64, 8 x 2048 x 8192 on the AMX Xeon: 1.04 ms in cache, 2.33 ms
// cycling ~400 MB of copies; bench/results/amx/panel_block_prefetch.json). The likely cause, not
// read from counters: the hardware prefetcher does not run ahead of so slow a stream. One L2
// prefetch per 64-byte line, kPrefetchBytes ahead, brings the DRAM call to 1.12 ms (16 rows
// 2.78 -> 2.02 ms); 8 and 32 KiB ahead read about the same (not recorded). `at` is the loop's row
// of the panel, rows of 16 bytes, so the loops start at a multiple of four (a group's first row)
// for one prefetch per line. Forced inline: as a plain inline function GCC 12 emitted no prefetch
// in the int8 block loops (seen in the disassembly), which is also why an earlier L1 prefetch
// every step measured no change (`hot_vs_cold` in panel_blocks_of_eight.json: likely never
// emitted).
[[gnu::always_inline]] inline void prefetch_block(const void* row, int64_t at) {
  if ((at & 3) == 0) __builtin_prefetch(static_cast<const char*>(row) + kPrefetchBytes, 0, 2);
}

}  // namespace frt::kern
