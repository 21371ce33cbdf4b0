#include "quant/weight_memory.h"

#include <flashrt/weight_memory.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/utsname.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace frt {
namespace {

// The value of `field` in /proc/self/smaps for the mapping that holds p ("" when absent).
std::string smaps_field(const void* p, const std::string& field) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  bool inside = false;
  std::string line;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind(field, 0) == 0) {
      std::istringstream value(line.substr(field.size()));
      std::string v;
      value >> v;
      return v;
    }
  }
  return "";
}

bool all_zero(const void* p, int64_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (int64_t i = 0; i < bytes; ++i)
    if (b[i] != 0) return false;
  return true;
}

// Sets FRT_HUGE_PAGES for one test and puts back what the environment had.
class HugePagesEnv {
 public:
  explicit HugePagesEnv(const char* value) {
    if (const char* old = std::getenv("FRT_HUGE_PAGES")) saved_ = old;
    had_ = std::getenv("FRT_HUGE_PAGES") != nullptr;
    set(value);
  }
  ~HugePagesEnv() {
    if (had_)
      ::setenv("FRT_HUGE_PAGES", saved_.c_str(), 1);
    else
      ::unsetenv("FRT_HUGE_PAGES");
  }
  void set(const char* value) { ::setenv("FRT_HUGE_PAGES", value, 1); }

 private:
  std::string saved_;
  bool had_ = false;
};

TEST(WeightMemory, BuffersAreZeroedAnd64ByteAligned) {
  for (int64_t bytes : {int64_t{1}, int64_t{63}, int64_t{4096}, (int64_t{1} << 21) - 1,
                        (int64_t{1} << 21) * 3 + 100, int64_t{40} << 20}) {
    void* p = alloc_weight_memory(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    EXPECT_TRUE(all_zero(p, bytes)) << bytes;
    free_weight_memory(p);
  }
  void* p = alloc_weight_memory(0);  // an empty form still gets a valid pointer
  EXPECT_NE(p, nullptr);
  free_weight_memory(p);
  free_weight_memory(nullptr);
}

// A buffer freed after being written is never handed out again dirty: dirty one, free it, and
// take the same size again, with the arena and without it.
TEST(WeightMemory, BuffersAfterAFreedDirtyOneComeZeroed) {
  for (const char* huge : {"1", "0"}) {
    HugePagesEnv env(huge);
    for (int64_t bytes : {int64_t{4096}, int64_t{3} << 20}) {
      for (int round = 0; round < 4; ++round) {
        void* keep = alloc_weight_memory(64);  // the chunk stays mapped across the rounds
        auto* dirty = static_cast<unsigned char*>(alloc_weight_memory(bytes));
        std::memset(dirty, 0xab, static_cast<size_t>(bytes));
        free_weight_memory(dirty);
        void* p = alloc_weight_memory(bytes);
        EXPECT_TRUE(all_zero(p, bytes)) << huge << " " << bytes;
        free_weight_memory(p);
        free_weight_memory(keep);
      }
    }
  }
}

// Buffers taken one after another do not overlap: each keeps what was written to it.
TEST(WeightMemory, BuffersDoNotOverlap) {
  std::vector<std::pair<unsigned char*, int64_t>> taken;
  for (int i = 0; i < 64; ++i) {
    const int64_t bytes = 1 + (i * 7919) % (int64_t{3} << 20);
    auto* p = static_cast<unsigned char*>(alloc_weight_memory(bytes));
    std::memset(p, i + 1, static_cast<size_t>(bytes));
    taken.emplace_back(p, bytes);
  }
  for (size_t i = 0; i < taken.size(); ++i) {
    const auto [p, bytes] = taken[i];
    bool kept = true;
    for (int64_t j = 0; j < bytes; ++j) kept = kept && p[j] == static_cast<unsigned char>(i + 1);
    EXPECT_TRUE(kept) << "buffer " << i << " of " << bytes << " bytes";
  }
  for (const auto& [p, bytes] : taken) free_weight_memory(p);
}

// The door packs from whichever thread calls it: buffers taken and freed on several threads at
// once are each their own, and zeroed.
TEST(WeightMemory, ThreadsTakeAndFreeBuffersAtOnce) {
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t, &wrong] {
      std::vector<std::pair<unsigned char*, int64_t>> held;
      for (int i = 0; i < 200; ++i) {
        const int64_t bytes = 64 + (i * 104729 + t * 7) % (int64_t{3} << 20);
        auto* p = static_cast<unsigned char*>(alloc_weight_memory(bytes));
        if (!all_zero(p, bytes)) ++wrong;
        std::memset(p, t + 1, static_cast<size_t>(bytes));
        held.emplace_back(p, bytes);
        if (i % 3 == 2) {  // free the oldest, keep the rest a while
          const auto [q, n] = held.front();
          for (int64_t j = 0; j < n; ++j)
            if (q[j] != static_cast<unsigned char>(t + 1)) {
              ++wrong;
              break;
            }
          free_weight_memory(q);
          held.erase(held.begin());
        }
      }
      for (const auto& [q, n] : held) free_weight_memory(q);
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0);
}

// The arena hands every chunk back once its last buffer is freed: taking and freeing buffers of
// every size leaves it as it was.
TEST(WeightMemory, FreedBuffersLeaveNothingMapped) {
  HugePagesEnv env("1");
  if (!weight_memory_in_arena()) GTEST_SKIP() << "no arena in an AddressSanitizer build";
  const WeightMemoryStats before = weight_memory_stats();
  std::vector<void*> taken;
  for (int64_t bytes : {int64_t{100}, int64_t{1} << 20, int64_t{40} << 20, int64_t{5000}})
    taken.push_back(alloc_weight_memory(bytes));
  const WeightMemoryStats during = weight_memory_stats();
  EXPECT_EQ(during.pieces, before.pieces + 4);
  EXPECT_GE(during.piece_bytes, before.piece_bytes + (int64_t{41} << 20) + 5100);
  EXPECT_GE(during.mapped_bytes, before.mapped_bytes + (int64_t{40} << 20));
  for (void* p : taken) free_weight_memory(p);
  const WeightMemoryStats after = weight_memory_stats();
  EXPECT_EQ(after.pieces, before.pieces);
  EXPECT_EQ(after.piece_bytes, before.piece_bytes);
  EXPECT_LE(after.chunks, before.chunks);
}

// The property the arena exists for (Note [Weights in huge pages]): a buffer of any size lies in
// memory advised into huge pages, even in a process whose C library heap has grown and been
// reused (where a heap block stays in small pages). The kernel's THPeligible line for the mapping
// says so, whether or not this machine grants THP.
TEST(WeightMemory, EveryBufferLiesInMemoryAdvisedIntoHugePages) {
  HugePagesEnv env("1");
  if (!weight_memory_in_arena()) GTEST_SKIP() << "no arena in an AddressSanitizer build";
  // Under THP "never" the kernel calls nothing eligible, whatever was advised.
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(thp, modes);
  if (modes.find("[always]") == std::string::npos && modes.find("[madvise]") == std::string::npos)
    GTEST_SKIP() << "transparent huge pages are off here: '" << modes << "'";
  // Raise the C library's mmap threshold as torch does: a large block freed.
  std::free(std::malloc(size_t{24} << 20));
  for (int64_t bytes : {int64_t{96} << 10, int64_t{1} << 20, (int64_t{3} << 20) + 100}) {
    void* p = alloc_weight_memory(bytes);
    const std::string eligible = smaps_field(p, "THPeligible:");
    if (eligible.empty()) {
      free_weight_memory(p);
      GTEST_SKIP() << "this kernel's smaps has no THPeligible line";
    }
    EXPECT_EQ(eligible, "1") << bytes << " bytes";
    free_weight_memory(p);
  }
}

// weight_memory_pages() counts the arena's resident bytes from smaps, and settling (asking the
// kernel to collapse small pages into huge ones, which copies them) keeps every byte of a live
// buffer. Whether the kernel grants the huge pages depends on the machine's free memory, so only
// the bounds are asserted on them.
TEST(WeightMemory, PagesCountTheArenaAndSettlingKeepsEveryByte) {
  HugePagesEnv env("1");
  if (!weight_memory_in_arena()) GTEST_SKIP() << "no arena in an AddressSanitizer build";
  const int64_t bytes = int64_t{6} << 20;
  auto* p = static_cast<unsigned char*>(alloc_weight_memory(bytes));
  for (int64_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 7 + 1);
  const WeightMemoryPages pages = weight_memory_pages();
  if (!pages.known) {
    free_weight_memory(p);
    GTEST_SKIP() << "/proc/self/smaps cannot be read here";
  }
  EXPECT_GE(pages.arena_bytes, bytes);
  EXPECT_GE(pages.resident_bytes, bytes);
  EXPECT_LE(pages.resident_bytes, pages.arena_bytes);
  EXPECT_LE(pages.huge_bytes, pages.resident_bytes);
  const WeightMemoryPages settled = settle_weight_memory();
  EXPECT_TRUE(settled.known);
  EXPECT_GE(settled.resident_bytes, bytes);
  EXPECT_LE(settled.huge_bytes, settled.resident_bytes);
  bool same = true;
  for (int64_t i = 0; i < bytes; ++i) same = same && p[i] == static_cast<unsigned char>(i * 7 + 1);
  EXPECT_TRUE(same);
  free_weight_memory(p);
}

// What settling is for: a huge page split into small ones (here by returning one 4 KiB page of it
// and touching it again, as a fragmented kernel leaves a fault it could not serve whole) is
// collapsed back, its bytes kept. Where the machine grants no huge page to begin with or the
// kernel predates MADV_COLLAPSE (Linux 6.1), there is nothing to show and the test says so.
TEST(WeightMemory, SettlingCollapsesASplitHugePageBack) {
  HugePagesEnv env("1");
  if (!weight_memory_in_arena()) GTEST_SKIP() << "no arena in an AddressSanitizer build";
  utsname u{};
  int major = 0, minor = 0;
  if (uname(&u) != 0 || std::sscanf(u.release, "%d.%d", &major, &minor) != 2 ||
      major * 100 + minor < 601)
    GTEST_SKIP() << "MADV_COLLAPSE needs Linux 6.1; this kernel is " << u.release;
  const int64_t bytes = int64_t{6} << 20, huge = int64_t{2} << 20;
  auto* p = static_cast<unsigned char*>(alloc_weight_memory(bytes));
  for (int64_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(i * 13 + 5);
  const WeightMemoryPages before = weight_memory_pages();
  if (!before.known || before.huge_bytes < 2 * huge) {
    free_weight_memory(p);
    GTEST_SKIP() << "no huge pages granted here (" << before.huge_bytes << " bytes)";
  }
  // The first whole 2 MiB page inside the buffer: return one 4 KiB of it, touch it again.
  const auto page = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(huge) - 1) /
      static_cast<uintptr_t>(huge) * static_cast<uintptr_t>(huge));
  ASSERT_EQ(madvise(page + 4096, 4096, MADV_DONTNEED), 0);
  for (int64_t i = 4096; i < 8192; ++i)
    page[i] = static_cast<unsigned char>((page - p + i) * 13 + 5);
  const WeightMemoryPages split = weight_memory_pages();
  if (split.huge_bytes > before.huge_bytes - huge) {
    free_weight_memory(p);
    GTEST_SKIP() << "the kernel kept the page whole";
  }
  const WeightMemoryPages settled = settle_weight_memory();
  EXPECT_GE(settled.huge_bytes, split.huge_bytes + huge);
  bool same = true;
  for (int64_t i = 0; i < bytes; ++i) same = same && p[i] == static_cast<unsigned char>(i * 13 + 5);
  EXPECT_TRUE(same);
  free_weight_memory(p);
}

}  // namespace
}  // namespace frt
