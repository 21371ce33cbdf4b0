#include "quant/weight_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace frt {
namespace {

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

TEST(WeightMemory, SmallBuffersAreZeroedAnd64ByteAligned) {
  for (int64_t bytes : {int64_t{1}, int64_t{63}, int64_t{4096}, (int64_t{1} << 21) - 1}) {
    void* p = alloc_weight_memory(bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u) << bytes;
    EXPECT_TRUE(all_zero(p, bytes)) << bytes;
    std::free(p);
  }
  void* p = alloc_weight_memory(0);  // an empty form still gets a valid pointer
  EXPECT_NE(p, nullptr);
  std::free(p);
}

// A recycled block comes back zeroed: dirty one, free it, and take the same size again (the
// allocator usually hands the block back; under ASan fresh blocks are filled with garbage).
TEST(WeightMemory, RecycledBuffersComeBackZeroed) {
  for (int round = 0; round < 4; ++round) {
    auto* dirty = static_cast<unsigned char*>(alloc_weight_memory(4096));
    std::memset(dirty, 0xab, 4096);
    std::free(dirty);
    void* p = alloc_weight_memory(4096);
    EXPECT_TRUE(all_zero(p, 4096));
    std::free(p);
  }
}

TEST(WeightMemory, LargeBuffersStartOnAHugePageAndAreZeroed) {
  HugePagesEnv env("1");
  const int64_t bytes = (int64_t{1} << 21) * 3 + 100;
  void* p = alloc_weight_memory(bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (uintptr_t{1} << 21), 0u);
  EXPECT_TRUE(all_zero(p, bytes));
  std::free(p);
}

TEST(WeightMemory, HugePagesFromTwoMiBUnlessTurnedOff) {
  HugePagesEnv env("1");
  const int64_t huge = int64_t{1} << 21;
  EXPECT_EQ(weight_memory_alignment(huge - 1), 64);
  EXPECT_EQ(weight_memory_alignment(huge), huge);
  env.set("0");
  EXPECT_EQ(weight_memory_alignment(huge * 4), 64);
  void* p = alloc_weight_memory(huge * 2);  // still zeroed and aligned for the kernels
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_TRUE(all_zero(p, huge * 2));
  std::free(p);
  env.set("1");
  EXPECT_EQ(weight_memory_alignment(huge * 4), huge);
}

}  // namespace
}  // namespace frt
