// flashrt/decode: the primitives of a whole decode step, single-phase, fp32 activations.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>

namespace frt::kern {

int32_t rmsnorm_run(const frt_rmsnorm_args* a, int32_t ith, int32_t nth, frt_error* err);
int32_t rotary_run(const frt_rotary_args* a, int32_t ith, int32_t nth, frt_error* err);
int32_t attention_run(const frt_attention_args* a, int32_t ith, int32_t nth, frt_error* err);
int32_t capped_attention_run(const frt_capped_attention_args* a, int32_t ith, int32_t nth,
                             frt_error* err);
int32_t paged_attention_run(const frt_paged_attention_args* a, int32_t ith, int32_t nth,
                            frt_error* err);
int32_t cache_attention_run(const frt_cache_attention_args* a, int32_t ith, int32_t nth,
                            frt_error* err);
int32_t dense_run(const frt_dense_args* a, int32_t ith, int32_t nth, frt_error* err);
int32_t gated_act_run(const frt_gated_act_args* a, int32_t ith, int32_t nth, frt_error* err);

}  // namespace frt::kern
