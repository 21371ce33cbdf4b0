#include "quant/weight_memory.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>

namespace frt {
namespace {

bool all_zero(const void* p, int64_t bytes) {
  const auto* b = static_cast<const unsigned char*>(p);
  for (int64_t i = 0; i < bytes; ++i)
    if (b[i] != 0) return false;
  return true;
}

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

TEST(WeightMemory, LargeBuffersStartOnAHugePageAndAreZeroed) {
  const int64_t bytes = (int64_t{1} << 21) * 3 + 100;
  void* p = alloc_weight_memory(bytes);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (uintptr_t{1} << 21), 0u);
  EXPECT_TRUE(all_zero(p, bytes));
  std::free(p);
}

TEST(WeightMemory, HugePagesFromTwoMiBUnlessTurnedOff) {
  const int64_t huge = int64_t{1} << 21;
  EXPECT_EQ(weight_memory_alignment(huge - 1), 64);
  EXPECT_EQ(weight_memory_alignment(huge), huge);
  ::setenv("FRT_HUGE_PAGES", "0", 1);
  EXPECT_EQ(weight_memory_alignment(huge * 4), 64);
  void* p = alloc_weight_memory(huge * 2);  // still zeroed and aligned for the kernels
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  EXPECT_TRUE(all_zero(p, huge * 2));
  std::free(p);
  ::setenv("FRT_HUGE_PAGES", "1", 1);
  EXPECT_EQ(weight_memory_alignment(huge * 4), huge);
  ::unsetenv("FRT_HUGE_PAGES");
}

}  // namespace
}  // namespace frt
