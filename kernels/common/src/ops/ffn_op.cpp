// The fused gated feed-forward: down(act(gate(x)) * up(x)). The intermediate h never leaves the
// workspace; gate and up of one panel are computed back to back so the product is formed while
// both tiles are in registers' reach.
#include <frt_kern/ops.h>
#include <frt_kern/rows.h>
#include <frt_kern/util.h>

#include <cmath>

namespace frt::kern {
namespace {

float activate(int32_t act, float g) {
  if (act == FRT_ACT_SILU) return g / (1.0f + std::exp(-g));
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g)));
}

struct FfnSpace {
  float* x_prep;  // rows of x prepared for gate/up
  float* h;       // [m][intermediate]
  float* h_prep;  // group sums of h for down
};

FfnSpace carve(const frt_ffn_args* a) {
  auto* base = static_cast<float*>(a->workspace);
  FfnSpace s{};
  s.x_prep = base;
  base += prepared_floats(a->gate, a->x_dtype, a->m);
  s.h = base;
  base += align64(a->m * a->gate->n * 4) / 4;
  s.h_prep = base;
  return s;
}

}  // namespace

int32_t ffn_supports(const frt_ffn_args* a, frt_error* err) {
  if (a == nullptr) return fail(err, FRT_REASON_FORMAT, "no arguments");
  if (int32_t r = check_weight(a->gate, "ffn gate", err); r != FRT_REASON_OK) return r;
  if (int32_t r = check_weight(a->up, "ffn up", err); r != FRT_REASON_OK) return r;
  if (int32_t r = check_weight(a->down, "ffn down", err); r != FRT_REASON_OK) return r;
  if (a->gate->format != a->up->format || a->gate->format != a->down->format ||
      a->gate->group != a->up->group || a->gate->group != a->down->group)
    return fail(err, FRT_REASON_FORMAT, "ffn: gate, up and down must share one weight format");
  if (a->gate->n != a->up->n || a->gate->k != a->up->k || a->down->k != a->gate->n)
    return fail(err, FRT_REASON_SHAPE,
                "ffn: shapes gate %lldx%lld, up %lldx%lld, down %lldx%lld do not chain",
                static_cast<long long>(a->gate->n), static_cast<long long>(a->gate->k),
                static_cast<long long>(a->up->n), static_cast<long long>(a->up->k),
                static_cast<long long>(a->down->n), static_cast<long long>(a->down->k));
  if (a->act != FRT_ACT_SILU && a->act != FRT_ACT_GELU_TANH)
    return fail(err, FRT_REASON_FORMAT, "ffn: activation %d not in {silu, gelu_tanh}", a->act);
  if (int32_t r = check_rows(a->m, a->x_dtype, a->y_dtype, err); r != FRT_REASON_OK) return r;
  if (a->x == nullptr || a->y == nullptr)
    return fail(err, FRT_REASON_LAYOUT, "ffn: missing input or output");
  if (a->ldx < a->gate->k || a->ldy < a->down->n)
    return fail(err, FRT_REASON_LAYOUT, "ffn: row strides below widths");
  return ok(err);
}

int64_t ffn_workspace(const frt_ffn_args* a) {
  return (prepared_floats(a->gate, a->x_dtype, a->m) + align64(a->m * a->gate->n * 4) / 4 +
          prepared_floats(a->down, FRT_F32, a->m)) *
         4;
}

int32_t ffn_run(const frt_ffn_args* a, int32_t phase, int32_t ith, int32_t nth, frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  if (a->workspace == nullptr) return fail(err, FRT_E_INVALID, "no workspace");
  const FfnSpace s = carve(a);
  const int64_t m = a->m, inter = a->gate->n;
  alignas(64) float gate_tile[FRT_MAX_ROWS * FRT_PANEL];
  alignas(64) float up_tile[FRT_MAX_ROWS * FRT_PANEL];
  switch (phase) {
    case 0:
      prepare_rows(a->gate, a->x, a->x_dtype, a->ldx, m, s.x_prep, ith, nth);
      return ok(err);
    case 1: {
      const PreparedRows rows = prepared_view(a->gate, a->x, a->x_dtype, a->ldx, m, s.x_prep);
      const Range panels = split(div_up(inter, FRT_PANEL), ith, nth);
      for (int64_t p = panels.begin; p < panels.end; ++p) {
        run_panel(a->gate, p, rows, m, gate_tile);
        run_panel(a->up, p, rows, m, up_tile);
        const int64_t c0 = p * FRT_PANEL;
        const int64_t width = (inter - c0) < FRT_PANEL ? (inter - c0) : FRT_PANEL;
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < width; ++j)
            s.h[r * inter + c0 + j] =
                activate(a->act, gate_tile[r * FRT_PANEL + j]) * up_tile[r * FRT_PANEL + j];
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
        store_tile(gate_tile, m, p, a->down->n, nullptr, a->y, a->y_dtype, a->ldy);
      }
      return ok(err);
    }
    default:
      return fail(err, FRT_E_INVALID, "ffn has no phase %d", phase);
  }
}

}  // namespace frt::kern
