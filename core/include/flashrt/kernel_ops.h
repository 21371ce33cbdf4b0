// Running a kernel package's ops on tensor views: checks the form, carves the workspace, drives
// the op's phases on the thread pool. Refusals name the form and the shape.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/pack.h>
#include <flashrt/tensor.h>
#include <flashrt/thread_pool.h>

#include <string>

namespace frt {

enum class Activation { silu, gelu_tanh };

// "" when the table's linear op takes this call, else the reason.
std::string linear_refusal(const frt_kernel_table& table, const PackedLinear& w,
                           const TensorView& x, const TensorView& y);
// y = x W^T (+ bias). bias is fp32 [n] or nullptr. Throws Refused with linear_refusal()'s reason.
void run_linear(const frt_kernel_table& table, Parallel& pool, const PackedLinear& w,
                const float* bias, const TensorView& x, const TensorView& y, int threads = 0);

std::string ffn_refusal(const frt_kernel_table& table, const PackedLinear& gate,
                        const PackedLinear& up, const PackedLinear& down, Activation act,
                        const TensorView& x, const TensorView& y);
// y = down(act(gate(x)) * up(x)).
void run_ffn(const frt_kernel_table& table, Parallel& pool, const PackedLinear& gate,
             const PackedLinear& up, const PackedLinear& down, Activation act, const TensorView& x,
             const TensorView& y, int threads = 0);

// Streams `bytes` of memory on `threads` threads `repeats` times and returns the best read rate
// in GB/s (1e9 bytes/s): the floor every decode kernel is measured against.
double measure_read_bandwidth(int64_t bytes, int threads, int repeats);

}  // namespace frt
