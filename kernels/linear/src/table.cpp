// flashrt/linear: y = x W^T (+ bias) at decode rows, weight-only int8 and int4.
#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/op_table.h>

#include "linear_op.h"

namespace {

constexpr frt_op kOps[] = {
    frt::kern::phased_op<frt_linear_args, frt::kern::linear_supports, frt::kern::linear_workspace,
                         frt::kern::linear_run>(FRT_OP_LINEAR, frt::kern::kLinearPhases),
};

int32_t supports_op(const frt_op_desc* d, frt_error* err) {
  if (d != nullptr && d->op == FRT_OP_LINEAR) return frt::kern::linear_supports_form(d, err);
  return frt::kern::not_provided(d, "flashrt/linear", err);
}

}  // namespace

extern "C" constinit const frt_kernel_table frt_kpkg_table =
    frt::kern::package_table("flashrt/linear", supports_op, kOps);
