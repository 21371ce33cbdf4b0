// The decode-step primitives. Plain loops over fp32 with the dot products going through the
// panel table (scalar in generic, AVX2 in the others); each op splits its outer dimension
// (rows, heads, output features) across the caller's threads.
#include "decode_ops.h"

#include <frt_kern/panels.h>
#include <frt_kern/util.h>

#include <cmath>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

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

// Note [Grouped attention]: a decode row's attention reads every cached K and V row of a layer
// and does a multiply-add per element for each query head of the row's group. The work is split
// by KV head, so a group's query heads read each K and V row while it is in L1. Scores are
// taken four positions at a time (four independent multiply-add chains, one horizontal sum per
// score at the end: one chain of 16 dependent FMAs per score was latency-bound), and the
// weighted V rows are summed in registers 64 outputs at a time. Per score and output the order
// of additions is fixed by head_dim alone, so a split across threads changes no bit.
namespace {

#if defined(__AVX2__)
inline float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 t = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(t, _mm_movehdup_ps(t)));
}
#endif

// s[j] = scale * dot(q, k + j * ldk) for j < count (count <= 4).
void scores(const float* q, const float* k, int64_t ldk, int64_t count, int64_t d, float scale,
            float* s) {
  int64_t i = 0;
  float tail[4] = {0, 0, 0, 0};
#if defined(__AVX2__)
  __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                   _mm256_setzero_ps()};
  for (; i + 8 <= d; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    for (int64_t j = 0; j < count; ++j)
      acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k + j * ldk + i), acc[j]);
  }
  for (int64_t j = 0; j < count; ++j) tail[j] = hsum(acc[j]);
#endif
  for (; i < d; ++i)
    for (int64_t j = 0; j < count; ++j) tail[j] += q[i] * k[j * ldk + i];
  for (int64_t j = 0; j < count; ++j) s[j] = tail[j] * scale;
}

// out[i] = sum_t p[t] * v[t * ldv + i] for i < d.
void weighted_rows(const float* p, const float* v, int64_t ldv, int64_t positions, int64_t d,
                   float* out) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 64 <= d; i += 64) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t t = 0; t < positions; ++t) {
      const __m256 pt = _mm256_set1_ps(p[t]);
      const float* row = v + t * ldv + i;
      for (int c = 0; c < 8; ++c)
        acc[c] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(row + 8 * c), acc[c]);
    }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(out + i + 8 * c, acc[c]);
  }
  for (; i + 8 <= d; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t t = 0; t < positions; ++t)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v + t * ldv + i), acc);
    _mm256_storeu_ps(out + i, acc);
  }
#endif
  for (; i < d; ++i) {
    float acc = 0.0f;
    for (int64_t t = 0; t < positions; ++t) acc += p[t] * v[t * ldv + i];
    out[i] = acc;
  }
}

// Query heads [h0, h1) of KV head kvh: scores, softmax, weighted V rows.
void attend(const frt_attention_args* a, int64_t kvh, int64_t h0, int64_t h1) {
  const int64_t d = a->head_dim, ld = a->kv_heads * d;
  const float* k = a->k_cache + kvh * d;
  for (int64_t t = 0; t < a->positions; t += 4) {
    const int64_t count = a->positions - t < 4 ? a->positions - t : 4;
    for (int64_t h = h0; h < h1; ++h)
      scores(a->q + h * d, k + t * ld, ld, count, d, a->scale,
             a->scores + h * a->scores_stride + t);
  }
  for (int64_t h = h0; h < h1; ++h) {
    float* s = a->scores + h * a->scores_stride;
    float mx = -INFINITY;
    for (int64_t t = 0; t < a->positions; ++t) mx = s[t] > mx ? s[t] : mx;
    float total = 0.0f;
    for (int64_t t = 0; t < a->positions; ++t) total += (s[t] = std::exp(s[t] - mx));
    const float inv = 1.0f / total;
    for (int64_t t = 0; t < a->positions; ++t) s[t] *= inv;
    weighted_rows(s, a->v_cache + kvh * d, ld, a->positions, d, a->out + h * d);
  }
}

}  // namespace

int32_t attention_run(const frt_attention_args* a, int32_t ith, int32_t nth, frt_error* err) {
  if (a == nullptr || a->kv_heads < 1 || a->heads % a->kv_heads != 0 || a->positions < 1 ||
      a->scores_stride < a->positions)
    return fail(err, FRT_E_INVALID, "attention: bad arguments");
  const int64_t group = a->heads / a->kv_heads;
  if (a->kv_heads >= nth) {  // whole groups per thread
    const Range kv = split(a->kv_heads, ith, nth);
    for (int64_t kvh = kv.begin; kvh < kv.end; ++kvh)
      attend(a, kvh, kvh * group, (kvh + 1) * group);
  } else {  // fewer KV heads than threads: split the query heads
    const Range heads = split(a->heads, ith, nth);
    for (int64_t h = heads.begin; h < heads.end; ++h) attend(a, h / group, h, h + 1);
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
