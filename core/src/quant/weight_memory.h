// Memory for packed weights (and the read probe that is held against them): zeroed, 64-byte
// aligned, and in transparent huge pages when the buffer spans one (Note [Weights in huge pages]).
#pragma once

#include <cstdint>

namespace frt {

// At least `bytes` (>= 1) of zeroed memory; release it with std::free. Throws std::bad_alloc.
void* alloc_weight_memory(int64_t bytes);

// The alignment alloc_weight_memory gives `bytes`: 2 MiB (then advised into huge pages) from
// 2 MiB on unless FRT_HUGE_PAGES=0, else 64.
int64_t weight_memory_alignment(int64_t bytes);

}  // namespace frt
