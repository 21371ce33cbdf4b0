// flashrt/gemm's per-ISA half: the row quantizers and the 4-row x FRT_PANEL integer tiles, behind
// one table per variant (Note [GEMM variants]), and the scalar helpers every build shares.
#pragma once

#include <frt_kern/util.h>

#include <type_traits>

#include "gemm_attention.h"
#include "gemm_op.h"

namespace frt::kern {

// Note [GEMM variants]: like kernels/common's PanelTable, every variant fills one GemmTiles
// (kGemmTiles) at compile time and the op code (gemm_op.cpp, gemm_ffn.cpp, gemm_moe.cpp) calls
// through it. The generic variant holds the scalar reference (src/ref/, compiled into every
// variant), avx2 the AVX2 paths (src/x86/avx2/), avx512vnni the zmm paths with vpdpbusd
// (src/x86/avx512/), amx those and its tiles (src/x86/amx/); each variant's select_*.cpp names its
// entries, and CMake compiles each variant's folder only into it. A fast path that leaves part of a
// row (AVX2's tail elements, a partial block) finishes it with the reference's pieces declared
// below. Every path computes the same integers and, built without FMA contraction
// (kernels/CMakeLists.txt) and with one epilogue order, the same fp32 bits: the kernel tests
// compare the variants bit for bit.
struct GemmTiles {
  // One row to 7-bit asymmetric (Note [W8A8 rows]): u[k rounded up to 4], its scale and zero.
  void (*quantize_row)(const void* x, int32_t x_dtype, int64_t k, uint8_t* u, float* scale,
                       int32_t* zero);
  // y rows [r0, r0 + rows) x panel p over int8 weights and per-row activations: the integer GEMM
  // and its epilogue into tile[rows][FRT_PANEL] (fp32, bias added); rows <= 4.
  void (*w8a8_rows_tile)(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
                         int64_t rows, const float* bias, float* tile);
  // One row to int8 per block of kGemmActBlock (Note [W8A8 blocks]): a and a scale per block.
  void (*quantize_row_blocks)(const void* x, int32_t x_dtype, int64_t k, int8_t* a, float* d);
  // As w8a8_rows_tile over int8 weights and activation blocks (Note [W8A8 blocks]).
  void (*w8a8_blocks_tile)(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                           int64_t rows, const float* bias, float* tile);
  // As w8a8_rows_tile over int4 weights (FRT_W_INT4_GEMM, FRT_W_INT4_SUPER_GEMM) and
  // activation blocks (Note [W4A8]).
  void (*w4a8_blocks_tile)(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                           int64_t rows, const float* bias, float* tile);
  // As w4a8_blocks_tile over Q6_K's six-bit values (FRT_W_INT6_SUPER_GEMM; Note [W6A8]).
  void (*w6a8_blocks_tile)(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                           int64_t rows, const float* bias, float* tile);
  // out[i] = act(in[i]) for i < n: the feed-forward's activation (Note [GEMM feed-forward]).
  void (*activate)(int32_t act, const float* in, float* out, int64_t n);
  // The per-row form on AMX-INT8 tiles (Note [AMX rows]), the amx variant only (nullptr
  // elsewhere): rows [r0, r0 + rows) (a multiple of 16, at most kGemmAmxBlockRows) x panels
  // [p, p + np) (np 1 or 2), finished and stored into y. The same bits as w8a8_rows_tile.
  void (*w8a8_rows_amx)(const frt_packed_weight* w, int64_t p, int64_t np, const QuantRows& q,
                        int64_t r0, int64_t rows, const float* bias, void* y, int32_t y_dtype,
                        int64_t ldy);
  // The block forms on AMX-INT8 tiles (Note [AMX blocks]), the amx variant only: as
  // w8a8_rows_amx over activation blocks, for int8_gemm in blocks and the w4a8 layouts
  // (gemm_amx_block_format). The same bits as gemm_block_tile.
  void (*blocks_amx)(const frt_packed_weight* w, int64_t p, int64_t np, const BlockRows& q,
                     int64_t r0, int64_t rows, const float* bias, void* y, int32_t y_dtype,
                     int64_t ldy);
  // Sequence attention on AMX-BF16 tiles (Note [Sequence attention tiles] in attention_amx.cpp),
  // the amx variant only: work items [i0, i1) over the packs phase 0 wrote (gemm_attention.h).
  void (*attention_amx)(const frt_sequence_attention_args* a, const AttentionPack& pack, int64_t i0,
                        int64_t i1);
};

// The block layouts the amx variant's tiles take (all but int6_super_gemm, whose groups of 16
// stay on the 4-row tiles).
inline bool gemm_amx_block_format(int32_t wformat) {
  return wformat == FRT_W_INT8_GEMM || gemm_int4_format(wformat);
}

// Row counts up to this stay on the 4-row tiles where the amx variant has its tiles; the tiles
// take the rows from 16 on, sixteen at a time. At 16 rows (a batch of 16 decode rows) the tiles
// took 0.27-0.37x the 4-row tiles' time in the per-row form, 0.50-0.57x in int8 blocks and
// 0.74-0.85x in int4 on the Xeon (bench/results/amx/gemm_ablation.json), so decode's band keeps
// only 1..15 rows on the vector tiles.
inline constexpr int64_t kGemmAmxMaxVectorRows = 15;
// The most rows one w8a8_rows_amx call takes (its int32 block of sums: 32 KiB).
inline constexpr int64_t kGemmAmxBlockRows = 256;
// Rows up to this many bytes (16384 inputs) are quantized into tile order (QuantRows::tiled)
// through a buffer on the stack; wider ones stay row-major and the tiles read them at stride lda.
inline constexpr int64_t kGemmAmxTiledMaxLda = 16384;

extern const GemmTiles kGemmTiles;

// Panel p of a decode-form weight (activations per block of 32) over rows [r0, r0 + rows) of q:
// the tile of its format.
inline void gemm_block_tile(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                            int64_t rows, const float* bias, float* tile) {
  if (gemm_int4_format(w->format))
    kGemmTiles.w4a8_blocks_tile(w, p, q, r0, rows, bias, tile);
  else if (w->format == FRT_W_INT6_SUPER_GEMM)
    kGemmTiles.w6a8_blocks_tile(w, p, q, r0, rows, bias, tile);
  else
    kGemmTiles.w8a8_blocks_tile(w, p, q, r0, rows, bias, tile);
}

// Quads (four inputs) and octs (eight) per activation block.
inline constexpr int64_t kQuadsPerBlock = kGemmActBlock / 4;
inline constexpr int64_t kOctsPerBlock = kGemmActBlock / 8;

inline float gemm_load_x(const void* x, int32_t dt, int64_t i) {
  return dt == FRT_F32 ? static_cast<const float*>(x)[i]
                       : bf16_to_f32(static_cast<const uint16_t*>(x)[i]);
}

// The bias of panel p's columns (zero past n or without a bias).
inline void gemm_panel_bias(const frt_packed_weight* w, int64_t p, const float* bias, float* out) {
  const int64_t c0 = p * FRT_PANEL;
  for (int64_t j = 0; j < FRT_PANEL; ++j)
    out[j] = (bias != nullptr && c0 + j < w->n) ? bias[c0 + j] : 0.0f;
}

// Calls tile(std::integral_constant<int, R>) for R = rows in 1..4: tiles are templates on R.
template <class Tile>
void with_tile_rows(int64_t rows, Tile&& tile) {
  switch (rows) {
    case 4:
      return tile(std::integral_constant<int, 4>{});
    case 3:
      return tile(std::integral_constant<int, 3>{});
    case 2:
      return tile(std::integral_constant<int, 2>{});
    default:
      return tile(std::integral_constant<int, 1>{});
  }
}

// The int4 tiles are templates on R and on whether the pack has mins: calls
// tile(std::integral_constant<int, R>, std::bool_constant<w has mins>) for R = rows in 1..4.
template <class Tile>
void with_int4_tile(int64_t rows, const frt_packed_weight* w, Tile&& tile) {
  with_tile_rows(rows, [&](auto r) {
    if (w->mins != nullptr)
      tile(r, std::true_type{});
    else
      tile(r, std::false_type{});
  });
}

// Panel p's first super record of an int4_super_gemm weight (FRT_W_INT4_SUPER_GEMM).
inline const uint8_t* super_records(const frt_packed_weight* w, int64_t p) {
  return static_cast<const uint8_t*>(w->scales) + p * (w->k / FRT_SUPER_K) * FRT_SUPER4_RECORD;
}

// Panel p's first super record of an int6_super_gemm weight (FRT_W_INT6_SUPER_GEMM: int8_super's
// records).
inline const uint8_t* super8_records(const frt_packed_weight* w, int64_t p) {
  return static_cast<const uint8_t*>(w->scales) + p * (w->k / FRT_SUPER_K) * FRT_SUPER8_RECORD;
}

// The scalar reference (src/ref/): the generic variant's table entries.
void quantize_row_u7_ref(const void* x, int32_t dt, int64_t k, uint8_t* u, float* scale,
                         int32_t* zero);
void w8a8_rows_tile_4x16_ref(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
                             int64_t rows, const float* bias, float* tile);
void quantize_row_s8_blocks_ref(const void* x, int32_t dt, int64_t k, int8_t* a, float* d);
void w8a8_blocks_tile_4x16_ref(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile);
void w4a8_blocks_tile_4x16_ref(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile);
void w6a8_blocks_tile_4x16_ref(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile);
void gemm_activate_ref(int32_t act, const float* in, float* out, int64_t n);

// The reference's pieces a fast path finishes a row with. Per-row form (Note [W8A8 rows]): the
// row's range, continued over [i, k); its scale, zero point and 1 / scale (false, and the row
// written as a NaN scale over zero bytes, when no finite scale exists); u[i, k) quantized and
// zeros on to the quad boundary.
struct U7Range {
  float lo = 0, hi = 0;
  bool nan = false;
};
void u7_range_ref(const void* x, int32_t dt, int64_t i, int64_t k, U7Range* r);
bool u7_params_ref(const U7Range& r, int64_t k, uint8_t* u, float* scale, int32_t* zero,
                   float* inv);
void u7_quantize_ref(const void* x, int32_t dt, int64_t i, int64_t k, float inv, int32_t z,
                     uint8_t* u);
// Block form (Note [W8A8 blocks]): whether x[i, k) is finite; the row of an x that is not (NaN
// scales over zero bytes); one block [i0, i1) and its scale; zeros from k on to the quad boundary.
bool s8_finite_ref(const void* x, int32_t dt, int64_t i, int64_t k);
void s8_nan_row_ref(int64_t k, int8_t* a, float* d);
void s8_block_ref(const void* x, int32_t dt, int64_t i0, int64_t i1, int8_t* a, float* d);
void s8_pad_ref(int64_t k, int8_t* a);

// The AVX2 paths (src/x86/avx2/).
void quantize_row_u7_avx2(const void* x, int32_t dt, int64_t k, uint8_t* u, float* scale,
                          int32_t* zero);
void w8a8_rows_tile_4x16_avx2(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
                              int64_t rows, const float* bias, float* tile);
void quantize_row_s8_blocks_avx2(const void* x, int32_t dt, int64_t k, int8_t* a, float* d);
void w8a8_blocks_tile_4x16_avx2(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                                int64_t r0, int64_t rows, const float* bias, float* tile);
void w4a8_blocks_tile_4x16_avx2(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                                int64_t r0, int64_t rows, const float* bias, float* tile);
void w6a8_blocks_tile_4x16_avx2(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                                int64_t r0, int64_t rows, const float* bias, float* tile);
void gemm_activate_avx2(int32_t act, const float* in, float* out, int64_t n);

// The zmm paths (src/x86/avx512/; the avx512vnni and amx variants, and their test-only emulations).
void gemm_activate_zmm(int32_t act, const float* in, float* out, int64_t n);
void quantize_row_u7_zmm(const void* x, int32_t dt, int64_t k, uint8_t* u, float* scale,
                         int32_t* zero);
void w8a8_rows_tile_4x16_zmm(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
                             int64_t rows, const float* bias, float* tile);
void quantize_row_s8_blocks_zmm(const void* x, int32_t dt, int64_t k, int8_t* a, float* d);
void w8a8_blocks_tile_4x16_zmm(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile);
void w4a8_blocks_tile_4x16_zmm(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile);
void w6a8_blocks_tile_4x16_zmm(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile);

// The AMX-INT8 tiles (src/x86/amx/; the amx variant, and its test-only emulation).
void w8a8_rows_amx(const frt_packed_weight* w, int64_t p, int64_t np, const QuantRows& q,
                   int64_t r0, int64_t rows, const float* bias, void* y, int32_t y_dtype,
                   int64_t ldy);
void blocks_amx(const frt_packed_weight* w, int64_t p, int64_t np, const BlockRows& q, int64_t r0,
                int64_t rows, const float* bias, void* y, int32_t y_dtype, int64_t ldy);
// The sequence attention on AMX-BF16 tiles (src/x86/amx/attention_amx.cpp).
void attention_amx(const frt_sequence_attention_args* a, const AttentionPack& pack, int64_t i0,
                   int64_t i1);

}  // namespace frt::kern
