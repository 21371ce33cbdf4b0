// flashrt/gemm: the w8a8 linear for large row counts (DiT tokens, prefill): activations quantized
// per row at run time, int8 weights per channel (FRT_W_INT8_GEMM), an integer GEMM, fp32 epilogue.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>

namespace frt::kern {

inline constexpr int32_t kGemmPhases = 2;  // quantize rows; panels
// Widths past this would leave int32 accumulators and the fp32 column sums inexact.
inline constexpr int64_t kGemmMaxK = 131072;

int32_t gemm_supports_form(const frt_op_desc* d, frt_error* err);
int32_t gemm_supports(const frt_linear_args* a, frt_error* err);
int64_t gemm_workspace(const frt_linear_args* a);
int32_t gemm_run(const frt_linear_args* a, int32_t phase, int32_t ith, int32_t nth, frt_error* err);

// The form checks every op over FRT_W_INT8_GEMM shares: the format, 1..kGemmMaxK wide, f32/bf16.
int32_t gemm_check_form(int32_t wformat, int64_t n, int64_t k, int32_t x_dtype, int32_t y_dtype,
                        frt_error* err);
// Bytes of one quantized row of width k (a multiple of 64, zero past k).
int64_t gemm_row_stride(int64_t k);

// The FFN over FRT_W_INT8_GEMM (FRT_OP_FFN): y = down(act(up(x) + b_up)) + b_down, one phase
// (see Note [GEMM feed-forward] in gemm_ffn.cpp).
inline constexpr int32_t kGemmFfnPhases = 1;
int32_t gemm_ffn_supports_form(const frt_op_desc* d, frt_error* err);
int32_t gemm_ffn_supports(const frt_ffn_args* a, frt_error* err);
int64_t gemm_ffn_workspace(const frt_ffn_args* a);
int32_t gemm_ffn_run(const frt_ffn_args* a, int32_t phase, int32_t ith, int32_t nth,
                     frt_error* err);

// The routed bank of gated experts over the decode forms (FRT_OP_MOE_FFN; int8_gemm with
// activation blocks of 32, int4_gemm and int4_super_gemm g32): gather and quantize slots; gate/up
// per expert and panel; requantize h; down per expert and panel; weighted sums (Note [GEMM MoE] in
// gemm_moe.cpp).
inline constexpr int32_t kGemmMoePhases = 5;
int32_t gemm_moe_supports_form(const frt_op_desc* d, frt_error* err);
int32_t gemm_moe_supports(const frt_moe_args* a, frt_error* err);
int64_t gemm_moe_workspace(const frt_moe_args* a);
int32_t gemm_moe_run(const frt_moe_args* a, int32_t phase, int32_t ith, int32_t nth,
                     frt_error* err);

// Every query of a sequence against every key, bf16, unmasked (FRT_OP_SEQUENCE_ATTENTION; Note
// [Sequence attention] in gemm_attention.cpp): phase 0 packs keys and values for the amx
// variant's tiles, phase 1 runs the work items.
inline constexpr int32_t kSeqAttentionPhases = 2;
int32_t seq_attention_supports_form(const frt_op_desc* d, frt_error* err);
int32_t seq_attention_supports(const frt_sequence_attention_args* a, frt_error* err);
int64_t seq_attention_workspace(const frt_sequence_attention_args* a);
int32_t seq_attention_run(const frt_sequence_attention_args* a, int32_t phase, int32_t ith,
                          int32_t nth, frt_error* err);

// Quantized rows: u8 [m][lda] (lda a multiple of 64, zero past k), and per row its scale and zero
// point. Phase 0 writes them; on the amx variant's row split, phase 1 (Note [AMX row split]).
struct QuantRows {
  uint8_t* u;
  int64_t lda;
  float* scale;
  int32_t* zero;
  // Rows [0, tiled) are in the amx variant's tile order (Note [AMX rows]): each 16-row group's
  // bytes (where its rows would stand) as 1 KiB tiles, one per 64-input step. 0: all row-major.
  int64_t tiled = 0;
};

// Row r of x quantized into q (7-bit asymmetric, Note [W8A8 rows]): row-major, or into tile
// order for r < q.tiled (Note [AMX rows]).
void gemm_quantize_row(const void* x, int32_t x_dtype, int64_t k, const QuantRows& q, int64_t r);
// The rows of an m-row call the amx variant's tiles take (the last multiple of 16): 0 elsewhere
// and at 1..15 rows (Note [AMX rows]).
int64_t gemm_amx_rows(int64_t m);
// Those of them it quantizes into tile order (QuantRows::tiled): 0 for rows wider than its
// stack buffer.
int64_t gemm_amx_tiled_rows(int64_t m, int64_t lda);
// The rows of an m-row call in w's block form the amx variant's tiles take (Note [AMX blocks]):
// as gemm_amx_rows, and 0 for a layout they do not read (int6_super_gemm).
int64_t gemm_amx_block_rows(const frt_packed_weight* w, int64_t m);
// Those of them it quantizes into tile order (BlockRows::tiled): 0 for rows wider than its stack
// buffer.
int64_t gemm_amx_block_tiled_rows(const frt_packed_weight* w, int64_t m, int64_t lda);

// Phase 0 quantizes the rows (7-bit asymmetric, frt_kernel_abi.h, FRT_W_INT8_GEMM), phase 1
// multiplies them by the panels, both through the variant's kGemmTiles (gemm_tiles.h). (On the
// amx variant with a block of rows per thread, phase 0 quantizes only the rows past the last
// multiple of 16 and each thread quantizes the rest of its own in phase 1: Note [AMX row split].)

// The decode form (an int8_gemm pack with group == kGemmActBlock; Note [W8A8 blocks] in
// ref/w8a8_blocks_ref.cpp): activations int8 per block of 32 inputs, symmetric, a scale per block.
inline constexpr int32_t kGemmActBlock = 32;
struct BlockRows {
  int8_t* a;  // [m][lda], zero past k
  int64_t lda;
  float* d;  // [m][ldd] block scales
  int64_t ldd;
  int32_t* sum;   // [m][ldd] sums of a per block (the int4 form's offsets, the zmm int8 flip's)
  int32_t* half;  // [m][ldd] sums of each block's first 16 (the int6 form's group offsets)
  // Rows below this (a multiple of 16) are in tile order instead (Note [AMX blocks]): block b of
  // 16-row group g is 16 x 32 bytes at a + (b * tiled / 16 + g) * 512.
  int64_t tiled = 0;
};
// Bytes of `rows` quantized block rows of width k (int8 rows, block scales, sums, half sums),
// and the BlockRows over them.
int64_t gemm_block_rows_bytes(int64_t rows, int64_t k);
BlockRows gemm_block_view(uint8_t* base, int64_t rows, int64_t k);
// Row r of x quantized into q (Note [W8A8 blocks]) with its block and half-block sums.
void gemm_quantize_block_row(const void* x, int32_t x_dtype, int64_t k, const BlockRows& q,
                             int64_t r);
// The sums of a row's activation blocks (int4's offsets, the zmm int8 tile's flip); scalar, in
// every variant (ref/w8a8_blocks_ref.cpp). The int4 form (FRT_W_INT4_GEMM; Note [W4A8] in
// ref/w4a8_blocks_ref.cpp) reads the same activation blocks and their sums.
void block_sums(const int8_t* a, int64_t k, int32_t* sum, int32_t* half);
// The layouts the w4a8 tiles read: int4_gemm, int4_super_gemm (Q4_K's super records) and their
// five-bit twins int5_gemm (Q5_0, Q5_1) and int5_super_gemm (Q5_K); the w6a8 tile reads
// int6_super_gemm (Q6_K's).
inline bool gemm_int4_format(int32_t wformat) {
  return wformat == FRT_W_INT4_GEMM || wformat == FRT_W_INT4_SUPER_GEMM ||
         wformat == FRT_W_INT5_GEMM || wformat == FRT_W_INT5_SUPER_GEMM;
}
// The int5 layouts (the w4a8 tiles with a plane of fifth bits per block).
inline bool gemm_int5_format(int32_t wformat) {
  return wformat == FRT_W_INT5_GEMM || wformat == FRT_W_INT5_SUPER_GEMM;
}
// The layouts whose scales are int4_super's records.
inline bool gemm_super4_format(int32_t wformat) {
  return wformat == FRT_W_INT4_SUPER_GEMM || wformat == FRT_W_INT5_SUPER_GEMM;
}
// The nibble layouts: the int4 forms and int6_super_gemm (its low nibbles as theirs).
inline bool gemm_nibble_format(int32_t wformat) {
  return gemm_int4_format(wformat) || wformat == FRT_W_INT6_SUPER_GEMM;
}
// The layouts whose rows are quantized per activation block: int8_gemm with group 32, and the
// nibble forms.
inline bool gemm_block_form(const frt_packed_weight* w) {
  return w->group == 32 || gemm_nibble_format(w->format);
}
// A nibble form's name, its group and the multiple its width must be (0 for other formats).
struct NibbleForm {
  const char* name;
  int32_t group;
  int64_t multiple;
};
inline NibbleForm gemm_nibble_form(int32_t wformat) {
  switch (wformat) {
    case FRT_W_INT4_GEMM:
      return {"int4_gemm", 32, 32};
    case FRT_W_INT4_SUPER_GEMM:
      return {"int4_super_gemm", 32, FRT_SUPER_K};
    case FRT_W_INT6_SUPER_GEMM:
      return {"int6_super_gemm", 16, FRT_SUPER_K};
    case FRT_W_INT5_GEMM:
      return {"int5_gemm", 32, 32};
    case FRT_W_INT5_SUPER_GEMM:
      return {"int5_super_gemm", 32, FRT_SUPER_K};
    default:
      return {"", 0, 0};
  }
}
// Writes the valid columns of tile[rows][FRT_PANEL] (panel p) to rows r0.. of y in y_dtype.
void gemm_store_rows(const float* tile, int64_t rows, int64_t r0, int64_t p, int64_t n, void* y,
                     int32_t y_dtype, int64_t ldy);

}  // namespace frt::kern
