// The routed bank of gated experts (FRT_OP_MOE_FFN), over the panels the gated feed-forward uses.
//
// Note [MoE slots]: a call brings m rows, each routed to top_k experts: m * top_k slots (row, j),
// at most FRT_MAX_ROWS * FRT_MAX_TOP_K = 512. The op orders them by (expert, row, j) and calls the
// slots of one expert its group. Every thread computes that order itself at the start of each
// phase (a sort of at most 512 keys, deterministic), so no phase publishes it and there is no
// extra barrier. Then:
//   phase 0  each slot gathers its row of x into xg[slot] (fp32, contiguous, so a group's rows
//            are one strided block) with its int4 group sums; threads split the slots;
//   phase 1  the work items are (group, panel of FRT_PANEL intermediate columns) over every
//            selected expert, split contiguously; an item runs gate_e's and up_e's panel over
//            the group's rows back to back and writes act(gate) * up into h[slot];
//   phase 2  int4 group sums of h (threads split the slots; nothing to do for int8);
//   phase 3  the work items are (group, panel of n) the same way: an item runs down_e's panel
//            over the group's rows of h into part[slot];
//   phase 4  threads split the panels of n; each row adds weight * part[slot] over its slots in
//            group (ascending expert) order and stores the sum.
// So each selected expert's gate, up and down are read once per call however many rows chose it
// (a group of more than FRT_MAX_ROWS slots re-reads a panel from cache, not memory), a thread
// streams whole experts front to back in phases 1 and 3 (one region each, Note [A bank in one
// region] in core/src/runtime/kernel_ops.cpp; splitting phase 3 by panels of n instead, each
// thread hopping between the k experts every 12 KiB, made a Qwen3-30B-A3B bank's call at 1 and
// 4 rows 11% slower on Zen 4), and each y element sums its terms in (expert, j) order whatever
// the thread split: 1, 2 or 3 threads agree bit for bit.
// A row routed to one expert with weight 1 gets exactly FRT_OP_GATED_FFN's output: the first
// term of a row is stored as weight * part, not added to a zero.
#include "moe_op.h"

#include <frt_kern/moe_routing.h>
#include <frt_kern/panels.h>
#include <frt_kern/rows.h>
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace frt::kern {
namespace {

struct MoeSpace {
  float* xg;    // [slots][k]: each slot's row of x in fp32
  float* xsum;  // [slots][k / group]: int4 group sums of xg; nullptr for int8
  float* h;     // [slots][inner]
  float* hsum;  // [slots][inner / group]: int4 group sums of h; nullptr for int8
  float* part;  // [slots][panels of n * FRT_PANEL]: each slot's expert output, unweighted
};

// Bytes of each region, each 64-byte aligned; the carve and the workspace size both read these.
struct MoeSizes {
  int64_t xg, xsum, h, hsum, part;
};

MoeSizes sizes(const frt_moe_args* a) {
  const frt_packed_weight& g = a->gate[0];
  const int64_t slots = a->m * a->top_k, k = g.k, inner = g.n;
  const bool int4 = sums_groups(g.format) && g.group > 0;
  return {align64(slots * k * 4), int4 ? align64(slots * (k / g.group) * 4) : 0,
          align64(slots * inner * 4), int4 ? align64(slots * (inner / g.group) * 4) : 0,
          align64(slots * part_stride(a) * 4)};
}

MoeSpace carve(const frt_moe_args* a) {
  const MoeSizes z = sizes(a);
  auto* base = static_cast<char*>(a->workspace);
  MoeSpace s{};
  s.xg = reinterpret_cast<float*>(base);
  s.xsum = z.xsum > 0 ? reinterpret_cast<float*>(base + z.xg) : nullptr;
  s.h = reinterpret_cast<float*>(base + z.xg + z.xsum);
  s.hsum = z.hsum > 0 ? reinterpret_cast<float*>(base + z.xg + z.xsum + z.h) : nullptr;
  s.part = reinterpret_cast<float*>(base + z.xg + z.xsum + z.h + z.hsum);
  return s;
}

// "int8 per-channel (f32 scales)", "int4 g32 (f16 scales)": a weight's form for messages.
void form_name(const frt_packed_weight* w, char* out, size_t size) {
  if (w->format == FRT_W_INT8_CHANNEL)
    std::snprintf(out, size, "int8 per-channel (%s scales)", dtype_name(w->scale_dtype));
  else if (w->format == FRT_W_INT8_GROUP || w->format == FRT_W_INT4_GROUP)
    std::snprintf(out, size, "%s g%d (%s scales)", w->format == FRT_W_INT8_GROUP ? "int8" : "int4",
                  w->group, dtype_name(w->scale_dtype));
  else if (w->format == FRT_W_INT4_SUPER || w->format == FRT_W_INT8_SUPER)
    std::snprintf(out, size, "%s super-blocks (f16 super scales)",
                  w->format == FRT_W_INT4_SUPER ? "int4 g32" : "int8 g16");
  else
    std::snprintf(out, size, "format %d", w->format);
}

// Expert e's gate, up and down: each a valid pack, in expert 0's gate's form, shapes chaining
// gate/up [inner x k], down [n x inner] with expert 0's.
int32_t check_expert(const frt_moe_args* a, int64_t e, frt_error* err) {
  const frt_packed_weight& g0 = a->gate[0];
  const int64_t inner = g0.n, k = g0.k, n = a->down[0].n;
  struct Part {
    const char* name;
    const frt_packed_weight* w;
    int64_t n, k;
  };
  for (const Part& p : {Part{"gate", a->gate + e, inner, k}, Part{"up", a->up + e, inner, k},
                        Part{"down", a->down + e, n, inner}}) {
    // The name is formatted only for a message: a bank of 128 experts is 384 checks per call.
    char what[64];
    const auto name = [&] {
      std::snprintf(what, sizeof what, "moe %s[%lld]", p.name, static_cast<long long>(e));
      return what;
    };
    if (check_weight(p.w, "moe", nullptr) != FRT_REASON_OK) return check_weight(p.w, name(), err);
    if (p.w->format != g0.format || p.w->group != g0.group || p.w->scale_dtype != g0.scale_dtype) {
      char mine[48], first[48];
      form_name(p.w, mine, sizeof mine);
      form_name(&g0, first, sizeof first);
      return fail(err, FRT_REASON_FORMAT,
                  "%s is %s, gate[0] %s: the bank's weights must share one weight format", name(),
                  mine, first);
    }
    if (p.w->n != p.n || p.w->k != p.k)
      return fail(err, FRT_REASON_SHAPE,
                  "%s is %lldx%lld; the bank's gate and up are %lldx%lld and its down %lldx%lld "
                  "(expert 0's)",
                  name(), static_cast<long long>(p.w->n), static_cast<long long>(p.w->k),
                  static_cast<long long>(inner), static_cast<long long>(k),
                  static_cast<long long>(n), static_cast<long long>(inner));
  }
  return ok(err);
}

}  // namespace

int32_t moe_supports_form(const frt_op_desc* d, frt_error* err) {
  if (int32_t r = check_moe_form(d, "moe", err); r != FRT_REASON_OK) return r;
  if (int32_t r = check_weight_form(d->wformat, d->group, d->scale_dtype, d->inner, d->k,
                                    "moe gate/up", err);
      r != FRT_REASON_OK)
    return r;
  if (int32_t r =
          check_weight_form(d->wformat, d->group, d->scale_dtype, d->n, d->inner, "moe down", err);
      r != FRT_REASON_OK)
    return r;
  return check_rows(d->rows_max, d->x_dtype, d->y_dtype, err);
}

int32_t moe_supports(const frt_moe_args* a, frt_error* err) {
  if (int32_t r = check_moe_bank(a, "moe", err); r != FRT_REASON_OK) return r;
  for (int64_t e = 0; e < a->experts; ++e)
    if (int32_t r = check_expert(a, e, err); r != FRT_REASON_OK) return r;
  const int64_t k = a->gate[0].k, n = a->down[0].n;
  return check_moe_call(a, k, n, "moe", err);
}

int64_t moe_workspace(const frt_moe_args* a) {
  if (a == nullptr || a->gate == nullptr || a->experts < 1 || a->m < 1 || a->top_k < 1) return 0;
  const MoeSizes z = sizes(a);
  return z.xg + z.xsum + z.h + z.hsum + z.part;
}

int32_t moe_run(const frt_moe_args* a, int32_t phase, int32_t ith, int32_t nth, frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  if (a->workspace == nullptr) return fail(err, FRT_E_INVALID, "no workspace");
  if (a->m < 1 || a->m > FRT_MAX_ROWS || a->top_k < 1 || a->top_k > FRT_MAX_TOP_K)
    return fail(err, FRT_E_INVALID, "moe: %lld rows, top_k %d: outside what supports() passes",
                static_cast<long long>(a->m), a->top_k);
  const MoeSpace sp = carve(a);
  const frt_packed_weight& g0 = a->gate[0];
  const int64_t k = g0.k, inner = g0.n, slots = a->m * a->top_k;
  const int64_t group = g0.group;
  if (phase == 2) {  // needs no routing: the slots' h rows are already in place
    if (sp.hsum != nullptr) {
      const Range mine = split(slots, ith, nth);
      for (int64_t s = mine.begin; s < mine.end; ++s)
        group_sums(sp.h + s * inner, inner, group, sp.hsum + s * (inner / group));
    }
    return ok(err);
  }
  Routing rt;
  if (!route(a, rt))
    return fail(err, FRT_E_INVALID, "moe: an index lies outside the bank's %lld experts",
                static_cast<long long>(a->experts));
  alignas(64) float gate_tile[FRT_MAX_ROWS * FRT_PANEL];
  alignas(64) float up_tile[FRT_MAX_ROWS * FRT_PANEL];
  switch (phase) {
    case 0: {
      const Range mine = split(slots, ith, nth);
      for (int64_t s = mine.begin; s < mine.end; ++s) {
        float* dst = sp.xg + s * k;
        const int64_t r = rt.row[s];
        if (a->x_dtype == FRT_BF16) {
          const auto* src = static_cast<const uint16_t*>(a->x) + r * a->ldx;
          for (int64_t i = 0; i < k; ++i) dst[i] = bf16_to_f32(src[i]);
        } else {
          std::memcpy(dst, static_cast<const float*>(a->x) + r * a->ldx, k * sizeof(float));
        }
        if (sp.xsum != nullptr) group_sums(dst, k, group, sp.xsum + s * (k / group));
      }
      return ok(err);
    }
    case 1: {
      const int64_t panels = div_up(inner, FRT_PANEL);
      const Range items = split(rt.groups * panels, ith, nth);
      for (int64_t it = items.begin; it < items.end; ++it) {
        const int64_t g = it / panels, p = it % panels;
        const frt_packed_weight* gate = a->gate + rt.expert[g];
        const frt_packed_weight* up = a->up + rt.expert[g];
        const int64_t c0 = p * FRT_PANEL;
        const int64_t width = (inner - c0) < FRT_PANEL ? (inner - c0) : FRT_PANEL;
        for (int64_t s0 = rt.begin[g]; s0 < rt.begin[g + 1]; s0 += FRT_MAX_ROWS) {
          const int64_t rows = std::min<int64_t>(rt.begin[g + 1] - s0, FRT_MAX_ROWS);
          const PreparedRows xr{sp.xg + s0 * k, k,
                                sp.xsum != nullptr ? sp.xsum + s0 * (k / group) : nullptr};
          run_panel(gate, p, xr, rows, gate_tile);
          run_panel(up, p, xr, rows, up_tile);
          for (int64_t r = 0; r < rows; ++r)
            kPanels.activate(a->act, gate_tile + r * FRT_PANEL, nullptr, up_tile + r * FRT_PANEL,
                             sp.h + (s0 + r) * inner + c0, width);
        }
      }
      return ok(err);
    }
    case 3: {
      const int64_t n_panels = div_up(a->down[0].n, FRT_PANEL), ldp = part_stride(a);
      const Range items = split(rt.groups * n_panels, ith, nth);
      for (int64_t it = items.begin; it < items.end; ++it) {
        const int64_t g = it / n_panels, p = it % n_panels;
        const frt_packed_weight* down = a->down + rt.expert[g];
        for (int64_t s0 = rt.begin[g]; s0 < rt.begin[g + 1]; s0 += FRT_MAX_ROWS) {
          const int64_t rows = std::min<int64_t>(rt.begin[g + 1] - s0, FRT_MAX_ROWS);
          const PreparedRows hr{sp.h + s0 * inner, inner,
                                sp.hsum != nullptr ? sp.hsum + s0 * (inner / group) : nullptr};
          run_panel(down, p, hr, rows, gate_tile);
          for (int64_t r = 0; r < rows; ++r)
            std::memcpy(sp.part + (s0 + r) * ldp + p * FRT_PANEL, gate_tile + r * FRT_PANEL,
                        FRT_PANEL * sizeof(float));
        }
      }
      return ok(err);
    }
    case 4: {
      const int64_t n = a->down[0].n, n_panels = div_up(n, FRT_PANEL), ldp = part_stride(a);
      float* acc = up_tile;  // [m][FRT_PANEL]: the rows' sums over their experts
      const Range panels = split(n_panels, ith, nth);
      for (int64_t p = panels.begin; p < panels.end; ++p) {
        weighted_sums(rt, a->weight, sp.part, ldp, p, acc);
        store_tile(acc, a->m, p, n, nullptr, a->y, a->y_dtype, a->ldy);
      }
      return ok(err);
    }
    default:
      return fail(err, FRT_E_INVALID, "moe has no phase %d", phase);
  }
}

}  // namespace frt::kern
