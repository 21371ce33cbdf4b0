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

// The quantized rows phase 0 writes: u8 [m][lda] (lda a multiple of 64, zero past k), and per
// row its scale and zero point.
struct QuantRows {
  uint8_t* u;
  int64_t lda;
  float* scale;
  int32_t* zero;
};

// Phase 0 quantizes the rows (7-bit asymmetric, frt_kernel_abi.h, FRT_W_INT8_GEMM), phase 1
// multiplies them by the panels, both through the variant's kGemmTiles (gemm_tiles.h).

// The decode form (an int8_gemm pack with group == kGemmActBlock; Note [W8A8 blocks] in
// ref/w8a8_blocks_ref.cpp): activations int8 per block of 32 inputs, symmetric, a scale per block.
inline constexpr int32_t kGemmActBlock = 32;
struct BlockRows {
  int8_t* a;  // [m][lda], zero past k
  int64_t lda;
  float* d;  // [m][ldd] block scales
  int64_t ldd;
  int32_t* sum;  // [m][ldd] sums of a per block (the int4 form's offsets, the zmm int8 flip's)
};
// The sums of a row's activation blocks (int4's offsets, the zmm int8 tile's flip); scalar, in
// every variant (ref/w8a8_blocks_ref.cpp). The int4 form (FRT_W_INT4_GEMM; Note [W4A8] in
// ref/w4a8_blocks_ref.cpp) reads the same activation blocks and their sums.
void block_sums(const int8_t* a, int64_t k, int32_t* sum);
// The int4 layouts the w4a8 tiles read: int4_gemm, and int4_super_gemm (Q4_K's super records).
inline bool gemm_int4_format(int32_t wformat) {
  return wformat == FRT_W_INT4_GEMM || wformat == FRT_W_INT4_SUPER_GEMM;
}
// Writes the valid columns of tile[rows][FRT_PANEL] (panel p) to rows r0.. of y in y_dtype.
void gemm_store_rows(const float* tile, int64_t rows, int64_t r0, int64_t p, int64_t n, void* y,
                     int32_t y_dtype, int64_t ldy);

}  // namespace frt::kern
