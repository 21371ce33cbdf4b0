// flashrt/decode: the primitives of a whole decode step (RMSNorm, rotary, attention over a static
// KV window, and dense projections over the host's own fp32/bf16 weights).
#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/ops.h>

// Every member is spelled out: one the package does not provide is null (or 0 phases).
extern "C" const frt_kernel_table frt_kpkg_table = {
    .abi_major = FRT_KERNEL_ABI_MAJOR,
    .abi_minor = FRT_KERNEL_ABI_MINOR,
    .struct_size = static_cast<int32_t>(sizeof(frt_kernel_table)),
    .package = "flashrt/decode",
    .isa = FRT_VARIANT_ISA,
    .linear_supports = nullptr,
    .linear_workspace = nullptr,
    .linear_phases = 0,
    .linear_run = nullptr,
    .ffn_supports = nullptr,
    .ffn_workspace = nullptr,
    .ffn_phases = 0,
    .ffn_run = nullptr,
    .rmsnorm_run = frt::kern::rmsnorm_run,
    .rotary_run = frt::kern::rotary_run,
    .attention_run = frt::kern::attention_run,
    .dense_run = frt::kern::dense_run,
};
