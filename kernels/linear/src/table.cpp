// flashrt/linear: y = x W^T (+ bias) at decode rows, weight-only int8 and int4.
#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/ops.h>

// Every member is spelled out: one the package does not provide is null (or 0 phases).
extern "C" const frt_kernel_table frt_kpkg_table = {
    .abi_major = FRT_KERNEL_ABI_MAJOR,
    .abi_minor = FRT_KERNEL_ABI_MINOR,
    .struct_size = static_cast<int32_t>(sizeof(frt_kernel_table)),
    .package = "flashrt/linear",
    .isa = FRT_VARIANT_ISA,
    .linear_supports = frt::kern::linear_supports,
    .linear_workspace = frt::kern::linear_workspace,
    .linear_phases = frt::kern::kLinearPhases,
    .linear_run = frt::kern::linear_run,
    .ffn_supports = nullptr,
    .ffn_workspace = nullptr,
    .ffn_phases = 0,
    .ffn_run = nullptr,
    .rmsnorm_run = nullptr,
    .rotary_run = nullptr,
    .attention_run = nullptr,
    .dense_run = nullptr,
};
