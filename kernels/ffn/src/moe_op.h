// flashrt/ffn: a routed bank of gated experts at decode rows (FRT_OP_MOE_FFN):
//   y[r] = sum_j weight[r][j] * down_e(act(gate_e(x[r])) * up_e(x[r])),   e = index[r][j].
// Note [MoE slots] in moe_op.cpp describes the phases.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>

namespace frt::kern {

// gather rows per slot; gate/up panels per expert; group sums of h; down panels per expert;
// weighted sums
inline constexpr int32_t kMoePhases = 5;

int32_t moe_supports_form(const frt_op_desc* d, frt_error* err);
int32_t moe_supports(const frt_moe_args* a, frt_error* err);
int64_t moe_workspace(const frt_moe_args* a);
int32_t moe_run(const frt_moe_args* a, int32_t phase, int32_t ith, int32_t nth, frt_error* err);

}  // namespace frt::kern
