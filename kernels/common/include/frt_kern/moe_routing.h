// What both bank ops (flashrt/ffn and flashrt/gemm moe_ffn) share: the per-call checks of a
// call's operands and routing, the routing order (a call's m * top_k slots ordered by
// (expert, row, j), grouped by expert; Note [MoE slots] in kernels/ffn/src/moe_op.cpp), and the
// weighted sum of the slots' outputs. Each thread computes the order itself: deterministic, no
// shared write.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/rows.h>
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace frt::kern {

constexpr int64_t kMaxSlots = int64_t{FRT_MAX_ROWS} * FRT_MAX_TOP_K;
constexpr int kSlotBits = 9;  // a slot's place r * top_k + j fits the low bits of a sort key
static_assert(kMaxSlots <= (int64_t{1} << kSlotBits));

// The activations a bank's gated experts take: act(gate x) * up x.
inline bool moe_gated_act(int32_t act) { return act == FRT_ACT_SILU || act == FRT_ACT_GELU_TANH; }

// What both bank ops ask of a form before their weights' own checks: a gated activation, no
// biases, a bank of one expert or more and k within 1..FRT_MAX_TOP_K. `op` names the op.
inline int32_t check_moe_form(const frt_op_desc* d, const char* op, frt_error* err) {
  if (d == nullptr) return fail(err, FRT_REASON_FORMAT, "%s: no form", op);
  if (!moe_gated_act(d->act))
    return fail(err, FRT_REASON_FORMAT, "%s: activation %d not in {silu, gelu_tanh}", op, d->act);
  if (d->has_bias) return fail(err, FRT_REASON_FORMAT, "%s: takes no biases", op);
  if (d->experts < 1)
    return fail(err, FRT_REASON_SHAPE, "%s: a bank of %lld experts; needs at least 1", op,
                static_cast<long long>(d->experts));
  if (d->top_k < 1 || d->top_k > FRT_MAX_TOP_K)
    return fail(err, FRT_REASON_SHAPE, "%s: top_k %d outside 1..%d", op, d->top_k, FRT_MAX_TOP_K);
  return ok(err);
}

// The same of a call, and its rows and expert arrays, before the weights' checks.
inline int32_t check_moe_bank(const frt_moe_args* a, const char* op, frt_error* err) {
  if (a == nullptr) return fail(err, FRT_REASON_FORMAT, "%s: no arguments", op);
  if (!moe_gated_act(a->act))
    return fail(err, FRT_REASON_FORMAT, "%s: activation %d not in {silu, gelu_tanh}", op, a->act);
  if (a->experts < 1)
    return fail(err, FRT_REASON_SHAPE, "%s: a bank of %lld experts; needs at least 1", op,
                static_cast<long long>(a->experts));
  if (a->top_k < 1 || a->top_k > FRT_MAX_TOP_K)
    return fail(err, FRT_REASON_SHAPE, "%s: top_k %d outside 1..%d", op, a->top_k, FRT_MAX_TOP_K);
  if (int32_t r = check_rows(a->m, a->x_dtype, a->y_dtype, err); r != FRT_REASON_OK) return r;
  if (a->gate == nullptr || a->up == nullptr || a->down == nullptr)
    return fail(err, FRT_REASON_FORMAT, "%s: no %s bank (expert arrays gate, up, down)", op,
                a->gate == nullptr ? "gate"
                : a->up == nullptr ? "up"
                                   : "down");
  return ok(err);
}

// The call's operands for a bank of width k in and n out: x, y and the routing present, row
// strides that hold the widths, every index inside the bank and every weight finite. `op` names
// the op in messages ("moe", "gemm moe").
inline int32_t check_moe_call(const frt_moe_args* a, int64_t k, int64_t n, const char* op,
                              frt_error* err) {
  if (a->x == nullptr || a->y == nullptr)
    return fail(err, FRT_REASON_LAYOUT, "%s: missing input or output", op);
  if (a->index == nullptr || a->weight == nullptr)
    return fail(err, FRT_REASON_LAYOUT, "%s: missing routing (%s is NULL)", op,
                a->index == nullptr ? "index" : "weight");
  if (a->ldx < k || a->ldy < n)
    return fail(err, FRT_REASON_LAYOUT,
                "%s: row strides ldx=%lld, ldy=%lld below widths %lld, %lld", op,
                static_cast<long long>(a->ldx), static_cast<long long>(a->ldy),
                static_cast<long long>(k), static_cast<long long>(n));
  for (int64_t r = 0; r < a->m; ++r)
    for (int32_t j = 0; j < a->top_k; ++j) {
      const int64_t e = a->index[r * a->top_k + j];
      if (e < 0 || e >= a->experts)
        return fail(err, FRT_REASON_LAYOUT,
                    "%s: index[%lld][%d] = %lld outside the bank's %lld experts", op,
                    static_cast<long long>(r), j, static_cast<long long>(e),
                    static_cast<long long>(a->experts));
      const float w = a->weight[r * a->top_k + j];
      if (!std::isfinite(w))
        return fail(err, FRT_REASON_LAYOUT, "%s: weight[%lld][%d] = %g is not finite", op,
                    static_cast<long long>(r), j, static_cast<double>(w));
    }
  return ok(err);
}

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

// Row stride of a slot's unweighted output (`part` below): the bank's width n in whole panels.
inline int64_t part_stride(const frt_moe_args* a) {
  return div_up(a->down[0].n, FRT_PANEL) * FRT_PANEL;
}

// Panel p of every row's output: acc[row][0..FRT_PANEL) = the sum over the row's slots, in slot
// ((expert, row, j)) order, of weight * part[slot][p * FRT_PANEL ..], where part holds each
// slot's unweighted expert output at row stride ldp. A row's first term is stored, not added to
// a zero, so a row routed to one expert with weight 1 is exactly that expert's output.
inline void weighted_sums(const Routing& rt, const float* weight, const float* part, int64_t ldp,
                          int64_t p, float* acc) {
  bool started[FRT_MAX_ROWS] = {};
  for (int64_t s = 0; s < rt.slots; ++s) {
    const int64_t row = rt.row[s];
    const float w = weight[rt.place[s]];
    const float* t = part + s * ldp + p * FRT_PANEL;
    float* out = acc + row * FRT_PANEL;
    if (started[row]) {
      for (int j = 0; j < FRT_PANEL; ++j) out[j] += w * t[j];
    } else {
      for (int j = 0; j < FRT_PANEL; ++j) out[j] = w * t[j];
      started[row] = true;
    }
  }
}

}  // namespace frt::kern
