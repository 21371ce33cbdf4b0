// Memory for packed weights (and the read probe that is held against them): zeroed, 64-byte
// aligned, carved from chunks in transparent huge pages (Note [Weights in huge pages]).
#pragma once

#include <cstdint>

namespace frt {

// At least `bytes` (>= 1) of zeroed memory; release it with free_weight_memory. Throws
// std::bad_alloc.
void* alloc_weight_memory(int64_t bytes);
// Releases alloc_weight_memory's buffers; nullptr is ignored.
void free_weight_memory(void* p) noexcept;

// A unique_ptr deleter for alloc_weight_memory's buffers.
struct WeightMemoryFree {
  void operator()(void* p) const noexcept { free_weight_memory(p); }
};

// Whether an allocation now comes from the huge-page arena: not with FRT_HUGE_PAGES=0 nor in an
// AddressSanitizer build (the C library's blocks then).
bool weight_memory_in_arena();

struct WeightMemoryStats {
  int64_t chunks = 0, mapped_bytes = 0;  // the arena's chunks and their length
  int64_t pieces = 0, piece_bytes = 0;   // its buffers not yet freed
};
WeightMemoryStats weight_memory_stats();

}  // namespace frt
