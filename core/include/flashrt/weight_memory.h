// Where packed weights lie in memory: how much of the huge-page arena (Note [Weights in huge
// pages] in core/src/quant/weight_memory.cpp) the kernel actually backs with huge pages. A decode
// step streams every weight once, and the same packs in 4 KiB pages stream 1.1-1.4x slower; the
// kernel gives huge pages only while it finds free 2 MiB runs, so a process that packs after its
// memory has fragmented can end up in small pages, which this says.
#pragma once

#include <cstdint>

namespace frt {

// The figures cover the whole arena: every pack this process holds (and the read probe's
// buffer while it runs), not one handle's.
struct WeightMemoryPages {
  bool known = false;          // false in a sanitizer build (no arena) or where smaps is unreadable
  int64_t arena_bytes = 0;     // the arena's chunks, mapped
  int64_t resident_bytes = 0;  // of them, resident (smaps Rss)
  int64_t huge_bytes = 0;      // of them, in transparent huge pages (smaps AnonHugePages)
};

// Reads /proc/self/smaps, which walks all of the process's page tables (0.07-0.3 s in the
// GB-sized processes measured): call it after packing, not per step. Never throws.
WeightMemoryPages weight_memory_pages();

// Asks the kernel to collapse each chunk's carved part (whole 2 MiB pages up to its last piece)
// into huge pages (MADV_COLLAPSE, Linux 6.1 and later: synchronous, with its own compaction; a
// range already in huge pages returns at once), then reads the pages. Skipped where THP is
// "never" (the collapse would override it) or FRT_HUGE_PAGES=0. A chunk's last, partly carved
// huge page becomes resident whole: at most 2 MiB more per chunk.
WeightMemoryPages settle_weight_memory();

}  // namespace frt
