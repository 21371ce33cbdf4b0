// The block form of flashrt/gemm's linear (an int8_gemm pack whose `group` is 32: the decode
// form), scalar: block quantization, the block sums every variant uses, and the 4-row x
// FRT_PANEL tile.
//
// Note [W8A8 blocks]: per-row activation scales (Note [W8A8 rows]) cost a small decoder dearly:
// one outlier channel after the norm sets the scale of the whole row, and SmolLM2's perplexity
// rose 11.6% with them (bench/results/accuracy.json, "earlier_forms"). Here every 32 inputs of a
// row get their own symmetric scale d = amax / 127 and a = nearbyint(x * 127 / amax) in [-127, 127]
// (the scheme llama.cpp's Q8 activation blocks use). The weights are the same symmetric int8 per
// channel. vpmaddubsw needs one unsigned operand: it multiplies |q| by a carrying q's sign
// (vpsignb), and since |q|, |a| <= 127 a pair sums to at most 32258: no int16 saturation.
// The zmm tile (avx512vnni) forms the same sums with vpdpbusd, (q + 128) times a less 128 times
// the block's sum of a, into int32 directly.
// Each block's int32 sum (|sum| <= 32 * 127 * 127) is exact in fp32; the row accumulates
// f += float(sum) * d block by block, and y = f * scale[c] + bias[c].
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>

#include "gemm_tiles.h"

namespace frt::kern {

bool s8_finite_ref(const void* x, int32_t dt, int64_t i, int64_t k) {
  bool finite = true;
  for (; i < k && finite; ++i) finite = std::isfinite(gemm_load_x(x, dt, i));
  return finite;
}

void s8_nan_row_ref(int64_t k, int8_t* a, float* d) {  // no finite scale: outputs come out NaN
  std::fill(d, d + div_up(k, kGemmActBlock), std::nanf(""));
  std::memset(a, 0, static_cast<size_t>(div_up(k, 4) * 4));
}

void s8_block_ref(const void* x, int32_t dt, int64_t i0, int64_t i1, int8_t* a, float* d) {
  float amax = 0;
  for (int64_t j = i0; j < i1; ++j) amax = std::max(amax, std::fabs(gemm_load_x(x, dt, j)));
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  *d = amax / 127.0f;
  for (int64_t j = i0; j < i1; ++j)
    a[j] = static_cast<int8_t>(
        std::clamp(std::nearbyint(gemm_load_x(x, dt, j) * inv), -127.0f, 127.0f));
}

void s8_pad_ref(int64_t k, int8_t* a) {
  for (int64_t j = k; j < div_up(k, 4) * 4; ++j) a[j] = 0;
}

void quantize_row_s8_blocks_ref(const void* x, int32_t dt, int64_t k, int8_t* a, float* d) {
  if (!s8_finite_ref(x, dt, 0, k)) return s8_nan_row_ref(k, a, d);
  for (int64_t b = 0; b < div_up(k, kGemmActBlock); ++b) {
    const int64_t i0 = b * kGemmActBlock;
    s8_block_ref(x, dt, i0, std::min(k, i0 + kGemmActBlock), a, d + b);
  }
  s8_pad_ref(k, a);
}

void block_sums(const int8_t* a, int64_t k, int32_t* sum, int32_t* half) {
  for (int64_t b = 0; b * kGemmActBlock < k; ++b) {
    int32_t s = 0;
    for (int64_t i = b * kGemmActBlock; i < std::min(k, (b + 1) * kGemmActBlock); ++i) {
      if (i == b * kGemmActBlock + kGemmActBlock / 2) half[b] = s;
      s += a[i];
    }
    if (k < b * kGemmActBlock + kGemmActBlock / 2 + 1) half[b] = s;  // a short last block
    sum[b] = s;
  }
}

void w8a8_blocks_tile_4x16_ref(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  const float* sc = static_cast<const float*>(w->scales) + p * FRT_PANEL;
  float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* a = q.a + (r0 + r) * q.lda;
    const float* d = q.d + (r0 + r) * q.ldd;
    float f[FRT_PANEL] = {};
    for (int64_t t0 = 0, b = 0; t0 < kq; t0 += kQuadsPerBlock, ++b) {
      const int64_t t1 = std::min(kq, t0 + kQuadsPerBlock);
      int32_t acc[FRT_PANEL] = {};
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t c = 0; c < FRT_PANEL; ++c)
          for (int64_t j = 0; j < 4; ++j)
            acc[c] += static_cast<int32_t>(a[4 * t + j]) * wp[(t * FRT_PANEL + c) * 4 + j];
      for (int64_t c = 0; c < FRT_PANEL; ++c) f[c] = f[c] + static_cast<float>(acc[c]) * d[b];
    }
    for (int64_t c = 0; c < FRT_PANEL; ++c) tile[r * FRT_PANEL + c] = f[c] * sc[c] + bb[c];
  }
}

}  // namespace frt::kern
