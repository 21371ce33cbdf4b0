// Plain scalar panels: the generic variant, and the fallback of every other one. They follow the
// format's definition literally (dequantise, multiply, accumulate in fp32).
#include <frt_kern/panels.h>
#include <frt_kern/util.h>

namespace frt::kern {

void int8_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                    float* out) {
  const int64_t k = w->k;
  const auto* q = static_cast<const int8_t*>(w->qdata) + p * k * FRT_PANEL;
  const float* scale = static_cast<const float*>(w->scales) + p * FRT_PANEL;
  for (int64_t r = 0; r < m; ++r) {
    for (int j = 0; j < FRT_PANEL; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i)
        acc += x[r * ldx + i] * static_cast<float>(q[i * FRT_PANEL + j]);
      out[r * FRT_PANEL + j] = acc * scale[j];
    }
  }
}

void int8g_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                     float* out) {
  const int64_t k = w->k, groups = k / w->group;
  const auto* q = static_cast<const int8_t*>(w->qdata) + p * k * FRT_PANEL;
  const int64_t s0 = p * groups * FRT_PANEL;
  for (int64_t r = 0; r < m; ++r) {
    for (int j = 0; j < FRT_PANEL; ++j) {
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        float part = 0.0f;
        for (int64_t i = g * w->group; i < (g + 1) * w->group; ++i)
          part += x[r * ldx + i] * static_cast<float>(q[i * FRT_PANEL + j]);
        acc += part * scale_at(w->scales, s0 + g * FRT_PANEL + j, w->scale_dtype);
      }
      out[r * FRT_PANEL + j] = acc;
    }
  }
}

void int4_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                    const float* /*xsum*/, int64_t m, float* out) {
  const int64_t k = w->k, groups = k / w->group;
  const auto* q = static_cast<const uint8_t*>(w->qdata) + p * (k / 2) * FRT_PANEL;
  const int64_t s0 = p * groups * FRT_PANEL;
  for (int64_t r = 0; r < m; ++r) {
    for (int j = 0; j < FRT_PANEL; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        const uint8_t byte = q[(i / 2) * FRT_PANEL + j];
        const int nibble = (i % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
        const int64_t at = s0 + (i / w->group) * FRT_PANEL + j;
        const float wv = static_cast<float>(nibble) * scale_at(w->scales, at, w->scale_dtype) +
                         scale_at(w->mins, at, w->scale_dtype);
        acc += x[r * ldx + i] * wv;
      }
      out[r * FRT_PANEL + j] = acc;
    }
  }
}

float dot_f32_ref(const float* x, const float* w, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * w[i];
  return acc;
}

float dot_bf16_ref(const float* x, const uint16_t* w, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * bf16_to_f32(w[i]);
  return acc;
}

}  // namespace frt::kern
