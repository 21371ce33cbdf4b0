// flashrt/linear: the linear op over packed int8 / int4 weights.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>

namespace frt::kern {

inline constexpr int32_t kLinearPhases = 2;  // prepare rows; panels

int32_t linear_supports_form(const frt_op_desc* d, frt_error* err);
int32_t linear_supports(const frt_linear_args* a, frt_error* err);
int64_t linear_workspace(const frt_linear_args* a);
int32_t linear_run(const frt_linear_args* a, int32_t phase, int32_t ith, int32_t nth,
                   frt_error* err);

}  // namespace frt::kern
