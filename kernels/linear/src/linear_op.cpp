// flashrt/linear's one op: y = x W^T (+ bias) over packed weights at decode rows.
#include "linear_op.h"

#include <frt_kern/rows.h>
#include <frt_kern/util.h>

namespace frt::kern {

int32_t linear_supports(const frt_linear_args* a, frt_error* err) {
  if (a == nullptr) return fail(err, FRT_REASON_FORMAT, "no arguments");
  if (int32_t r = check_weight(a->w, "linear", err); r != FRT_REASON_OK) return r;
  if (int32_t r = check_rows(a->m, a->x_dtype, a->y_dtype, err); r != FRT_REASON_OK) return r;
  if (a->x == nullptr || a->y == nullptr)
    return fail(err, FRT_REASON_LAYOUT, "linear: missing input or output");
  if (a->ldx < a->w->k || a->ldy < a->w->n)
    return fail(err, FRT_REASON_LAYOUT, "linear: row strides %lld/%lld below widths k=%lld n=%lld",
                static_cast<long long>(a->ldx), static_cast<long long>(a->ldy),
                static_cast<long long>(a->w->k), static_cast<long long>(a->w->n));
  return ok(err);
}

int32_t linear_supports_form(const frt_op_desc* d, frt_error* err) {
  if (int32_t r =
          check_weight_form(d->wformat, d->group, d->scale_dtype, d->n, d->k, "linear", err);
      r != FRT_REASON_OK)
    return r;
  return check_rows(d->rows_max, d->x_dtype, d->y_dtype, err);
}

int64_t linear_workspace(const frt_linear_args* a) {
  return prepared_floats(a->w, a->x_dtype, a->m) * 4;
}

int32_t linear_run(const frt_linear_args* a, int32_t phase, int32_t ith, int32_t nth,
                   frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  auto* space = static_cast<float*>(a->workspace);
  if (space == nullptr && linear_workspace(a) > 0) return fail(err, FRT_E_INVALID, "no workspace");
  if (phase == 0) {
    prepare_rows(a->w, a->x, a->x_dtype, a->ldx, a->m, space, ith, nth);
    return ok(err);
  }
  if (phase != 1) return fail(err, FRT_E_INVALID, "linear has no phase %d", phase);
  const PreparedRows rows = prepared_view(a->w, a->x, a->x_dtype, a->ldx, a->m, space);
  alignas(64) float tile[FRT_MAX_ROWS * FRT_PANEL];
  const Range panels = split(div_up(a->w->n, FRT_PANEL), ith, nth);
  for (int64_t p = panels.begin; p < panels.end; ++p) {
    run_panel(a->w, p, rows, a->m, tile);
    store_tile(tile, a->m, p, a->w->n, a->bias, a->y, a->y_dtype, a->ldy);
  }
  return ok(err);
}

}  // namespace frt::kern
