// flashrt/linear: y = x W^T (+ bias) at decode rows, weight-only int8 and int4.
#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/ops.h>

extern "C" const frt_kernel_table frt_kpkg_table = {
    FRT_KERNEL_ABI_MAJOR,
    FRT_KERNEL_ABI_MINOR,
    static_cast<int32_t>(sizeof(frt_kernel_table)),
    "flashrt/linear",
    FRT_VARIANT_ISA,
    frt::kern::linear_supports,
    frt::kern::linear_workspace,
    frt::kern::kLinearPhases,
    frt::kern::linear_run,
    nullptr,
    nullptr,
    0,
    nullptr,
};
