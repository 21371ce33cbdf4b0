// Where packed weights lie in memory: how much of the huge-page arena (Note [Weights in huge
// pages] in core/src/quant/weight_memory.cpp) the kernel actually backs with huge pages. A decode
// step streams every weight once, and the same packs in 4 KiB pages stream 1.1-1.4x slower; the
// kernel gives huge pages only while it finds free 2 MiB runs, so a process that packs after its
// memory has fragmented can end up in small pages, which this says.
#pragma once

#include <cstdint>

namespace frt {

struct WeightMemoryPages {
  bool known = false;          // the arena serves allocations and /proc/self/smaps was read
  int64_t arena_bytes = 0;     // the arena's chunks, mapped
  int64_t resident_bytes = 0;  // of them, resident (smaps Rss)
  int64_t huge_bytes = 0;      // of them, in transparent huge pages (smaps AnonHugePages)
};

// Reads /proc/self/smaps (a few ms in a PyTorch process): call it after packing, not per step.
WeightMemoryPages weight_memory_pages();

// Asks the kernel to collapse the arena's resident small pages into huge pages (MADV_COLLAPSE,
// Linux 6.1 and later: synchronous, with its own compaction), chunk by chunk where a chunk's
// resident bytes are not all in huge pages; best effort. Returns the pages after.
WeightMemoryPages settle_weight_memory();

}  // namespace frt
