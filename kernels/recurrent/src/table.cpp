// flashrt/recurrent: the recurrences of linear-attention layers: the gated delta rule and the
// depthwise causal convolution before it, the state kept by the caller.
#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/op_table.h>

#include "recurrent_ops.h"

namespace {

using frt::kern::kMaxKeyDim;
using frt::kern::kMaxTaps;

// A primitive_op whose per-call supports() is the op's own check: primitive_op's asks only for
// arguments, and these ops refuse forms a call can bring (dtypes, head grouping, widths).
template <typename Args, auto Supports, auto Run>
constexpr frt_op checked_primitive(int32_t kind) {
  frt_op op = frt::kern::primitive_op<Args, Run>(kind);
  op.supports = [](const void* a, frt_error* err) -> int32_t {
    return Supports(static_cast<const Args*>(a), err);
  };
  return op;
}

constexpr frt_op kOps[] = {
    checked_primitive<frt_gated_delta_args, frt::kern::gated_delta_supports,
                      frt::kern::gated_delta_run>(FRT_OP_GATED_DELTA),
    checked_primitive<frt_causal_conv1d_args, frt::kern::causal_conv1d_supports,
                      frt::kern::causal_conv1d_run>(FRT_OP_CAUSAL_CONV1D),
};

bool activation_dtype(int32_t dt) { return dt == FRT_F32 || dt == FRT_BF16; }

int32_t supports_op(const frt_op_desc* d, frt_error* err) {
  using frt::kern::fail;
  if (d != nullptr && d->op == FRT_OP_GATED_DELTA) {
    if (!activation_dtype(d->x_dtype))
      return fail(err, FRT_REASON_DTYPE, "gated delta: activations in %s; supported: f32, bf16",
                  frt::kern::dtype_name(d->x_dtype));
    if (d->k < 1 || d->k > kMaxKeyDim || d->n < 1)
      return fail(err, FRT_REASON_SHAPE,
                  "gated delta: k_dim %lld, v_dim %lld; supported: k_dim 1..%lld, v_dim >= 1",
                  static_cast<long long>(d->k), static_cast<long long>(d->n),
                  static_cast<long long>(kMaxKeyDim));
    return frt::kern::ok(err);
  }
  if (d != nullptr && d->op == FRT_OP_CAUSAL_CONV1D) {
    if (!activation_dtype(d->x_dtype))
      return fail(err, FRT_REASON_DTYPE, "causal conv1d: activations in %s; supported: f32, bf16",
                  frt::kern::dtype_name(d->x_dtype));
    if (d->n < 1 || d->k < 1 || d->k > kMaxTaps)
      return fail(err, FRT_REASON_SHAPE,
                  "causal conv1d: %lld channels, %lld taps; supported: channels >= 1, taps "
                  "1..%lld",
                  static_cast<long long>(d->n), static_cast<long long>(d->k),
                  static_cast<long long>(kMaxTaps));
    if (d->act != FRT_ACT_SILU && d->act != -1)
      return fail(err, FRT_REASON_FORMAT, "causal conv1d: activation %d not in {silu, none (-1)}",
                  d->act);
    return frt::kern::ok(err);
  }
  return frt::kern::not_provided(d, "flashrt/recurrent", err);
}

}  // namespace

extern "C" constinit const frt_kernel_table frt_kpkg_table =
    frt::kern::package_table("flashrt/recurrent", supports_op, kOps);
