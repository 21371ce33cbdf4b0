// GGUF Q6_K's values in flashrt/gemm's linear (FRT_W_INT6_SUPER_GEMM) against activation blocks
// of 32: scalar (the generic variant's tile).
//
// Note [W6A8]: the weights are u = q + 32 in [0, 63] (six bits: W = (u - 32) * s), a block of 32
// inputs holding two of Q6_K's groups of 16, each with its own scale s = d * sc from the
// super-block's record (exact in f32). Per block a panel streams 256 bytes of low nibbles, laid
// out as the int4 form's four octs, and two 64-byte planes of the top two bits: byte 4j + l of
// a plane holds, in bits 2t..2t+1, column j's input 8t + l (first plane) or 8t + 4 + l (second),
// so oct t's top bits come out of one plane by one shift and one mask for all sixteen columns,
// and (nibble | top << 4) is u in a byte, vpdpbusd's unsigned operand. Per group the products
// sum in int32 (|sum| <= 16 * 63 * 127), the offset 32 is taken off through the group's
// activation sum (phase 0 writes each block's first-16 sum beside its sum), exactly, and the
// group adds float(sum a u - 32 s_a) * (s * d) to the column, the first group then the second:
// 6.5625 bits a weight, the file's, where the int8_super form streams 8.5625.
#include <frt_kern/util.h>

#include "gemm_tiles.h"

namespace frt::kern {

void w6a8_blocks_tile_4x16_ref(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile) {
  const int64_t blocks = w->k / kGemmActBlock;
  const uint8_t* wp = static_cast<const uint8_t*>(w->qdata) + p * blocks * FRT_INT6_BLOCK;
  const uint8_t* records = super8_records(w, p);
  float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* a = q.a + (r0 + r) * q.lda;
    const float* d = q.d + (r0 + r) * q.ldd;
    const int32_t* sa = q.sum + (r0 + r) * q.ldd;
    const int32_t* ha = q.half + (r0 + r) * q.ldd;
    float f[FRT_PANEL] = {};
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* wb = wp + b * FRT_INT6_BLOCK;
      int32_t acc[2][FRT_PANEL] = {};
      for (int64_t t = 0; t < 4; ++t)
        for (int64_t c = 0; c < FRT_PANEL; ++c)
          for (int64_t l = 0; l < 4; ++l) {
            const uint8_t byte = wb[64 * t + 4 * c + l];
            const int top0 = (wb[FRT_INT6_PLANES_AT + 4 * c + l] >> (2 * t)) & 3;
            const int top1 = (wb[FRT_INT6_PLANES_AT + 64 + 4 * c + l] >> (2 * t)) & 3;
            acc[t / 2][c] +=
                ((byte & 0x0f) | top0 << 4) * static_cast<int32_t>(a[32 * b + 8 * t + l]) +
                ((byte >> 4) | top1 << 4) * static_cast<int32_t>(a[32 * b + 8 * t + 4 + l]);
          }
      const uint8_t* rec = records + (b / FRT_SUPER4_GROUPS) * FRT_SUPER8_RECORD;
      const int64_t g = 2 * (b % FRT_SUPER4_GROUPS);
      for (int64_t c = 0; c < FRT_PANEL; ++c) {
        const float unit = scale_at(rec, c, FRT_F16);
        const float s0 = unit * static_cast<float>(
                                    static_cast<int8_t>(rec[FRT_SUPER8_SC_AT + g * FRT_PANEL + c]));
        const float s1 = unit * static_cast<float>(static_cast<int8_t>(
                                    rec[FRT_SUPER8_SC_AT + (g + 1) * FRT_PANEL + c]));
        f[c] = f[c] + static_cast<float>(acc[0][c] - 32 * ha[b]) * (s0 * d[b]);
        f[c] = f[c] + static_cast<float>(acc[1][c] - 32 * (sa[b] - ha[b])) * (s1 * d[b]);
      }
    }
    for (int64_t c = 0; c < FRT_PANEL; ++c) tile[r * FRT_PANEL + c] = f[c] + bb[c];
  }
}

}  // namespace frt::kern
