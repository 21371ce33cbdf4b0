// flashrt/gemm: y = x W^T (+ bias) for many rows, w8a8 (dynamic per-row activations), and the
// ungated feed-forward over the same layout, the routed expert bank over the decode forms, and
// attention over whole sequences.
#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/op_table.h>

#include "gemm_op.h"

namespace {

constexpr frt_op kOps[] = {
    frt::kern::phased_op<frt_linear_args, frt::kern::gemm_supports, frt::kern::gemm_workspace,
                         frt::kern::gemm_run>(FRT_OP_LINEAR, frt::kern::kGemmPhases),
    frt::kern::phased_op<frt_ffn_args, frt::kern::gemm_ffn_supports, frt::kern::gemm_ffn_workspace,
                         frt::kern::gemm_ffn_run>(FRT_OP_FFN, frt::kern::kGemmFfnPhases),
    frt::kern::phased_op<frt_moe_args, frt::kern::gemm_moe_supports, frt::kern::gemm_moe_workspace,
                         frt::kern::gemm_moe_run>(FRT_OP_MOE_FFN, frt::kern::kGemmMoePhases),
    frt::kern::phased_op<frt_sequence_attention_args, frt::kern::seq_attention_supports,
                         frt::kern::seq_attention_workspace, frt::kern::seq_attention_run>(
        FRT_OP_SEQUENCE_ATTENTION, frt::kern::kSeqAttentionPhases),
};

int32_t supports_op(const frt_op_desc* d, frt_error* err) {
  if (d != nullptr && d->op == FRT_OP_LINEAR) return frt::kern::gemm_supports_form(d, err);
  if (d != nullptr && d->op == FRT_OP_FFN) return frt::kern::gemm_ffn_supports_form(d, err);
  if (d != nullptr && d->op == FRT_OP_MOE_FFN) return frt::kern::gemm_moe_supports_form(d, err);
  if (d != nullptr && d->op == FRT_OP_SEQUENCE_ATTENTION)
    return frt::kern::seq_attention_supports_form(d, err);
  return frt::kern::not_provided(d, "flashrt/gemm", err);
}

}  // namespace

extern "C" constinit const frt_kernel_table frt_kpkg_table =
    frt::kern::package_table("flashrt/gemm", supports_op, kOps);
