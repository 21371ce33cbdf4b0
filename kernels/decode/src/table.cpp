// flashrt/decode: the primitives of a whole decode step (RMSNorm, rotary, attention over a static
// KV window and over a serving engine's pool of slots, dense projections over the host's own
// fp32/bf16 weights, and the gated activation).
#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/op_table.h>

#include "decode_ops.h"

namespace {

using frt::kern::primitive_op;

constexpr frt_op kOps[] = {
    primitive_op<frt_rmsnorm_args, frt::kern::rmsnorm_run>(FRT_OP_RMSNORM),
    primitive_op<frt_rotary_args, frt::kern::rotary_run>(FRT_OP_ROTARY),
    primitive_op<frt_attention_args, frt::kern::attention_run>(FRT_OP_ATTENTION),
    primitive_op<frt_capped_attention_args, frt::kern::capped_attention_run>(
        FRT_OP_CAPPED_ATTENTION),
    primitive_op<frt_paged_attention_args, frt::kern::paged_attention_run>(FRT_OP_PAGED_ATTENTION),
    primitive_op<frt_cache_attention_args, frt::kern::cache_attention_run>(FRT_OP_CACHE_ATTENTION),
    primitive_op<frt_dense_args, frt::kern::dense_run>(FRT_OP_DENSE),
    primitive_op<frt_gated_act_args, frt::kern::gated_act_run>(FRT_OP_GATED_ACT),
};

int32_t supports_op(const frt_op_desc* d, frt_error* err) {
  if (d != nullptr) {
    switch (d->op) {
      case FRT_OP_RMSNORM:
      case FRT_OP_ROTARY:
      case FRT_OP_ATTENTION:
      case FRT_OP_CAPPED_ATTENTION:
      case FRT_OP_PAGED_ATTENTION:
      case FRT_OP_CACHE_ATTENTION:
      case FRT_OP_GATED_ACT:
        return frt::kern::ok(err);
      case FRT_OP_DENSE:
        if (d->rows_max < 1 || d->rows_max > FRT_MAX_ROWS)
          return frt::kern::fail(err, FRT_REASON_ROWS_OUT_OF_BAND, "dense: rows %lld outside 1..%d",
                                 static_cast<long long>(d->rows_max), FRT_MAX_ROWS);
        return frt::kern::ok(err);
      default:
        break;
    }
  }
  return frt::kern::not_provided(d, "flashrt/decode", err);
}

}  // namespace

extern "C" constinit const frt_kernel_table frt_kpkg_table =
    frt::kern::package_table("flashrt/decode", supports_op, kOps);
