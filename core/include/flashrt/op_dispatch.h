// Which kernel package runs a direct op call (the door's ops.linear / ops.ffn on weights it
// packed itself): chosen by what each package on the kernel path says it runs, never by name.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/pack.h>

namespace frt {

// The first package on the path, in name order, that owns the op and whose supports_op takes a
// one-row fp32 descriptor of these weights (layout, group, scale dtype, widths, bias). Throws
// KernelUnavailable with every package's answer when none does. The hub remembers each answer
// per descriptor, so a call in a loop does not walk the path again.
const frt_kernel_table& linear_table(KernelHub& hub, const PackedLinear& w, bool has_bias);
const frt_kernel_table& ffn_table(KernelHub& hub, const FfnOperands& f);
// The first package that runs sequence_attention over heads of head_dim in dtype.
const frt_kernel_table& sequence_attention_table(KernelHub& hub, DType dtype, int64_t head_dim);

}  // namespace frt
