// flashrt/ffn: the fused gated feed-forward down(act(gate(x)) * up(x)) at decode rows.
#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/ops.h>

// Every member is spelled out: one the package does not provide is null (or 0 phases).
extern "C" const frt_kernel_table frt_kpkg_table = {
    .abi_major = FRT_KERNEL_ABI_MAJOR,
    .abi_minor = FRT_KERNEL_ABI_MINOR,
    .struct_size = static_cast<int32_t>(sizeof(frt_kernel_table)),
    .package = "flashrt/ffn",
    .isa = FRT_VARIANT_ISA,
    .linear_supports = nullptr,
    .linear_workspace = nullptr,
    .linear_phases = 0,
    .linear_run = nullptr,
    .ffn_supports = frt::kern::ffn_supports,
    .ffn_workspace = frt::kern::ffn_workspace,
    .ffn_phases = frt::kern::kFfnPhases,
    .ffn_run = frt::kern::ffn_run,
    .rmsnorm_run = nullptr,
    .rotary_run = nullptr,
    .attention_run = nullptr,
    .dense_run = nullptr,
};
