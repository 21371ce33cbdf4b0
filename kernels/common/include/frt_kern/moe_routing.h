// The routing order both bank ops (flashrt/ffn and flashrt/gemm moe_ffn) share: a call's
// m * top_k slots ordered by (expert, row, j), grouped by expert (Note [MoE slots] in
// kernels/ffn/src/moe_op.cpp). Each thread computes it itself: deterministic, no shared write.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <algorithm>
#include <cstdint>

namespace frt::kern {

constexpr int64_t kMaxSlots = int64_t{FRT_MAX_ROWS} * FRT_MAX_TOP_K;
constexpr int kSlotBits = 9;  // a slot's place r * top_k + j fits the low bits of a sort key
static_assert(kMaxSlots <= (int64_t{1} << kSlotBits));

// The slots in (expert, row, j) order and their groups.
struct Routing {
  int64_t slots = 0, groups = 0;
  uint16_t row[kMaxSlots];       // the row of x slot s reads and of y it adds to
  uint16_t place[kMaxSlots];     // r * top_k + j: where slot s is in index and weight
  int64_t expert[kMaxSlots];     // group g's expert
  int32_t begin[kMaxSlots + 1];  // group g is slots [begin[g], begin[g + 1])
};

// False when an index lies outside the bank (supports() refuses those; run() checks for free).
inline bool route(const frt_moe_args* a, Routing& rt) {
  const int64_t slots = a->m * a->top_k;
  uint64_t keys[kMaxSlots];
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t e = a->index[s];
    if (e < 0 || e >= a->experts) return false;
    keys[s] = static_cast<uint64_t>(e) << kSlotBits | static_cast<uint64_t>(s);
  }
  std::sort(keys, keys + slots);
  rt.slots = slots;
  rt.groups = 0;
  for (int64_t s = 0; s < slots; ++s) {
    const auto e = static_cast<int64_t>(keys[s] >> kSlotBits);
    const auto place = static_cast<int64_t>(keys[s] & ((uint64_t{1} << kSlotBits) - 1));
    rt.place[s] = static_cast<uint16_t>(place);
    rt.row[s] = static_cast<uint16_t>(place / a->top_k);
    if (rt.groups == 0 || rt.expert[rt.groups - 1] != e) {
      rt.expert[rt.groups] = e;
      rt.begin[rt.groups] = static_cast<int32_t>(s);
      ++rt.groups;
    }
  }
  rt.begin[rt.groups] = static_cast<int32_t>(slots);
  return true;
}

}  // namespace frt::kern
