// The decode-step primitives. Plain loops over fp32 with the dot products going through the
// panel table (scalar in generic, AVX2 in the others); each op splits its outer dimension
// (rows, heads, output features) across the caller's threads.
#include "decode_ops.h"

#include <frt_kern/panels.h>
#include <frt_kern/util.h>

#include <cmath>

namespace frt::kern {

int32_t rmsnorm_run(const frt_rmsnorm_args* a, int32_t ith, int32_t nth, frt_error* err) {
  if (a == nullptr || a->x == nullptr || a->y == nullptr || a->weight == nullptr || a->width < 1)
    return fail(err, FRT_E_INVALID, "rmsnorm: bad arguments");
  for (int64_t r = ith; r < a->rows; r += nth) {
    const float* x = a->x + r * a->ldx;
    float* y = a->y + r * a->ldy;
    float ss = 0.0f;
    for (int64_t i = 0; i < a->width; ++i) ss += x[i] * x[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(a->width) + a->eps);
    for (int64_t i = 0; i < a->width; ++i) y[i] = a->weight[i] * (x[i] * inv);
  }
  return ok(err);
}

int32_t rotary_run(const frt_rotary_args* a, int32_t ith, int32_t nth, frt_error* err) {
  if (a == nullptr || a->x == nullptr || a->head_dim % 2 != 0)
    return fail(err, FRT_E_INVALID, "rotary: bad arguments (head_dim must be even)");
  const int64_t half = a->head_dim / 2;
  for (int64_t h = ith; h < a->heads; h += nth) {
    float* v = a->x + h * a->head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float x1 = v[i], x2 = v[i + half];
      v[i] = x1 * a->cos[i] - x2 * a->sin[i];
      v[i + half] = x2 * a->cos[i] + x1 * a->sin[i];
    }
  }
  return ok(err);
}

int32_t attention_run(const frt_attention_args* a, int32_t ith, int32_t nth, frt_error* err) {
  if (a == nullptr || a->kv_heads < 1 || a->heads % a->kv_heads != 0 || a->positions < 1 ||
      a->scores_stride < a->positions)
    return fail(err, FRT_E_INVALID, "attention: bad arguments");
  const int64_t group = a->heads / a->kv_heads, d = a->head_dim, ld = a->kv_heads * d;
  const Range heads = split(a->heads, ith, nth);
  for (int64_t h = heads.begin; h < heads.end; ++h) {
    const float* q = a->q + h * d;
    const int64_t kvh = h / group;
    float* s = a->scores + h * a->scores_stride;
    float mx = -INFINITY;
    for (int64_t t = 0; t < a->positions; ++t) {
      s[t] = kPanels.dot_f32(q, a->k_cache + t * ld + kvh * d, d) * a->scale;
      mx = s[t] > mx ? s[t] : mx;
    }
    float total = 0.0f;
    for (int64_t t = 0; t < a->positions; ++t) total += (s[t] = std::exp(s[t] - mx));
    const float inv = 1.0f / total;
    float* out = a->out + h * d;
    for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
    for (int64_t t = 0; t < a->positions; ++t) {
      const float p = s[t] * inv;
      const float* v = a->v_cache + t * ld + kvh * d;
      for (int64_t i = 0; i < d; ++i) out[i] += p * v[i];
    }
  }
  return ok(err);
}

int32_t dense_run(const frt_dense_args* a, int32_t ith, int32_t nth, frt_error* err) {
  if (a == nullptr || a->x == nullptr || a->w == nullptr || a->y == nullptr || a->ldw < a->k ||
      (a->w_dtype != FRT_F32 && a->w_dtype != FRT_BF16) || a->m < 1 || a->m > FRT_MAX_ROWS)
    return fail(err, FRT_E_INVALID, "dense: bad arguments");
  const Range cols = split(a->n, ith, nth);
  for (int64_t c = cols.begin; c < cols.end; ++c) {
    for (int64_t r = 0; r < a->m; ++r) {
      const float* x = a->x + r * a->ldx;
      float v = a->w_dtype == FRT_F32
                    ? kPanels.dot_f32(x, static_cast<const float*>(a->w) + c * a->ldw, a->k)
                    : kPanels.dot_bf16(x, static_cast<const uint16_t*>(a->w) + c * a->ldw, a->k);
      if (a->bias != nullptr) v += a->bias[c];
      a->y[r * a->ldy + c] = v;
    }
  }
  return ok(err);
}

}  // namespace frt::kern
