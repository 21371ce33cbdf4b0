// flashrt/gemm's feed-forward: y = down(act(up(x) + b_up)) + b_down over FRT_W_INT8_GEMM weights.
//
// Note [GEMM feed-forward]: the op runs in one phase, over blocks of rows. A thread takes a
// contiguous run of row blocks and, for each block, (1) quantizes its x rows (Note [W8A8 rows]),
// (2) runs the up GEMM panel by panel with the bias added in the tile's epilogue and the
// activation applied to the tile while it is in L1, into an fp32 hidden block, (3) requantizes
// each hidden row (same 7-bit form; a row's scale needs all its columns, so the block is whole
// first), (4) runs the down GEMM with its bias and writes y. The hidden block (block rows x the
// intermediate width) never leaves the thread's slot of the workspace, so it is written and read
// back while cache-resident, where two projection seats with a host activation between them take
// the whole [rows, intermediate] tensor through memory and torch. Inside a block each weight
// panel is reused by every 4-row tile of the block.
//
// The workspace holds one slot per thread that can get work, up to kMaxSlots (the ABI's
// workspace() does not know the thread count); threads past that get no block. Pages of slots
// no thread touches are never backed.
//
// Every variant computes the same bits: the integer GEMM and quantization are shared with the
// linear op (kGemmTiles' per-row entries), and the activation (kGemmTiles.activate) is one
// definition written three times, with the same IEEE operations in the same order (no FMA, built
// with -ffp-contract=off): AVX2 eight at a time (x86/avx2/activate_avx2.cpp), zmm sixteen at a
// time (x86/avx512/activate_zmm.cpp: the avx512vnni and amx variants), the scalar mirror for the
// generic variant and for tails (ref/activate_ref.cpp), their constants in gemm_act.h. It is
// a rational function of one exp (Cephes' range reduction and polynomial):
//   silu(g) = g / (1 + e^-g),  gelu_tanh(g) = g / (1 + e^-2u),  u = sqrt(2/pi) (g + 0.044715 g^3)
//   gelu(g) = 0.5 g (1 + erf(g / sqrt 2)), erf by Abramowitz & Stegun 7.1.26 (|err| <= 1.5e-7)
// A NaN input stays NaN (the clamps keep the input on an unordered compare).
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gemm_op.h"
#include "gemm_tiles.h"

namespace frt::kern {
namespace {

constexpr int64_t kBlockRows = 32;  // rows per block (the hidden block: 32 x intermediate fp32)
constexpr int64_t kMaxSlots = 32;   // threads that can get blocks
// On the amx variant's tiles a block streams both weights in a fraction of the 4-row tiles' time,
// so blocks are longer there (Note [AMX feed-forward]).
constexpr int64_t kAmxBlockRows = 128;

int64_t block_rows() { return kGemmTiles.w8a8_rows_amx != nullptr ? kAmxBlockRows : kBlockRows; }

bool known_act(int32_t act) {
  return act == FRT_ACT_SILU || act == FRT_ACT_GELU || act == FRT_ACT_GELU_TANH;
}

// A form check of one of the two weights, its message prefixed with which.
int32_t check_part(const char* what, int32_t wformat, int64_t n, int64_t k, int32_t x_dtype,
                   int32_t y_dtype, frt_error* err) {
  const int32_t r = gemm_check_form(wformat, n, k, x_dtype, y_dtype, err);
  if (r != FRT_REASON_OK && err != nullptr) {
    char inner[200];
    std::memcpy(inner, err->message, sizeof inner - 1);
    inner[sizeof inner - 1] = '\0';
    std::snprintf(err->message, sizeof err->message, "ffn %s: %.200s", what, inner);
  }
  return r;
}

// One thread's slot: the block's quantized x rows, its fp32 hidden rows, their quantized form.
struct Slot {
  QuantRows xq, hq;
  float* h;
  int64_t ldh;  // floats per hidden row: whole up panels
};

struct SlotLayout {
  int64_t xu, xs, h, hu, hs, bytes, ldh;
};

SlotLayout slot_layout(const frt_ffn_args* a) {
  SlotLayout l{};
  l.ldh = div_up(a->up->n, FRT_PANEL) * FRT_PANEL;
  const int64_t rows = block_rows();
  const int64_t params = align64(rows * 4);  // one float or int32 per row
  l.xu = 0;
  l.xs = l.xu + align64(rows * gemm_row_stride(a->up->k));
  l.h = l.xs + 2 * params;
  l.hu = l.h + align64(rows * l.ldh * 4);
  l.hs = l.hu + align64(rows * gemm_row_stride(a->up->n));
  l.bytes = l.hs + 2 * params;
  return l;
}

int64_t slots_for(int64_t m) { return std::min(kMaxSlots, div_up(m, 4)); }

Slot slot_at(const frt_ffn_args* a, int32_t i) {
  const SlotLayout l = slot_layout(a);
  auto* base = static_cast<uint8_t*>(a->workspace) + i * l.bytes;
  const int64_t params = align64(block_rows() * 4);
  Slot s{};
  s.xq = {base + l.xu, gemm_row_stride(a->up->k), reinterpret_cast<float*>(base + l.xs),
          reinterpret_cast<int32_t*>(base + l.xs + params)};
  s.hq = {base + l.hu, gemm_row_stride(a->up->n), reinterpret_cast<float*>(base + l.hs),
          reinterpret_cast<int32_t*>(base + l.hs + params)};
  s.h = reinterpret_cast<float*>(base + l.h);
  s.ldh = l.ldh;
  return s;
}

// Note [AMX feed-forward]: on the amx variant a block is up to kAmxBlockRows rows, and its rows
// past the last multiple of 16 aside, both GEMMs run on the tiles (Note [AMX rows]): the x and
// hidden rows quantized into tile order, up's panels in pairs into the fp32 hidden block with
// the bias (the bits the 4-row tile's epilogue writes), the activation over each hidden row in
// place just before that row is quantized (the hidden block, 128 rows of 4608 fp32 at PixArt's
// width, is larger than L2: a separate pass read it from L3 twice; fused, -4 to -6% time per
// call), down's panels in pairs straight into y. Every row's bits are the 4-row path's: the
// quantization is per row, the sums are the same integers, and the activation is elementwise.

// Rows [r0, r0 + rows) of the call, rows <= block_rows(), through the slot.
void run_block(const frt_ffn_args* a, Slot s, int64_t r0, int64_t rows) {
  const frt_packed_weight *up = a->up, *down = a->down;
  const int64_t xsize = a->x_dtype == FRT_F32 ? 4 : 2, ysize = a->y_dtype == FRT_F32 ? 4 : 2;
  const int64_t tiled = gemm_amx_rows(rows);  // the rows the tiles take; the rest 4-row tiles
  const bool amx = tiled > 0;
  s.xq.tiled = gemm_amx_tiled_rows(rows, s.xq.lda);
  s.hq.tiled = gemm_amx_tiled_rows(rows, s.hq.lda);
  const int64_t vector_from = tiled;
  for (int64_t r = 0; r < rows; ++r)
    gemm_quantize_row(static_cast<const char*>(a->x) + (r0 + r) * a->ldx * xsize, a->x_dtype, up->k,
                      s.xq, r);
  alignas(64) float tile[4 * FRT_PANEL];
  const int64_t up_panels = div_up(up->n, FRT_PANEL);
  if (amx) {
    for (int64_t p = 0; p < up_panels; p += 2)
      kGemmTiles.w8a8_rows_amx(up, p, std::min<int64_t>(2, up_panels - p), s.xq, 0, tiled,
                               a->up_bias, s.h, FRT_F32, s.ldh);
  }
  for (int64_t p = 0; p < up_panels; ++p)
    for (int64_t t = vector_from; t < rows; t += 4) {
      const int64_t tr = std::min<int64_t>(4, rows - t);
      kGemmTiles.w8a8_rows_tile(up, p, s.xq, t, tr, a->up_bias, tile);
      for (int64_t r = 0; r < tr; ++r)
        kGemmTiles.activate(a->act, tile + r * FRT_PANEL, s.h + (t + r) * s.ldh + p * FRT_PANEL,
                            FRT_PANEL);
    }
  // A tiled row's activation just before its quantization, while it is in L1 (Note [AMX
  // feed-forward]).
  for (int64_t r = 0; r < rows; ++r) {
    if (r < tiled) kGemmTiles.activate(a->act, s.h + r * s.ldh, s.h + r * s.ldh, up->n);
    gemm_quantize_row(s.h + r * s.ldh, FRT_F32, up->n, s.hq, r);
  }
  const int64_t down_panels = div_up(down->n, FRT_PANEL);
  if (amx) {
    void* y = static_cast<char*>(a->y) + r0 * a->ldy * ysize;
    for (int64_t p = 0; p < down_panels; p += 2)
      kGemmTiles.w8a8_rows_amx(down, p, std::min<int64_t>(2, down_panels - p), s.hq, 0, tiled,
                               a->down_bias, y, a->y_dtype, a->ldy);
  }
  for (int64_t p = 0; p < down_panels; ++p)
    for (int64_t t = vector_from; t < rows; t += 4) {
      const int64_t tr = std::min<int64_t>(4, rows - t);
      kGemmTiles.w8a8_rows_tile(down, p, s.hq, t, tr, a->down_bias, tile);
      gemm_store_rows(tile, tr, r0 + t, p, down->n, a->y, a->y_dtype, a->ldy);
    }
}

}  // namespace

int32_t gemm_ffn_supports_form(const frt_op_desc* d, frt_error* err) {
  if (d->group != 0)  // the decode form's activation blocks are the linear op's alone
    return fail(err, FRT_REASON_FORMAT, "gemm ffn: activations per row only, not blocks of %d",
                d->group);
  if (!known_act(d->act))
    return fail(err, FRT_REASON_FORMAT, "gemm ffn: activation %d not in {silu, gelu, gelu_tanh}",
                d->act);
  if (d->rows_max < 1)
    return fail(err, FRT_REASON_ROWS_OUT_OF_BAND, "gemm ffn: rows up to %lld",
                static_cast<long long>(d->rows_max));
  if (int32_t r = check_part("up", d->wformat, d->inner, d->k, d->x_dtype, d->y_dtype, err);
      r != FRT_REASON_OK)
    return r;
  return check_part("down", d->wformat, d->n, d->inner, d->x_dtype, d->y_dtype, err);
}

int32_t gemm_ffn_supports(const frt_ffn_args* a, frt_error* err) {
  if (a == nullptr || a->up == nullptr || a->down == nullptr)
    return fail(err, FRT_REASON_FORMAT, "gemm ffn: no arguments");
  if (a->gate != nullptr)
    return fail(err, FRT_REASON_FORMAT, "gemm ffn: ungated, gate must be NULL");
  if (!known_act(a->act))
    return fail(err, FRT_REASON_FORMAT, "gemm ffn: activation %d not in {silu, gelu, gelu_tanh}",
                a->act);
  const frt_packed_weight *up = a->up, *down = a->down;
  if (int32_t r = check_part("up", up->format, up->n, up->k, a->x_dtype, a->y_dtype, err);
      r != FRT_REASON_OK)
    return r;
  if (int32_t r = check_part("down", down->format, down->n, down->k, a->x_dtype, a->y_dtype, err);
      r != FRT_REASON_OK)
    return r;
  if (down->k != up->n)
    return fail(err, FRT_REASON_SHAPE, "gemm ffn: up %lldx%lld, down %lldx%lld do not chain",
                static_cast<long long>(up->n), static_cast<long long>(up->k),
                static_cast<long long>(down->n), static_cast<long long>(down->k));
  for (const frt_packed_weight* w : {up, down}) {
    if (w->qdata == nullptr || w->scales == nullptr || w->mins == nullptr)
      return fail(err, FRT_REASON_FORMAT,
                  "gemm ffn: int8_gemm weight without data, scales or sums");
    if (w->group != 0)
      return fail(err, FRT_REASON_FORMAT, "gemm ffn: activations per row only, not blocks of %d",
                  w->group);
  }
  if (a->m < 1)
    return fail(err, FRT_REASON_ROWS_OUT_OF_BAND, "gemm ffn: rows M=%lld",
                static_cast<long long>(a->m));
  if (a->x == nullptr || a->y == nullptr)
    return fail(err, FRT_REASON_LAYOUT, "gemm ffn: missing input or output");
  if (a->ldx < up->k || a->ldy < down->n)
    return fail(err, FRT_REASON_LAYOUT,
                "gemm ffn: row strides %lld/%lld below widths k=%lld n=%lld",
                static_cast<long long>(a->ldx), static_cast<long long>(a->ldy),
                static_cast<long long>(up->k), static_cast<long long>(down->n));
  return ok(err);
}

int64_t gemm_ffn_workspace(const frt_ffn_args* a) { return slots_for(a->m) * slot_layout(a).bytes; }

int32_t gemm_ffn_run(const frt_ffn_args* a, int32_t phase, int32_t ith, int32_t nth,
                     frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  if (phase != 0) return fail(err, FRT_E_INVALID, "gemm ffn has no phase %d", phase);
  if (a->workspace == nullptr) return fail(err, FRT_E_INVALID, "no workspace");
  const int64_t used = std::min<int64_t>(nth, slots_for(a->m));
  if (ith >= used) return ok(err);
  // Blocks of at most kBlockRows, as many as needed to give every used thread a share.
  const int64_t block = std::clamp<int64_t>(div_up(div_up(a->m, used), 4) * 4, 4, block_rows());
  const Range blocks = split(div_up(a->m, block), ith, static_cast<int32_t>(used));
  const Slot s = slot_at(a, ith);
  for (int64_t b = blocks.begin; b < blocks.end; ++b) {
    const int64_t r0 = b * block;
    run_block(a, s, r0, std::min(block, a->m - r0));
  }
  return ok(err);
}

}  // namespace frt::kern
