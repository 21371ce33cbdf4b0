#include "quant/weight_memory.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace frt {

// Note [Weights in huge pages]
// A decode step streams every weight once, hundreds of MiB of it. In 4 KiB pages that is a TLB
// miss per 4 KiB, and under a hypervisor each miss walks two page tables; the hardware
// prefetchers also stop at every 4 KiB boundary. Buffers of 2 MiB or more are therefore 2 MiB
// aligned and advised MADV_HUGEPAGE before they are first touched, so the kernel backs them with
// transparent huge pages where the system allows it (THP "madvise" or "always"); elsewhere the
// advice fails and the buffer stays in small pages, which is still correct. FRT_HUGE_PAGES=0
// turns the advice off (read at every allocation, so bench/kernels.py can pair the two).
constexpr int64_t kHugePage = int64_t{1} << 21;

bool huge_pages_wanted() {
  const char* env = std::getenv("FRT_HUGE_PAGES");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

int64_t weight_memory_alignment(int64_t bytes) {
  return bytes >= kHugePage && huge_pages_wanted() ? kHugePage : 64;
}

void* alloc_weight_memory(int64_t bytes) {
  // Only the alignment grows for huge pages, not the size: rounding every buffer up to whole
  // 2 MiB pages would cost a 2 MiB projection (plus a GEMM pack's slack) 4 MiB resident. The
  // kernel puts a huge page wherever a whole aligned 2 MiB lies in the advised range; the tail
  // stays in small pages.
  const int64_t size = (std::max<int64_t>(bytes, 1) + 63) / 64 * 64;
  const int64_t align = weight_memory_alignment(size);
  void* p = nullptr;
  if (posix_memalign(&p, static_cast<size_t>(align), static_cast<size_t>(size)) != 0)
    throw std::bad_alloc();
  if (align == kHugePage) (void)madvise(p, static_cast<size_t>(size), MADV_HUGEPAGE);
  std::memset(p, 0, static_cast<size_t>(size));
  return p;
}

}  // namespace frt
