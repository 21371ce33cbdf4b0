// The per-row form of flashrt/gemm's linear, scalar (the generic variant, and the pieces the fast
// paths finish a row with): 7-bit row quantization and the 4-row x FRT_PANEL integer tile.
//
// Note [W8A8 rows]: activations are quantized per row, asymmetric, to seven bits (u in 0..127;
// frt_kernel_abi.h, FRT_W_INT8_GEMM). vpmaddubsw multiplies u8 by s8 and adds neighbouring
// pairs in int16 with saturation: with eight-bit u (up to 255) a pair reaches 2 * 255 * 127 and
// saturates, with seven bits 2 * 127 * 127 = 32258 fits, so the int16 step is exact. (fbgemm's
// "reduce_range" makes the same choice on CPUs without VNNI.) vpdpbusd (the zmm tile) multiplies
// u8 by s8 into int32 with no int16 step: the same sums. One zmm holds a whole quad of the panel
// (16 columns x 4 k, 64 bytes), so a row's quad is one instruction. The zero point z is removed
// after the integer product: sum_i (u_i - z) q_ci = sum_i u_i q_ci - z * colsum_c.
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>

#include "gemm_tiles.h"

namespace frt::kern {
namespace {

inline uint8_t quantize_one(float v, float inv, int32_t z) {
  const float u = std::nearbyint(v * inv) + static_cast<float>(z);
  return static_cast<uint8_t>(std::clamp(u, 0.0f, 127.0f));
}

// The epilogue every path computes: y = float(acc - z * colsum) * (s_x * scale) + bias.
inline float finish(int32_t acc, int32_t z, int32_t colsum, float sx, float sc, float b) {
  return static_cast<float>(acc - z * colsum) * (sx * sc) + b;
}

}  // namespace

void u7_range_ref(const void* x, int32_t dt, int64_t i, int64_t k, U7Range* r) {
  for (; i < k; ++i) {
    const float v = gemm_load_x(x, dt, i);
    r->lo = std::min(r->lo, v), r->hi = std::max(r->hi, v);
    r->nan |= std::isnan(v);
  }
}

bool u7_params_ref(const U7Range& r, int64_t k, uint8_t* u, float* scale, int32_t* zero,
                   float* inv) {
  if (r.nan || !std::isfinite(r.hi - r.lo)) {  // no finite scale: the row's outputs come out NaN
    *scale = std::nanf("");
    *zero = 0;
    std::memset(u, 0, static_cast<size_t>(div_up(k, 4) * 4));
    return false;
  }
  float s = (r.hi - r.lo) / 127.0f;
  if (!(s > 0)) s = 1.0f;
  *inv = 1.0f / s;
  *scale = s;
  *zero = static_cast<int32_t>(std::clamp(std::nearbyint(-r.lo * *inv), 0.0f, 127.0f));
  return true;
}

void u7_quantize_ref(const void* x, int32_t dt, int64_t i, int64_t k, float inv, int32_t z,
                     uint8_t* u) {
  for (; i < k; ++i) u[i] = quantize_one(gemm_load_x(x, dt, i), inv, z);
  for (; i < div_up(k, 4) * 4; ++i) u[i] = 0;
}

void quantize_row_u7_ref(const void* x, int32_t dt, int64_t k, uint8_t* u, float* scale,
                         int32_t* zero) {
  U7Range r;
  u7_range_ref(x, dt, 0, k, &r);
  float inv;
  if (!u7_params_ref(r, k, u, scale, zero, &inv)) return;
  u7_quantize_ref(x, dt, 0, k, inv, *zero, u);
}

void w8a8_rows_tile_4x16_ref(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
                             int64_t rows, const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  float b[FRT_PANEL];
  gemm_panel_bias(w, p, bias, b);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* a = q.u + (r0 + r) * q.lda;
    int32_t acc[FRT_PANEL] = {};
    for (int64_t t = 0; t < kq; ++t)
      for (int64_t c = 0; c < FRT_PANEL; ++c)
        for (int64_t j = 0; j < 4; ++j)
          acc[c] += static_cast<int32_t>(a[4 * t + j]) * wp[(t * FRT_PANEL + c) * 4 + j];
    for (int64_t c = 0; c < FRT_PANEL; ++c)
      tile[r * FRT_PANEL + c] =
          finish(acc[c], q.zero[r0 + r],
                 static_cast<int32_t>(static_cast<const float*>(w->mins)[p * FRT_PANEL + c]),
                 q.scale[r0 + r], static_cast<const float*>(w->scales)[p * FRT_PANEL + c], b[c]);
  }
}

}  // namespace frt::kern
