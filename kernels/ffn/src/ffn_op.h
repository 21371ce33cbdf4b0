// flashrt/ffn: the fused feed-forwards over packed weights at decode rows.
//   gated:   y = down(act(gate(x)) * up(x))                 (FRT_OP_GATED_FFN, bias-free)
//   ungated: y = down(act(up(x) + b_up)) + b_down           (FRT_OP_FFN, gate NULL)
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>

namespace frt::kern {

inline constexpr int32_t kFfnPhases = 4;  // prepare rows; up (and gate) panels; prepare h; down

int32_t gated_ffn_supports_form(const frt_op_desc* d, frt_error* err);
int32_t ffn_supports_form(const frt_op_desc* d, frt_error* err);
int32_t gated_ffn_supports(const frt_ffn_args* a, frt_error* err);
int32_t ffn_supports(const frt_ffn_args* a, frt_error* err);
int64_t ffn_workspace(const frt_ffn_args* a);
// Runs either form: the gated one when a->gate is set.
int32_t ffn_run(const frt_ffn_args* a, int32_t phase, int32_t ith, int32_t nth, frt_error* err);

}  // namespace frt::kern
