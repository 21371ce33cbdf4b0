// flashrt/ffn: the fused feed-forwards at decode rows: the gated one (SwiGLU / GeGLU) and the
// ungated one with biases (GELU MLPs), and the routed bank of gated experts (MoE).
#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/op_table.h>

#include "ffn_op.h"
#include "moe_op.h"

namespace {

using frt::kern::ffn_run;
using frt::kern::ffn_workspace;
using frt::kern::phased_op;

constexpr frt_op kOps[] = {
    phased_op<frt_ffn_args, frt::kern::gated_ffn_supports, ffn_workspace, ffn_run>(
        FRT_OP_GATED_FFN, frt::kern::kFfnPhases),
    phased_op<frt_ffn_args, frt::kern::ffn_supports, ffn_workspace, ffn_run>(FRT_OP_FFN,
                                                                             frt::kern::kFfnPhases),
    phased_op<frt_moe_args, frt::kern::moe_supports, frt::kern::moe_workspace, frt::kern::moe_run>(
        FRT_OP_MOE_FFN, frt::kern::kMoePhases),
};

int32_t supports_op(const frt_op_desc* d, frt_error* err) {
  if (d != nullptr && d->op == FRT_OP_GATED_FFN) return frt::kern::gated_ffn_supports_form(d, err);
  if (d != nullptr && d->op == FRT_OP_FFN) return frt::kern::ffn_supports_form(d, err);
  if (d != nullptr && d->op == FRT_OP_MOE_FFN) return frt::kern::moe_supports_form(d, err);
  return frt::kern::not_provided(d, "flashrt/ffn", err);
}

}  // namespace

extern "C" constinit const frt_kernel_table frt_kpkg_table =
    frt::kern::package_table("flashrt/ffn", supports_op, kOps);
