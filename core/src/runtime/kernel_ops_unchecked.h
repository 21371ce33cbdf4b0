// The op drivers without their form check, for a caller that has just made it: Seat::run asks
// the seat's refusal() (linear_refusal / ffn_refusal) and then executes, so the seated path checks
// each call's form once. Everyone else calls run_linear / run_ffn (kernel_ops.h), which check.
#pragma once

#include <flashrt/kernel_ops.h>

namespace frt::detail {

// run_linear after linear_refusal(table, w, x, y) returned "" for these very views.
void run_linear_unchecked(const frt_kernel_table& table, Parallel& pool, const PackedLinear& w,
                          const float* bias, const TensorView& x, const TensorView& y,
                          int threads = 0);
// run_ffn after ffn_refusal(table, f, x, y) returned "" for these very views.
void run_ffn_unchecked(const frt_kernel_table& table, Parallel& pool, const FfnOperands& f,
                       const TensorView& x, const TensorView& y, int threads = 0);

// run_moe after moe_refusal(table, bank, x, routing, y) returned "" for these very views.
void run_moe_unchecked(const frt_kernel_table& table, Parallel& pool, const ExpertBank& bank,
                       const TensorView& x, const Routing& routing, const TensorView& y,
                       int threads = 0);

}  // namespace frt::detail
