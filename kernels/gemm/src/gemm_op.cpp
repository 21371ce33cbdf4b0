// flashrt/gemm's op: checks, workspace and the two phases (quantize rows; integer GEMM by panel).
#include "gemm_op.h"

#include <frt_kern/util.h>

#include <algorithm>
#include <cstring>

#include "gemm_tiles.h"

namespace frt::kern {

int64_t gemm_row_stride(int64_t k) { return align64(div_up(k, 4) * 4); }

namespace {
// Block scales per row (floats), padded to 16 so rows start 64-byte aligned.
int64_t block_stride(int64_t k) { return div_up(div_up(k, kGemmActBlock), 16) * 16; }
}  // namespace

namespace {

// What every layout of this package shares: 1..kGemmMaxK wide, f32/bf16 activations.
int32_t check_widths_and_dtypes(int64_t n, int64_t k, int32_t x_dtype, int32_t y_dtype,
                                frt_error* err) {
  if (n <= 0 || k <= 0 || k > kGemmMaxK)
    return fail(err, FRT_REASON_SHAPE, "gemm: weight %lldx%lld outside 1..%lld wide",
                static_cast<long long>(n), static_cast<long long>(k),
                static_cast<long long>(kGemmMaxK));
  if ((x_dtype != FRT_F32 && x_dtype != FRT_BF16) || (y_dtype != FRT_F32 && y_dtype != FRT_BF16))
    return fail(err, FRT_REASON_DTYPE, "gemm: activations %s -> %s; supported: f32, bf16",
                dtype_name(x_dtype), dtype_name(y_dtype));
  return ok(err);
}

}  // namespace

int32_t gemm_check_form(int32_t wformat, int64_t n, int64_t k, int32_t x_dtype, int32_t y_dtype,
                        frt_error* err) {
  if (wformat != FRT_W_INT8_GEMM)
    return fail(err, FRT_REASON_FORMAT, "gemm: weight format %d; takes int8_gemm (%d) only",
                wformat, FRT_W_INT8_GEMM);
  return check_widths_and_dtypes(n, k, x_dtype, y_dtype, err);
}

namespace {

QuantRows quant_view(const frt_linear_args* a) {
  auto* base = static_cast<uint8_t*>(a->workspace);
  const int64_t lda = gemm_row_stride(a->w->k);
  const int64_t ubytes = align64(a->m * lda), pbytes = align64(a->m * 4);
  return {base, lda, reinterpret_cast<float*>(base + ubytes),
          reinterpret_cast<int32_t*>(base + ubytes + pbytes)};
}

}  // namespace

void gemm_store_rows(const float* tile, int64_t rows, int64_t r0, int64_t p, int64_t n, void* y,
                     int32_t y_dtype, int64_t ldy) {
  const int64_t c0 = p * FRT_PANEL;
  const int64_t cols = n - c0 < FRT_PANEL ? n - c0 : FRT_PANEL;
  for (int64_t r = 0; r < rows; ++r) {
    const float* t = tile + r * FRT_PANEL;
    if (y_dtype == FRT_F32) {
      float* out = static_cast<float*>(y) + (r0 + r) * ldy + c0;
      for (int64_t j = 0; j < cols; ++j) out[j] = t[j];
    } else {
      uint16_t* out = static_cast<uint16_t*>(y) + (r0 + r) * ldy + c0;
      for (int64_t j = 0; j < cols; ++j) out[j] = f32_to_bf16(t[j]);
    }
  }
}

namespace {

// The nibble forms' contract (gemm_nibble_form): their groups (32; int6_super_gemm's Q6_K
// groups of 16), k a multiple of 32 (int4_gemm) or of whole super-blocks of 256.
int32_t check_nibble_form(int32_t wformat, int32_t group, int64_t n, int64_t k, int32_t x_dtype,
                          int32_t y_dtype, frt_error* err) {
  const NibbleForm f = gemm_nibble_form(wformat);
  if (group != f.group || k % f.multiple != 0)
    return fail(err, FRT_REASON_SHAPE,
                "gemm: %s weight %lldx%lld in groups of %d; takes groups of %d and k a multiple of "
                "%lld",
                f.name, static_cast<long long>(n), static_cast<long long>(k), group, f.group,
                static_cast<long long>(f.multiple));
  return check_widths_and_dtypes(n, k, x_dtype, y_dtype, err);
}

int32_t refuse_format(int32_t wformat, frt_error* err) {
  return fail(err, FRT_REASON_FORMAT,
              "gemm: weight format %d; the linear takes int8_gemm (%d), int4_gemm (%d), "
              "int4_super_gemm (%d), int6_super_gemm (%d), int5_gemm (%d) or int5_super_gemm (%d)",
              wformat, FRT_W_INT8_GEMM, FRT_W_INT4_GEMM, FRT_W_INT4_SUPER_GEMM,
              FRT_W_INT6_SUPER_GEMM, FRT_W_INT5_GEMM, FRT_W_INT5_SUPER_GEMM);
}

}  // namespace

int32_t gemm_supports_form(const frt_op_desc* d, frt_error* err) {
  if (d->rows_max < 1)
    return fail(err, FRT_REASON_ROWS_OUT_OF_BAND, "gemm: rows up to %lld",
                static_cast<long long>(d->rows_max));
  if (gemm_nibble_format(d->wformat))
    return check_nibble_form(d->wformat, d->group, d->n, d->k, d->x_dtype, d->y_dtype, err);
  if (d->wformat != FRT_W_INT8_GEMM) return refuse_format(d->wformat, err);
  if (d->group != 0 && d->group != kGemmActBlock)
    return fail(err, FRT_REASON_FORMAT, "gemm: activation blocks of %d; takes 0 (rows) or %d",
                d->group, kGemmActBlock);
  return gemm_check_form(d->wformat, d->n, d->k, d->x_dtype, d->y_dtype, err);
}

int32_t gemm_supports(const frt_linear_args* a, frt_error* err) {
  if (a == nullptr || a->w == nullptr) return fail(err, FRT_REASON_FORMAT, "gemm: no arguments");
  const frt_packed_weight* w = a->w;
  if (w->format != FRT_W_INT8_GEMM && !gemm_nibble_format(w->format))
    return refuse_format(w->format, err);
  if (gemm_nibble_format(w->format)) {
    if (int32_t r = check_nibble_form(w->format, w->group, w->n, w->k, a->x_dtype, a->y_dtype, err);
        r != FRT_REASON_OK)
      return r;
    const char* name = gemm_nibble_form(w->format).name;
    if (w->qdata == nullptr || w->scales == nullptr || w->scale_dtype != FRT_F16)
      return fail(err, FRT_REASON_FORMAT, "gemm: %s weight without data or f16 scales", name);
    if (w->format != FRT_W_INT4_GEMM && w->format != FRT_W_INT5_GEMM && w->mins != nullptr)
      return fail(err, FRT_REASON_FORMAT, "gemm: %s weight with mins (its records hold them)",
                  name);
  } else if (int32_t r = gemm_check_form(w->format, w->n, w->k, a->x_dtype, a->y_dtype, err);
             r != FRT_REASON_OK) {
    return r;
  } else if (w->qdata == nullptr || w->scales == nullptr || w->mins == nullptr) {
    return fail(err, FRT_REASON_FORMAT, "gemm: int8_gemm weight without data, scales or sums");
  }
  if (w->format == FRT_W_INT8_GEMM && w->group != 0 && w->group != kGemmActBlock)
    return fail(err, FRT_REASON_FORMAT, "gemm: activation blocks of %d; takes 0 (rows) or %d",
                w->group, kGemmActBlock);
  if (a->m < 1)
    return fail(err, FRT_REASON_ROWS_OUT_OF_BAND, "gemm: rows M=%lld",
                static_cast<long long>(a->m));
  if (a->x == nullptr || a->y == nullptr)
    return fail(err, FRT_REASON_LAYOUT, "gemm: missing input or output");
  if (a->ldx < w->k || a->ldy < w->n)
    return fail(err, FRT_REASON_LAYOUT, "gemm: row strides %lld/%lld below widths k=%lld n=%lld",
                static_cast<long long>(a->ldx), static_cast<long long>(a->ldy),
                static_cast<long long>(w->k), static_cast<long long>(w->n));
  return ok(err);
}

int64_t gemm_block_rows_bytes(int64_t rows, int64_t k) {
  return align64(rows * gemm_row_stride(k)) + 3 * align64(rows * block_stride(k) * 4);
}

BlockRows gemm_block_view(uint8_t* base, int64_t rows, int64_t k) {
  const int64_t lda = gemm_row_stride(k), ldd = block_stride(k);
  const int64_t rows_bytes = align64(rows * lda), scale_bytes = align64(rows * ldd * 4);
  return {reinterpret_cast<int8_t*>(base),
          lda,
          reinterpret_cast<float*>(base + rows_bytes),
          ldd,
          reinterpret_cast<int32_t*>(base + rows_bytes + scale_bytes),
          reinterpret_cast<int32_t*>(base + rows_bytes + 2 * scale_bytes)};
}

void gemm_quantize_block_row(const void* x, int32_t x_dtype, int64_t k, const BlockRows& q,
                             int64_t r) {
  if (r >= q.tiled) {
    kGemmTiles.quantize_row_blocks(x, x_dtype, k, q.a + r * q.lda, q.d + r * q.ldd);
    block_sums(q.a + r * q.lda, k, q.sum + r * q.ldd, q.half + r * q.ldd);
    return;
  }
  // The row's blocks to their tiles (Note [AMX blocks]).
  alignas(64) int8_t row[kGemmAmxTiledMaxLda];
  kGemmTiles.quantize_row_blocks(x, x_dtype, k, row, q.d + r * q.ldd);
  block_sums(row, k, q.sum + r * q.ldd, q.half + r * q.ldd);
  const int64_t blocks = div_up(k, kGemmActBlock), written = div_up(k, 4) * 4;
  std::memset(row + written, 0, blocks * kGemmActBlock - written);
  int8_t* group = q.a + (r / 16) * 512 + (r % 16) * kGemmActBlock;
  for (int64_t b = 0; b < blocks; ++b)
    std::memcpy(group + b * (q.tiled / 16) * 512, row + b * kGemmActBlock, kGemmActBlock);
}

void gemm_quantize_row(const void* x, int32_t x_dtype, int64_t k, const QuantRows& q, int64_t r) {
  if (r >= q.tiled) {
    kGemmTiles.quantize_row(x, x_dtype, k, q.u + r * q.lda, q.scale + r, q.zero + r);
    return;
  }
  // The row's 64-byte pieces to their tiles (Note [AMX rows]).
  alignas(64) uint8_t row[kGemmAmxTiledMaxLda];
  kGemmTiles.quantize_row(x, x_dtype, k, row, q.scale + r, q.zero + r);
  const int64_t written = div_up(k, 4) * 4;  // the quantizer's bytes; zeros on to lda
  std::memset(row + written, 0, q.lda - written);
  uint8_t* group = q.u + (r / 16) * 16 * q.lda + (r % 16) * 64;
  for (int64_t s = 0; s < q.lda / 64; ++s) std::memcpy(group + s * 1024, row + s * 64, 64);
}

int64_t gemm_amx_rows(int64_t m) {
  if (kGemmTiles.w8a8_rows_amx == nullptr || m <= kGemmAmxMaxVectorRows) return 0;
  return m / 16 * 16;
}

int64_t gemm_amx_block_rows(const frt_packed_weight* w, int64_t m) {
  if (kGemmTiles.blocks_amx == nullptr || !gemm_amx_block_format(w->format)) return 0;
  return gemm_amx_rows(m);
}

int64_t gemm_amx_block_tiled_rows(const frt_packed_weight* w, int64_t m, int64_t lda) {
  return lda <= kGemmAmxTiledMaxLda ? gemm_amx_block_rows(w, m) : 0;
}

int64_t gemm_amx_tiled_rows(int64_t m, int64_t lda) {
  return lda <= kGemmAmxTiledMaxLda ? gemm_amx_rows(m) : 0;
}

int64_t gemm_workspace(const frt_linear_args* a) {
  if (gemm_block_form(a->w)) return gemm_block_rows_bytes(a->m, a->w->k);
  return align64(a->m * gemm_row_stride(a->w->k)) + 2 * align64(a->m * 4);
}

namespace {

// The linear's two phases: quantize_row(r) for this thread's rows, then tile(p, r0, rows, out)
// over this thread's panels, 4 rows at a time, stored into y.
template <class QuantizeRow, class Tile>
int32_t run_phases(const frt_linear_args* a, int32_t phase, int32_t ith, int32_t nth,
                   frt_error* err, QuantizeRow&& quantize_row_at, Tile&& tile_at) {
  if (phase == 0) {
    const Range rows = split(a->m, ith, nth);
    for (int64_t r = rows.begin; r < rows.end; ++r) quantize_row_at(r);
    return ok(err);
  }
  if (phase != 1) return fail(err, FRT_E_INVALID, "gemm has no phase %d", phase);
  alignas(64) float tile[4 * FRT_PANEL];
  const Range panels = split(div_up(a->w->n, FRT_PANEL), ith, nth);
  for (int64_t p = panels.begin; p < panels.end; ++p)
    for (int64_t r0 = 0; r0 < a->m; r0 += 4) {
      const int64_t rows = a->m - r0 < 4 ? a->m - r0 : 4;
      tile_at(p, r0, rows, tile);
      gemm_store_rows(tile, rows, r0, p, a->w->n, a->y, a->y_dtype, a->ldy);
    }
  return ok(err);
}

// The rows of one block on the amx variant's tiles: its quantized bytes stay in L2 (at most
// 1 MiB) while panels pass over them two at a time (Note [AMX rows]).
int64_t amx_block_rows(int64_t lda) {
  return std::clamp<int64_t>((int64_t{1} << 20) / lda / 32 * 32, 32, kGemmAmxBlockRows);
}

// The rows of one pass of the block forms' tiles (Note [AMX blocks]): their fp32 sums (16 KiB) and
// block scales stay in L1 while every block passes (256 rows: +10% time).
constexpr int64_t kAmxBlockFormRows = 128;

// Note [AMX row split]: with at least a block of rows per thread, each thread takes whole blocks
// and every panel, and quantizes a block's rows itself just before its tiles read them, into the
// same L2-resident place each time (the start of its rows in the workspace). The weights are read
// as often as when the threads share the panels of every block (once per block), but the quantized
// rows do not go out to memory and back, and no thread waits at the barrier between quantizing and
// the tiles: -5 to -10% time at 512-2048 rows on the Xeon (bench/results/amx/gemm_ablation.json).
// With fewer rows the threads share the panels, so the weights are read once per block rather than
// once per thread.
bool amx_split_rows(int64_t m16, int64_t lda, int32_t nth) {
  return m16 >= nth * amx_block_rows(lda);
}

// The rows past the last multiple of 16 on the 4-row tiles (tile_at(p, r0, rows, tile)), over
// this thread's panels.
template <class Tile>
void amx_tail_rows(const frt_linear_args* a, int64_t m16, Range panels, Tile&& tile_at) {
  alignas(64) float tile[4 * FRT_PANEL];
  for (int64_t p = panels.begin; p < panels.end; ++p)
    for (int64_t r0 = m16; r0 < a->m; r0 += 4) {
      const int64_t rows = std::min<int64_t>(4, a->m - r0);
      tile_at(p, r0, rows, tile);
      gemm_store_rows(tile, rows, r0, p, a->w->n, a->y, a->y_dtype, a->ldy);
    }
}

// Phase 1 on the amx variant's tiles, the threads sharing the panels: rows [0, m16) in blocks of
// at most `block`, this thread's panels over each block two at a time (tiles(p, np, r0, rows),
// into y), then the rows past m16 on the 4-row tiles.
template <class Tiles, class Tile>
int32_t run_amx_panels(const frt_linear_args* a, int64_t m16, int64_t block, int32_t ith,
                       int32_t nth, frt_error* err, Tiles&& tiles, Tile&& tile_at) {
  const Range panels = split(div_up(a->w->n, FRT_PANEL), ith, nth);
  for (int64_t r0 = 0; r0 < m16; r0 += block)
    for (int64_t p = panels.begin; p < panels.end; p += 2)
      tiles(p, std::min<int64_t>(2, panels.end - p), r0, std::min(block, m16 - r0));
  amx_tail_rows(a, m16, panels, tile_at);
  return ok(err);
}

// Phase 1 with the rows split (Note [AMX row split]): this thread's rows in blocks of nearly
// equal size (16-row groups apart), each quantized into the same place (the workspace from the
// start of the thread's rows, so they stay in L2 from block to block; no block is longer than the
// thread's rows) and then passed under every panel. The tiles see a block as rows 0.. of its own
// view: quantized bytes, scales and zero points, tile order and output.
// quantize_row_at(r, view, i) quantizes row r of x as row i of the block's view; tile_at as
// amx_tail_rows's.
template <class QuantizeRow, class Tile>
int32_t run_amx_row_blocks(const frt_linear_args* a, const QuantRows& q, int64_t m16, int32_t ith,
                           int32_t nth, frt_error* err, QuantizeRow&& quantize_row_at,
                           Tile&& tile_at) {
  const frt_packed_weight* w = a->w;
  const Range groups = split(m16 / 16, ith, nth);  // 16-row groups
  const int64_t count = groups.end - groups.begin;
  const int64_t blocks = div_up(count, amx_block_rows(q.lda) / 16);
  const int64_t panels = div_up(w->n, FRT_PANEL);
  const int64_t ysize = a->y_dtype == FRT_F32 ? 4 : 2;
  for (int64_t i = 0; i < blocks; ++i) {
    const int64_t r0 = (groups.begin + count * i / blocks) * 16;
    const int64_t rows = (groups.begin + count * (i + 1) / blocks) * 16 - r0;
    QuantRows b = q;
    b.u = q.u + groups.begin * 16 * q.lda;
    b.scale = q.scale + r0;
    b.zero = q.zero + r0;
    b.tiled = std::clamp<int64_t>(q.tiled - r0, 0, rows);
    for (int64_t r = 0; r < rows; ++r) quantize_row_at(r0 + r, b, r);
    void* y = static_cast<char*>(a->y) + r0 * a->ldy * ysize;
    for (int64_t p = 0; p < panels; p += 2)
      kGemmTiles.w8a8_rows_amx(w, p, std::min<int64_t>(2, panels - p), b, 0, rows, a->bias, y,
                               a->y_dtype, a->ldy);
  }
  amx_tail_rows(a, m16, split(panels, ith, nth), tile_at);
  return ok(err);
}

}  // namespace

int32_t gemm_run(const frt_linear_args* a, int32_t phase, int32_t ith, int32_t nth,
                 frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  if (a->workspace == nullptr) return fail(err, FRT_E_INVALID, "no workspace");
  const int64_t xsize = a->x_dtype == FRT_F32 ? 4 : 2, k = a->w->k;
  auto x_row = [&](int64_t r) { return static_cast<const char*>(a->x) + r * a->ldx * xsize; };
  if (gemm_block_form(a->w)) {  // the decode forms (Notes [W8A8 blocks], [W4A8], [W6A8])
    BlockRows q = gemm_block_view(static_cast<uint8_t*>(a->workspace), a->m, k);
    q.tiled = gemm_amx_block_tiled_rows(a->w, a->m, q.lda);
    const auto tile_at = [&](int64_t p, int64_t r0, int64_t rows, float* tile) {
      gemm_block_tile(a->w, p, q, r0, rows, a->bias, tile);
    };
    if (const int64_t m16 = gemm_amx_block_rows(a->w, a->m); phase == 1 && m16 > 0)
      return run_amx_panels(
          a, m16, std::min(kAmxBlockFormRows, amx_block_rows(q.lda)), ith, nth, err,
          [&](int64_t p, int64_t np, int64_t r0, int64_t rows) {
            kGemmTiles.blocks_amx(a->w, p, np, q, r0, rows, a->bias, a->y, a->y_dtype, a->ldy);
          },
          tile_at);
    return run_phases(
        a, phase, ith, nth, err,
        [&](int64_t r) { gemm_quantize_block_row(x_row(r), a->x_dtype, k, q, r); }, tile_at);
  }
  QuantRows q = quant_view(a);
  q.tiled = gemm_amx_tiled_rows(a->m, q.lda);
  auto quantize_row_at = [&](int64_t r) { gemm_quantize_row(x_row(r), a->x_dtype, k, q, r); };
  const auto tile_at = [&](int64_t p, int64_t r0, int64_t rows, float* tile) {
    kGemmTiles.w8a8_rows_tile(a->w, p, q, r0, rows, a->bias, tile);
  };
  if (const int64_t m16 = gemm_amx_rows(a->m); m16 > 0 && amx_split_rows(m16, q.lda, nth)) {
    if (phase == 0) {  // only the rows the 4-row tiles take; each thread quantizes its blocks
      const Range rows = split(a->m - m16, ith, nth);
      for (int64_t r = m16 + rows.begin; r < m16 + rows.end; ++r) quantize_row_at(r);
      return ok(err);
    }
    if (phase != 1) return fail(err, FRT_E_INVALID, "gemm has no phase %d", phase);
    return run_amx_row_blocks(
        a, q, m16, ith, nth, err,
        [&](int64_t r, const QuantRows& view, int64_t i) {
          gemm_quantize_row(x_row(r), a->x_dtype, k, view, i);
        },
        tile_at);
  } else if (phase == 1 && m16 > 0) {
    return run_amx_panels(
        a, m16, amx_block_rows(q.lda), ith, nth, err,
        [&](int64_t p, int64_t np, int64_t r0, int64_t rows) {
          kGemmTiles.w8a8_rows_amx(a->w, p, np, q, r0, rows, a->bias, a->y, a->y_dtype, a->ldy);
        },
        tile_at);
  }
  return run_phases(a, phase, ith, nth, err, quantize_row_at, tile_at);
}

}  // namespace frt::kern
