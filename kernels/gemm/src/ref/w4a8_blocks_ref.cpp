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
// streams 2048 bytes of nibbles and a 320-byte record per panel (4.625 bits a weight). The int5
// forms (GGUF Q5_0 / Q5_1 as int5_gemm, Q5_K as int5_super_gemm) are the same sums over
// u = nibble | fifth << 4 in [0, 31] (a symmetric pack's zero 16): per block the nibbles, then a
// 64-byte plane whose byte 4c + j holds column c's fifth bits of inputs 8t + j at bit t and
// 8t + 4 + j at bit 4 + t, so one shift and one mask per half oct merge them for all columns.
#include <frt_kern/util.h>

#include "gemm_tiles.h"

namespace frt::kern {

void w4a8_blocks_tile_4x16_ref(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile) {
  const int64_t blocks = w->k / kGemmActBlock;
  const bool five = gemm_int5_format(w->format);
  const int64_t block_bytes = five ? FRT_INT5_BLOCK : kOctsPerBlock * 64;
  const int32_t offset = five ? 16 : 8;  // the symmetric forms' zero: W = (u - offset) * s
  const uint8_t* wp = static_cast<const uint8_t*>(w->qdata) + p * blocks * block_bytes;
  const int64_t at0 = p * blocks * FRT_PANEL;
  const bool super = gemm_super4_format(w->format);
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
      const uint8_t* wb = wp + b * block_bytes;
      for (int64_t t = 0; t < kOctsPerBlock; ++t)
        for (int64_t c = 0; c < FRT_PANEL; ++c)
          for (int64_t j = 0; j < 4; ++j) {
            const uint8_t byte = wb[(t * FRT_PANEL + c) * 4 + j];
            // The int5 forms' fifth bits: bit t (inputs 8t + j), bit 4 + t (8t + 4 + j).
            const int plane = five ? wb[FRT_INT6_PLANES_AT + 4 * c + j] : 0;
            const int lo = (byte & 0x0f) | ((plane >> t) & 1) << 4;
            const int hi = (byte >> 4) | ((plane >> (4 + t)) & 1) << 4;
            const int64_t o = b * kOctsPerBlock + t;
            acc[c] += lo * static_cast<int32_t>(a[8 * o + j]) +
                      hi * static_cast<int32_t>(a[8 * o + 4 + j]);
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
          f[c] = f[c] + static_cast<float>(acc[c] - offset * sa[b]) * (s * d[b]);
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
