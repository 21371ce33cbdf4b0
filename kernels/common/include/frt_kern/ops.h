// The two ops a package can provide, written once over the panel table; each package's table
// points at the ones it ships.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>

namespace frt::kern {

inline constexpr int32_t kLinearPhases = 2;  // prepare rows; panels
inline constexpr int32_t kFfnPhases = 4;     // prepare rows; gate/up panels; prepare h; down panels

int32_t linear_supports(const frt_linear_args* a, frt_error* err);
int64_t linear_workspace(const frt_linear_args* a);
int32_t linear_run(const frt_linear_args* a, int32_t phase, int32_t ith, int32_t nth,
                   frt_error* err);

int32_t ffn_supports(const frt_ffn_args* a, frt_error* err);
int64_t ffn_workspace(const frt_ffn_args* a);
int32_t ffn_run(const frt_ffn_args* a, int32_t phase, int32_t ith, int32_t nth, frt_error* err);

int32_t rmsnorm_run(const frt_rmsnorm_args* a, int32_t ith, int32_t nth, frt_error* err);
int32_t rotary_run(const frt_rotary_args* a, int32_t ith, int32_t nth, frt_error* err);
int32_t attention_run(const frt_attention_args* a, int32_t ith, int32_t nth, frt_error* err);
int32_t dense_run(const frt_dense_args* a, int32_t ith, int32_t nth, frt_error* err);

}  // namespace frt::kern
