// The fused feed-forwards. The intermediate h never leaves the workspace; in the gated form gate
// and up of one panel are computed back to back so the product is formed while both tiles are in
// registers' reach; in the ungated form up's bias and the activation are applied to the tile.
#include "ffn_op.h"

#include <frt_kern/panels.h>
#include <frt_kern/rows.h>
#include <frt_kern/util.h>

#include <cmath>

namespace frt::kern {
namespace {

struct FfnSpace {
  float* x_prep;  // rows of x prepared for gate/up
  float* h;       // [m][intermediate]
  float* h_prep;  // group sums of h for down
};

FfnSpace carve(const frt_ffn_args* a) {
  auto* base = static_cast<float*>(a->workspace);
  FfnSpace s{};
  s.x_prep = base;
  base += prepared_floats(a->up, a->x_dtype, a->m);
  s.h = base;
  base += align64(a->m * a->up->n * 4) / 4;
  s.h_prep = base;
  return s;
}

bool gated_act(int32_t act) { return act == FRT_ACT_SILU || act == FRT_ACT_GELU_TANH; }
bool ungated_act(int32_t act) {
  return act == FRT_ACT_SILU || act == FRT_ACT_GELU_TANH || act == FRT_ACT_GELU;
}

// What both forms check on a call: formats agree, shapes chain, rows and strides fit.
int32_t check_call(const frt_ffn_args* a, const frt_packed_weight* first, frt_error* err) {
  if (int32_t r = check_weight(a->up, "ffn up", err); r != FRT_REASON_OK) return r;
  if (int32_t r = check_weight(a->down, "ffn down", err); r != FRT_REASON_OK) return r;
  if (first->format != a->up->format || first->format != a->down->format ||
      first->group != a->up->group || first->group != a->down->group ||
      first->scale_dtype != a->up->scale_dtype || first->scale_dtype != a->down->scale_dtype)
    return fail(err, FRT_REASON_FORMAT, "ffn: weights must share one weight format");
  if (first->n != a->up->n || first->k != a->up->k || a->down->k != a->up->n)
    return fail(err, FRT_REASON_SHAPE,
                "ffn: shapes gate/up %lldx%lld, up %lldx%lld, down %lldx%lld do not chain",
                static_cast<long long>(first->n), static_cast<long long>(first->k),
                static_cast<long long>(a->up->n), static_cast<long long>(a->up->k),
                static_cast<long long>(a->down->n), static_cast<long long>(a->down->k));
  if (int32_t r = check_rows(a->m, a->x_dtype, a->y_dtype, err); r != FRT_REASON_OK) return r;
  if (a->x == nullptr || a->y == nullptr)
    return fail(err, FRT_REASON_LAYOUT, "ffn: missing input or output");
  if (a->ldx < a->up->k || a->ldy < a->down->n)
    return fail(err, FRT_REASON_LAYOUT, "ffn: row strides below widths");
  return ok(err);
}

// Plan-time form checks both ops share: up (and gate) [inner x k], down [n x inner].
int32_t check_form(const frt_op_desc* d, frt_error* err) {
  if (int32_t r =
          check_weight_form(d->wformat, d->group, d->scale_dtype, d->inner, d->k, "ffn up", err);
      r != FRT_REASON_OK)
    return r;
  if (int32_t r =
          check_weight_form(d->wformat, d->group, d->scale_dtype, d->n, d->inner, "ffn down", err);
      r != FRT_REASON_OK)
    return r;
  return check_rows(d->rows_max, d->x_dtype, d->y_dtype, err);
}

}  // namespace

int32_t gated_ffn_supports_form(const frt_op_desc* d, frt_error* err) {
  if (!gated_act(d->act))
    return fail(err, FRT_REASON_FORMAT, "gated ffn: activation %d not in {silu, gelu_tanh}",
                d->act);
  if (d->has_bias) return fail(err, FRT_REASON_FORMAT, "gated ffn: takes no biases");
  return check_form(d, err);
}

int32_t ffn_supports_form(const frt_op_desc* d, frt_error* err) {
  if (!ungated_act(d->act))
    return fail(err, FRT_REASON_FORMAT, "ffn: activation %d not in {silu, gelu, gelu_tanh}",
                d->act);
  return check_form(d, err);
}

int32_t gated_ffn_supports(const frt_ffn_args* a, frt_error* err) {
  if (a == nullptr) return fail(err, FRT_REASON_FORMAT, "no arguments");
  if (int32_t r = check_weight(a->gate, "ffn gate", err); r != FRT_REASON_OK) return r;
  if (!gated_act(a->act))
    return fail(err, FRT_REASON_FORMAT, "ffn: activation %d not in {silu, gelu_tanh}", a->act);
  if (a->up_bias != nullptr || a->down_bias != nullptr)
    return fail(err, FRT_REASON_FORMAT, "gated ffn: takes no biases");
  return check_call(a, a->gate, err);
}

int32_t ffn_supports(const frt_ffn_args* a, frt_error* err) {
  if (a == nullptr) return fail(err, FRT_REASON_FORMAT, "no arguments");
  if (a->gate != nullptr) return fail(err, FRT_REASON_FORMAT, "ungated ffn: gate must be NULL");
  if (!ungated_act(a->act))
    return fail(err, FRT_REASON_FORMAT, "ffn: activation %d not in {silu, gelu, gelu_tanh}",
                a->act);
  if (int32_t r = check_weight(a->up, "ffn up", err); r != FRT_REASON_OK) return r;
  return check_call(a, a->up, err);
}

int64_t ffn_workspace(const frt_ffn_args* a) {
  return (prepared_floats(a->up, a->x_dtype, a->m) + align64(a->m * a->up->n * 4) / 4 +
          prepared_floats(a->down, FRT_F32, a->m)) *
         4;
}

int32_t ffn_run(const frt_ffn_args* a, int32_t phase, int32_t ith, int32_t nth, frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  if (a->workspace == nullptr) return fail(err, FRT_E_INVALID, "no workspace");
  const FfnSpace s = carve(a);
  const int64_t m = a->m, inter = a->up->n;
  alignas(64) float gate_tile[FRT_MAX_ROWS * FRT_PANEL];
  alignas(64) float up_tile[FRT_MAX_ROWS * FRT_PANEL];
  switch (phase) {
    case 0:
      prepare_rows(a->up, a->x, a->x_dtype, a->ldx, m, s.x_prep, ith, nth);
      return ok(err);
    case 1: {
      // One prepared view serves gate and up: they share format, group and width.
      const PreparedRows rows = prepared_view(a->up, a->x, a->x_dtype, a->ldx, m, s.x_prep);
      const Range panels = split(div_up(inter, FRT_PANEL), ith, nth);
      for (int64_t p = panels.begin; p < panels.end; ++p) {
        run_panel(a->up, p, rows, m, up_tile);
        const int64_t c0 = p * FRT_PANEL;
        const int64_t width = (inter - c0) < FRT_PANEL ? (inter - c0) : FRT_PANEL;
        if (a->gate != nullptr) {
          run_panel(a->gate, p, rows, m, gate_tile);
          for (int64_t r = 0; r < m; ++r)
            kPanels.activate(a->act, gate_tile + r * FRT_PANEL, nullptr, up_tile + r * FRT_PANEL,
                             s.h + r * inter + c0, width);
        } else {
          const float* bias = a->up_bias != nullptr ? a->up_bias + c0 : nullptr;
          for (int64_t r = 0; r < m; ++r)
            kPanels.activate(a->act, up_tile + r * FRT_PANEL, bias, nullptr, s.h + r * inter + c0,
                             width);
        }
      }
      return ok(err);
    }
    case 2:
      prepare_rows(a->down, s.h, FRT_F32, inter, m, s.h_prep, ith, nth);
      return ok(err);
    case 3: {
      const PreparedRows rows = prepared_view(a->down, s.h, FRT_F32, inter, m, s.h_prep);
      const Range panels = split(div_up(a->down->n, FRT_PANEL), ith, nth);
      for (int64_t p = panels.begin; p < panels.end; ++p) {
        run_panel(a->down, p, rows, m, gate_tile);
        store_tile(gate_tile, m, p, a->down->n, a->down_bias, a->y, a->y_dtype, a->ldy);
      }
      return ok(err);
    }
    default:
      return fail(err, FRT_E_INVALID, "ffn has no phase %d", phase);
  }
}

}  // namespace frt::kern
