// flashrt/ffn: the fused gated feed-forward down(act(gate(x)) * up(x)) at decode rows.
#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/ops.h>

extern "C" const frt_kernel_table frt_kpkg_table = {
    FRT_KERNEL_ABI_MAJOR,
    FRT_KERNEL_ABI_MINOR,
    static_cast<int32_t>(sizeof(frt_kernel_table)),
    "flashrt/ffn",
    FRT_VARIANT_ISA,
    nullptr,
    nullptr,
    0,
    nullptr,
    frt::kern::ffn_supports,
    frt::kern::ffn_workspace,
    frt::kern::kFfnPhases,
    frt::kern::ffn_run,
};
