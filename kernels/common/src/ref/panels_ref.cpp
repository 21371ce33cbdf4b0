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

namespace {

// out[r][j] = sum over groups of scale(g, j) * sum_i x[r][i] * q[i][j]: the int8 group forms
// differ only in where a group's scale comes from.
template <typename Scale>
void int8g_panel_by(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                    float* out, Scale scale) {
  const int64_t k = w->k, groups = k / w->group;
  const auto* q = static_cast<const int8_t*>(w->qdata) + p * k * FRT_PANEL;
  for (int64_t r = 0; r < m; ++r) {
    for (int j = 0; j < FRT_PANEL; ++j) {
      float acc = 0.0f;
      for (int64_t g = 0; g < groups; ++g) {
        float part = 0.0f;
        for (int64_t i = g * w->group; i < (g + 1) * w->group; ++i)
          part += x[r * ldx + i] * static_cast<float>(q[i * FRT_PANEL + j]);
        acc += part * scale(g, j);
      }
      out[r * FRT_PANEL + j] = acc;
    }
  }
}

}  // namespace

void int8g_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                     float* out) {
  const int64_t s0 = p * (w->k / w->group) * FRT_PANEL;
  int8g_panel_by(w, p, x, ldx, m, out, [&](int64_t g, int j) {
    return scale_at(w->scales, s0 + g * FRT_PANEL + j, w->scale_dtype);
  });
}

void int8s_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                     float* out) {
  const auto* records =
      static_cast<const uint8_t*>(w->scales) + p * (w->k / FRT_SUPER_K) * FRT_SUPER8_RECORD;
  int8g_panel_by(w, p, x, ldx, m, out, [&](int64_t g, int j) {
    const uint8_t* rec = records + (g / FRT_SUPER8_GROUPS) * FRT_SUPER8_RECORD;
    const auto code =
        static_cast<int8_t>(rec[FRT_SUPER8_SC_AT + (g % FRT_SUPER8_GROUPS) * FRT_PANEL + j]);
    return scale_at(rec, j, FRT_F16) * static_cast<float>(code);
  });
}

namespace {

// out[r][j] = sum_i x[r][i] * value(nibble, i, j): the int4 forms differ only in where a
// nibble's scale and min come from.
template <typename Value>
void int4_panel_by(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                   float* out, Value value) {
  const int64_t k = w->k;
  const auto* q = static_cast<const uint8_t*>(w->qdata) + p * (k / 2) * FRT_PANEL;
  for (int64_t r = 0; r < m; ++r) {
    for (int j = 0; j < FRT_PANEL; ++j) {
      float acc = 0.0f;
      for (int64_t i = 0; i < k; ++i) {
        const uint8_t byte = q[(i / 2) * FRT_PANEL + j];
        const int nibble = (i % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
        acc += x[r * ldx + i] * value(static_cast<float>(nibble), i, j);
      }
      out[r * FRT_PANEL + j] = acc;
    }
  }
}

}  // namespace

void int4_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                    const float* /*xsum*/, int64_t m, float* out) {
  const int64_t s0 = p * (w->k / w->group) * FRT_PANEL;
  int4_panel_by(w, p, x, ldx, m, out, [&](float nibble, int64_t i, int j) {
    const int64_t at = s0 + (i / w->group) * FRT_PANEL + j;
    return nibble * scale_at(w->scales, at, w->scale_dtype) + scale_at(w->mins, at, w->scale_dtype);
  });
}

void int4s_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                     const float* /*xsum*/, int64_t m, float* out) {
  const auto* records =
      static_cast<const uint8_t*>(w->scales) + p * (w->k / FRT_SUPER_K) * FRT_SUPER4_RECORD;
  int4_panel_by(w, p, x, ldx, m, out, [&](float nibble, int64_t i, int j) {
    const uint8_t* rec = records + (i / FRT_SUPER_K) * FRT_SUPER4_RECORD;
    const int64_t g = (i % FRT_SUPER_K) / 32;
    const float s =
        scale_at(rec, j, FRT_F16) * static_cast<float>(rec[FRT_SUPER4_SC_AT + g * FRT_PANEL + j]);
    const float o = scale_at(rec + FRT_SUPER4_DMIN_AT, j, FRT_F16) *
                    static_cast<float>(rec[FRT_SUPER4_M_AT + g * FRT_PANEL + j]);
    return nibble * s - o;
  });
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
