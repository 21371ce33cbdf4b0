// The int4 form of flashrt/gemm's linear (FRT_W_INT4_GEMM) with activations per block of 32: the
// w4a8 decode form, scalar (the generic variant's tile).
//
// Note [W4A8]: the weights are nibbles q in [0, 15] (W = (q - 8) * s, or q * s + min), in groups
// of 32 inputs that coincide with the activation blocks (Note [W8A8 blocks]: a in [-127, 127],
// scale d per block). Unsigned nibbles are what vpmaddubsw wants as its unsigned operand, so no
// sign trick is needed, and a pair sums to at most 2 * 15 * 127 = 3810: the eight quads of a
// block add up in int16 (|sum| <= 30480) before one vpmaddwd widens them. The offset (8, or the
// min) is applied per block through the block's activation sum s_a:
//   symmetric: f += float(sum a q - 8 s_a) * (s * d)   (the subtraction is exact in int32)
//   with mins: f += float(sum a q) * (s * d);  f += min * (d * float(s_a)).
// Per 32 inputs a row streams 16 bytes of nibbles and 2 of scale (4 with a min): Q4_0's and
// Q4_1's sizes. A column's eight inputs 8o..8o+7 sit in four bytes, inputs i and i + 4 sharing a
// byte (frt_kernel_abi.h): masking the low nibbles of a 64-byte load gives all sixteen columns'
// inputs 8o..8o+3, shifting down the high ones 8o+4..8o+7, each against one broadcast
// activation quad. The zmm tile spends a load, two masks, a shift and two vpdpbusd per 128
// weights (the 3.1 layout, two columns to a byte, took a broadcast load, a variable shift, a mask
// and an activation broadcast per 64); the AVX2 tile reads the two column halves as two ymm.
// int4_super_gemm (GGUF Q4_K) is the with-mins form whose block b takes group b % 8 of super
// record b / 8: scale d * sc and min -(dmin * m), both exact in f32, so a Q4_K super-block
// streams 2048 bytes of nibbles and a 320-byte record per panel (4.625 bits a weight).
#include <frt_kern/util.h>

#include "gemm_tiles.h"

namespace frt::kern {

void w4a8_blocks_tile_4x16_ref(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile) {
  const int64_t blocks = w->k / kGemmActBlock;
  const uint8_t* wp = static_cast<const uint8_t*>(w->qdata) + p * (w->k / 8) * 64;
  const int64_t at0 = p * blocks * FRT_PANEL;
  const bool super = w->format == FRT_W_INT4_SUPER_GEMM;
  const uint8_t* records = super ? super_records(w, p) : nullptr;
  float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* a = q.a + (r0 + r) * q.lda;
    const float* d = q.d + (r0 + r) * q.ldd;
    const int32_t* sa = q.sum + (r0 + r) * q.ldd;
    float f[FRT_PANEL] = {};
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t acc[FRT_PANEL] = {};
      for (int64_t o = b * kOctsPerBlock; o < (b + 1) * kOctsPerBlock; ++o)
        for (int64_t c = 0; c < FRT_PANEL; ++c)
          for (int64_t j = 0; j < 4; ++j) {
            const uint8_t byte = wp[(o * FRT_PANEL + c) * 4 + j];
            acc[c] += (byte & 0x0f) * static_cast<int32_t>(a[8 * o + j]) +
                      (byte >> 4) * static_cast<int32_t>(a[8 * o + 4 + j]);
          }
      for (int64_t c = 0; c < FRT_PANEL; ++c) {
        if (super) {  // group b % 8 of record b / 8: scale d * sc, min -(dmin * m), exact
          const uint8_t* rec = records + (b / FRT_SUPER4_GROUPS) * FRT_SUPER4_RECORD;
          const int64_t g = b % FRT_SUPER4_GROUPS;
          const float s = scale_at(rec, c, FRT_F16) *
                          static_cast<float>(rec[FRT_SUPER4_SC_AT + g * FRT_PANEL + c]);
          const float mn = -(scale_at(rec + FRT_SUPER4_DMIN_AT, c, FRT_F16) *
                             static_cast<float>(rec[FRT_SUPER4_M_AT + g * FRT_PANEL + c]));
          f[c] = f[c] + static_cast<float>(acc[c]) * (s * d[b]);
          f[c] = f[c] + mn * (d[b] * static_cast<float>(sa[b]));
          continue;
        }
        const int64_t at = at0 + b * FRT_PANEL + c;
        const float s = scale_at(w->scales, at, FRT_F16);
        if (w->mins == nullptr) {
          f[c] = f[c] + static_cast<float>(acc[c] - 8 * sa[b]) * (s * d[b]);
        } else {
          f[c] = f[c] + static_cast<float>(acc[c]) * (s * d[b]);
          f[c] = f[c] + scale_at(w->mins, at, FRT_F16) * (d[b] * static_cast<float>(sa[b]));
        }
      }
    }
    for (int64_t c = 0; c < FRT_PANEL; ++c) tile[r * FRT_PANEL + c] = f[c] + bb[c];
  }
}

}  // namespace frt::kern
