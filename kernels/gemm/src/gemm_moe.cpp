// flashrt/gemm's routed bank of gated experts (FRT_OP_MOE_FFN) over the integer decode forms:
// FRT_W_INT8_GEMM with activation blocks of 32 (Note [W8A8 blocks]) and FRT_W_INT4_GEMM g32,
// symmetric or with mins (Note [W4A8]).
//
// Note [GEMM MoE]: the slot design of flashrt/ffn's op (Note [MoE slots] in
// kernels/ffn/src/moe_op.cpp) over this package's tiles. A call's m * top_k slots (row, j) are
// ordered by (expert, row, j); the slots of one expert are its group. Every thread computes that
// order itself at the start of each routed phase (a sort of at most 512 keys). Then:
//   phase 0  each slot quantizes its row of x into activation blocks (kGemmTiles.
//            quantize_row_blocks) with the blocks' sums; threads split the slots;
//   phase 1  the work items are (group, panel of FRT_PANEL intermediate columns) over every
//            selected expert, split contiguously; an item runs gate_e's and up_e's tile over the
//            group's slots four at a time and writes act(gate) * up into h[slot] (fp32);
//   phase 2  each slot's h row is quantized into blocks of 32 again, with its sums;
//   phase 3  the work items are (group, panel of n) the same way: an item runs down_e's tile
//            over the group's slots into part[slot] (fp32);
//   phase 4  threads split the panels of n; each row adds weight * part[slot] over its slots in
//            (expert, j) order (weighted_sums, moe_routing.h): its first term stored, not added
//            to 0.
// Each selected expert's gate, up and down are read once per call, a thread streams whole
// experts in phases 1 and 3, and each y element sums its terms in (expert, j) order whatever
// the thread split. The activation is the feed-forward's
// (kGemmTiles.activate, Note [GEMM feed-forward]) times up, one scalar product; with the shared
// tiles and quantizers every variant writes the same bits.
#include <frt_kern/moe_routing.h>
#include <frt_kern/rows.h>
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "gemm_op.h"
#include "gemm_tiles.h"

namespace frt::kern {
namespace {

struct MoeSpace {
  BlockRows xq;  // [slots] x k
  float* h;      // [slots][inner]
  BlockRows hq;  // [slots] x inner
  float* part;   // [slots][panels of n * FRT_PANEL]: each slot's expert output, unweighted
};

int64_t space_bytes(const frt_moe_args* a) {
  const int64_t slots = a->m * a->top_k, k = a->gate[0].k, inner = a->gate[0].n;
  return gemm_block_rows_bytes(slots, k) + align64(slots * inner * 4) +
         gemm_block_rows_bytes(slots, inner) + align64(slots * part_stride(a) * 4);
}

MoeSpace carve(const frt_moe_args* a) {
  const int64_t slots = a->m * a->top_k, k = a->gate[0].k, inner = a->gate[0].n;
  auto* base = static_cast<uint8_t*>(a->workspace);
  MoeSpace s{};
  s.xq = gemm_block_view(base, slots, k);
  base += gemm_block_rows_bytes(slots, k);
  s.h = reinterpret_cast<float*>(base);
  base += align64(slots * inner * 4);
  s.hq = gemm_block_view(base, slots, inner);
  base += gemm_block_rows_bytes(slots, inner);
  s.part = reinterpret_cast<float*>(base);
  return s;
}

// One weight's form at plan time: int8_gemm with activation blocks of 32, or a nibble form
// (gemm_nibble_form: int4_gemm, int4_super_gemm, int6_super_gemm) in its groups.
int32_t check_form(int32_t wformat, int32_t group, int64_t n, int64_t k, int32_t x_dtype,
                   int32_t y_dtype, const char* what, frt_error* err) {
  if (wformat != FRT_W_INT8_GEMM && !gemm_nibble_format(wformat))
    return fail(err, FRT_REASON_FORMAT,
                "gemm moe %s: weight format %d; takes int8_gemm (%d), int4_gemm (%d), "
                "int4_super_gemm (%d), int6_super_gemm (%d), int5_gemm (%d) or int5_super_gemm "
                "(%d)",
                what, wformat, FRT_W_INT8_GEMM, FRT_W_INT4_GEMM, FRT_W_INT4_SUPER_GEMM,
                FRT_W_INT6_SUPER_GEMM, FRT_W_INT5_GEMM, FRT_W_INT5_SUPER_GEMM);
  const NibbleForm f = wformat == FRT_W_INT8_GEMM ? NibbleForm{"int8_gemm", kGemmActBlock, 1}
                                                  : gemm_nibble_form(wformat);
  const char* name = f.name;
  if (group != f.group)
    return fail(err, FRT_REASON_FORMAT,
                "gemm moe %s: %s in groups/activation blocks of %d; takes %d only", what, name,
                group, f.group);
  const int64_t multiple = f.multiple;
  if (k % multiple != 0)
    return fail(err, FRT_REASON_SHAPE, "gemm moe %s: %s width k=%lld not a multiple of %lld", what,
                name, static_cast<long long>(k), static_cast<long long>(multiple));
  if (n <= 0 || k <= 0 || k > kGemmMaxK)
    return fail(err, FRT_REASON_SHAPE, "gemm moe %s: weight %lldx%lld outside 1..%lld wide", what,
                static_cast<long long>(n), static_cast<long long>(k),
                static_cast<long long>(kGemmMaxK));
  if ((x_dtype != FRT_F32 && x_dtype != FRT_BF16) || (y_dtype != FRT_F32 && y_dtype != FRT_BF16))
    return fail(err, FRT_REASON_DTYPE, "gemm moe: activations %s -> %s; supported: f32, bf16",
                dtype_name(x_dtype), dtype_name(y_dtype));
  return ok(err);
}

// Expert e's gate, up and down: complete packs in expert 0's gate's form, shapes chaining
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
    const frt_packed_weight* w = p.w;
    const bool int8 = w->format == FRT_W_INT8_GEMM;
    const bool super = gemm_super4_format(w->format) || w->format == FRT_W_INT6_SUPER_GEMM;
    const bool complete = w->qdata != nullptr && w->scales != nullptr &&
                          (int8 ? w->mins != nullptr : w->scale_dtype == FRT_F16) &&
                          (!super || w->mins == nullptr);
    const bool same = w->format == g0.format && w->group == g0.group &&
                      w->scale_dtype == g0.scale_dtype &&
                      (int8 || (w->mins != nullptr) == (g0.mins != nullptr));
    if (!same || !complete)
      return fail(err, FRT_REASON_FORMAT,
                  "gemm moe %s[%lld]: format %d group %d%s%s; gate[0] is format %d group %d%s: "
                  "the bank's weights must share one complete pack form",
                  p.name, static_cast<long long>(e), w->format, w->group,
                  !int8 && w->mins != nullptr ? " with mins" : "",
                  complete ? "" : " (without data, scales or sums)", g0.format, g0.group,
                  g0.mins != nullptr && g0.format != FRT_W_INT8_GEMM ? " with mins" : "");
    if (w->n != p.n || w->k != p.k)
      return fail(err, FRT_REASON_SHAPE,
                  "gemm moe %s[%lld] is %lldx%lld; the bank's gate and up are %lldx%lld and its "
                  "down %lldx%lld (expert 0's)",
                  p.name, static_cast<long long>(e), static_cast<long long>(w->n),
                  static_cast<long long>(w->k), static_cast<long long>(inner),
                  static_cast<long long>(k), static_cast<long long>(n),
                  static_cast<long long>(inner));
  }
  return ok(err);
}

// Runs w's panel p over the block rows [s0, s0 + rows) of q, rows <= 4.
void tile(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t s0, int64_t rows,
          float* out) {
  gemm_block_tile(w, p, q, s0, rows, nullptr, out);
}

void quantize_slot(const void* x, int32_t x_dtype, int64_t k, const BlockRows& q, int64_t s) {
  gemm_quantize_block_row(x, x_dtype, k, q, s);
}

}  // namespace

int32_t gemm_moe_supports_form(const frt_op_desc* d, frt_error* err) {
  if (int32_t r = check_moe_form(d, "gemm moe", err); r != FRT_REASON_OK) return r;
  if (int32_t r =
          check_form(d->wformat, d->group, d->inner, d->k, d->x_dtype, d->y_dtype, "gate/up", err);
      r != FRT_REASON_OK)
    return r;
  if (int32_t r =
          check_form(d->wformat, d->group, d->n, d->inner, d->x_dtype, d->y_dtype, "down", err);
      r != FRT_REASON_OK)
    return r;
  return check_rows(d->rows_max, d->x_dtype, d->y_dtype, err);
}

int32_t gemm_moe_supports(const frt_moe_args* a, frt_error* err) {
  if (int32_t r = check_moe_bank(a, "gemm moe", err); r != FRT_REASON_OK) return r;
  const frt_packed_weight &g0 = a->gate[0], &d0 = a->down[0];
  if (int32_t r =
          check_form(g0.format, g0.group, g0.n, g0.k, a->x_dtype, a->y_dtype, "gate/up", err);
      r != FRT_REASON_OK)
    return r;
  if (int32_t r = check_form(d0.format, d0.group, d0.n, d0.k, a->x_dtype, a->y_dtype, "down", err);
      r != FRT_REASON_OK)
    return r;
  for (int64_t e = 0; e < a->experts; ++e)
    if (int32_t r = check_expert(a, e, err); r != FRT_REASON_OK) return r;
  const int64_t k = g0.k, n = d0.n;
  return check_moe_call(a, k, n, "gemm moe", err);
}

int64_t gemm_moe_workspace(const frt_moe_args* a) {
  if (a == nullptr || a->gate == nullptr || a->experts < 1 || a->m < 1 || a->top_k < 1) return 0;
  return space_bytes(a);
}

int32_t gemm_moe_run(const frt_moe_args* a, int32_t phase, int32_t ith, int32_t nth,
                     frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  if (a->workspace == nullptr) return fail(err, FRT_E_INVALID, "no workspace");
  if (a->m < 1 || a->m > FRT_MAX_ROWS || a->top_k < 1 || a->top_k > FRT_MAX_TOP_K)
    return fail(err, FRT_E_INVALID, "gemm moe: %lld rows, top_k %d: outside what supports() passes",
                static_cast<long long>(a->m), a->top_k);
  const MoeSpace sp = carve(a);
  const frt_packed_weight& g0 = a->gate[0];
  const int64_t k = g0.k, inner = g0.n, slots = a->m * a->top_k;
  if (phase == 2) {  // needs no routing: the slots' h rows are already in place
    const Range mine = split(slots, ith, nth);
    for (int64_t s = mine.begin; s < mine.end; ++s)
      quantize_slot(sp.h + s * inner, FRT_F32, inner, sp.hq, s);
    return ok(err);
  }
  if (phase < 0 || phase > 4) return fail(err, FRT_E_INVALID, "gemm moe has no phase %d", phase);
  Routing rt;
  if (!route(a, rt))
    return fail(err, FRT_E_INVALID, "gemm moe: an index lies outside the bank's %lld experts",
                static_cast<long long>(a->experts));
  if (phase == 0) {
    const int64_t xsize = a->x_dtype == FRT_F32 ? 4 : 2;
    const Range mine = split(slots, ith, nth);
    for (int64_t s = mine.begin; s < mine.end; ++s)
      quantize_slot(static_cast<const char*>(a->x) + rt.row[s] * a->ldx * xsize, a->x_dtype, k,
                    sp.xq, s);
    return ok(err);
  }
  alignas(64) float gate_tile[4 * FRT_PANEL];
  alignas(64) float up_tile[4 * FRT_PANEL];
  if (phase == 1) {
    const int64_t panels = div_up(inner, FRT_PANEL);
    const Range items = split(rt.groups * panels, ith, nth);
    for (int64_t it = items.begin; it < items.end; ++it) {
      const int64_t g = it / panels, p = it % panels;
      const frt_packed_weight* gate = a->gate + rt.expert[g];
      const frt_packed_weight* up = a->up + rt.expert[g];
      const int64_t c0 = p * FRT_PANEL;
      const int64_t width = std::min<int64_t>(inner - c0, FRT_PANEL);
      for (int64_t s0 = rt.begin[g]; s0 < rt.begin[g + 1]; s0 += 4) {
        const int64_t rows = std::min<int64_t>(rt.begin[g + 1] - s0, 4);
        tile(gate, p, sp.xq, s0, rows, gate_tile);
        tile(up, p, sp.xq, s0, rows, up_tile);
        for (int64_t r = 0; r < rows; ++r) {
          float* out = sp.h + (s0 + r) * inner + c0;
          const float* u = up_tile + r * FRT_PANEL;
          kGemmTiles.activate(a->act, gate_tile + r * FRT_PANEL, out, width);
          for (int64_t j = 0; j < width; ++j) out[j] = out[j] * u[j];
        }
      }
    }
    return ok(err);
  }
  const int64_t n = a->down[0].n, n_panels = div_up(n, FRT_PANEL), ldp = part_stride(a);
  if (phase == 3) {
    const Range items = split(rt.groups * n_panels, ith, nth);
    for (int64_t it = items.begin; it < items.end; ++it) {
      const int64_t g = it / n_panels, p = it % n_panels;
      const frt_packed_weight* down = a->down + rt.expert[g];
      for (int64_t s0 = rt.begin[g]; s0 < rt.begin[g + 1]; s0 += 4) {
        const int64_t rows = std::min<int64_t>(rt.begin[g + 1] - s0, 4);
        tile(down, p, sp.hq, s0, rows, gate_tile);
        for (int64_t r = 0; r < rows; ++r)
          std::memcpy(sp.part + (s0 + r) * ldp + p * FRT_PANEL, gate_tile + r * FRT_PANEL,
                      FRT_PANEL * sizeof(float));
      }
    }
    return ok(err);
  }
  // phase 4
  alignas(64) float acc[FRT_MAX_ROWS * FRT_PANEL];  // the rows' sums over their experts
  const Range panels = split(n_panels, ith, nth);
  for (int64_t p = panels.begin; p < panels.end; ++p) {
    weighted_sums(rt, a->weight, sp.part, ldp, p, acc);
    gemm_store_rows(acc, a->m, 0, p, n, a->y, a->y_dtype, a->ldy);
  }
  return ok(err);
}

}  // namespace frt::kern
