// FRT_OP_GATED_DELTA: the gated delta rule (Qwen3-Next's linear attention) token by token, the
// state in fp32.
#include <frt_kern/util.h>

#include <cmath>
#include <cstring>

#include "recurrent_ops.h"

namespace frt::kern {
namespace {

// Note [Column blocks of the state]: every step of the recurrence acts on a value column of S
// alone: S^T k, d, the rank-one update k d^T and S^T q each read and write column c only. So a
// work item is (sequence b, value head h, block of kBlock value columns), and an item runs all
// its tokens in order on a private copy of its block, [k_dim][kBlock] fp32 (16 KiB at k_dim 256,
// L1-resident), read from initial_state once and written to final_state once. Items share
// nothing, so a thread split changes no bit, and final_state may alias initial_state.
// A token is one pass over the block's rows: row i is decayed and updated, then feeds this
// token's S^T q and the next token's S^T k (that token's decay then scales the sum, not S), so
// the block is read once per token, not twice. The sums run in kChains chains (Note [Lanes]) in
// an order fixed by k_dim alone. q and k are prepared again by each of a head's v_dim / kBlock
// items: about 4 k_dim flops against the pass's 8 k_dim kBlock.

inline float load(const void* base, int64_t i, int32_t dt) {
  return dt == FRT_BF16 ? bf16_to_f32(static_cast<const uint16_t*>(base)[i])
                        : static_cast<const float*>(base)[i];
}

// dst[0..n) = src[0..n) in whole vectors, inline: library memcpy calls for these short rows took
// about a sixth of the op's time (perf, 16 heads of 128x128).
void copy_floats(float* dst, const float* src, int64_t n) {
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) std::memcpy(dst + i, src + i, sizeof(Vec));
  for (; i < n; ++i) dst[i] = src[i];
}

// dst[0..n) = the n elements at base + at, inc apart (0: 1), in fp32.
void load_row(const void* base, int64_t at, int32_t dt, int64_t n, float* dst, int64_t inc) {
  if (inc > 1) {  // a strided vector (a host's channel-strided convolution output): gathered
    for (int64_t i = 0; i < n; ++i) dst[i] = load(base, at + i * inc, dt);
  } else if (dt == FRT_BF16) {
    const uint16_t* src = static_cast<const uint16_t*>(base) + at;
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(src[i]);
  } else {
    copy_floats(dst, static_cast<const float*>(base) + at, n);
  }
}

// x *= factor / sqrt(sum x^2 + eps), the sum in kBlock lanes and then across them pairwise.
void l2_normalise(float* x, int64_t n, float eps, float factor) {
  Lanes sum = {};
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock)
    for (int u = 0; u < kRegs; ++u) {
      Vec v;
      std::memcpy(&v, x + i + u * kWidth, sizeof v);
      sum.r[u] += v * v;
    }
  alignas(64) float lanes[kBlock];
  store_lanes(lanes, sum);
  // Pairwise, not a chain of 16 dependent adds.
  for (int half = kBlock / 2; half > 0; half /= 2)
    for (int c = 0; c < half; ++c) lanes[c] += lanes[c + half];
  float ss = lanes[0];
  for (; i < n; ++i) ss += x[i] * x[i];
  const float inv = factor / std::sqrt(ss + eps);
  for (i = 0; i < n; ++i) x[i] *= inv;
}

// Tokens ahead whose rows are prefetched: a token's rows stand heads * dim elements apart, and
// without it the load of v was the hottest instruction of a token (perf).
constexpr int64_t kAhead = 2;

void prefetch_row(const void* base, int64_t at, int64_t n, int32_t dt) {
  const int64_t bytes = dt == FRT_BF16 ? 2 : 4;
  const char* p = static_cast<const char*>(base) + at * bytes;
  for (int64_t i = 0; i < n * bytes; i += 64) __builtin_prefetch(p + i);
  __builtin_prefetch(p + n * bytes - 1);
}

// One token's q and k (of key head kh), normalised and q scaled as the ABI says.
struct Keys {
  alignas(64) float q[kMaxKeyDim];
  alignas(64) float k[kMaxKeyDim];
};

void prepare(const frt_gated_delta_args* a, int64_t b, int64_t t, int64_t kh, Keys& out) {
  const int64_t kd = a->k_dim;
  load_row(a->q, b * a->q_ld[0] + t * a->q_ld[1] + kh * a->q_ld[2], a->x_dtype, kd, out.q,
           a->q_inc);
  load_row(a->k, b * a->k_ld[0] + t * a->k_ld[1] + kh * a->k_ld[2], a->x_dtype, kd, out.k,
           a->k_inc);
  if (a->l2norm) {
    l2_normalise(out.q, kd, a->l2_eps, a->scale);
    l2_normalise(out.k, kd, a->l2_eps, 1.0f);
  } else {
    for (int64_t i = 0; i < kd; ++i) out.q[i] *= a->scale;
  }
}

// kv = sum_i s[i] k[i] over n rows, in kChains chains (rows i mod kChains; a tail in the first).
// The chains are indexed by constants only, so they stay in registers (Note [Lanes]).
void column_dots(const float* s, const float* k, int64_t n, Lanes& kv) {
  Lanes acc[kChains] = {};
  auto row = [&](int64_t i, Lanes& sum) {
    for (int u = 0; u < kRegs; ++u) {
      Vec x;
      std::memcpy(&x, s + i * kBlock + u * kWidth, sizeof x);
      sum.r[u] += x * k[i];
    }
  };
  int64_t i = 0;
  for (; i + kChains <= n; i += kChains)
    for (int j = 0; j < kChains; ++j) row(i + j, acc[j]);
  for (; i < n; ++i) row(i, acc[0]);
  sum_chains(acc);
  kv = acc[0];
}

// One token's pass (Note [Column blocks of the state]): s[i] <- decay s[i] + k[i] d, then
// o = sum_i s[i] q[i] and, with kNext, kv = sum_i s[i] next[i], in chains as column_dots.
template <bool kNext>
void update_rows(float* s, int64_t n, const Keys& cur, const float* next, const Lanes& d,
                 float decay, Lanes& o, Lanes& kv) {
  Lanes po[kChains] = {}, pk[kChains] = {};
  auto row = [&](int64_t i, Lanes& o_sum, Lanes& k_sum) {
    for (int u = 0; u < kRegs; ++u) {
      Vec x;
      std::memcpy(&x, s + i * kBlock + u * kWidth, sizeof x);
      x = decay * x + cur.k[i] * d.r[u];
      std::memcpy(s + i * kBlock + u * kWidth, &x, sizeof x);
      o_sum.r[u] += x * cur.q[i];
      if constexpr (kNext) k_sum.r[u] += x * next[i];
    }
  };
  int64_t i = 0;
  for (; i + kChains <= n; i += kChains)
    for (int j = 0; j < kChains; ++j) row(i + j, po[j], pk[j]);
  for (; i < n; ++i) row(i, po[0], pk[0]);
  sum_chains(po);
  o = po[0];
  if constexpr (kNext) {
    sum_chains(pk);
    kv = pk[0];
  }
}

// One item of Note [Column blocks of the state]: columns [c0, c0 + w) of head h of sequence b.
void run_block(const frt_gated_delta_args* a, int64_t b, int64_t h, int64_t c0, int64_t w) {
  const int64_t kd = a->k_dim, vd = a->v_dim;
  const int64_t kh = h / (a->v_heads / a->k_heads);
  const int32_t dt = a->x_dtype;
  const int64_t v_inc = a->v_inc > 1 ? a->v_inc : 1;
  alignas(64) float s[kMaxKeyDim * kBlock];
  Keys keys[2];
  // Columns past w stay zero: v reads zero there, so d and the update do too.
  std::memset(s, 0, sizeof(float) * kd * kBlock);
  const int64_t state_at = (b * a->v_heads + h) * kd * vd + c0;
  if (a->initial_state != nullptr)
    for (int64_t i = 0; i < kd; ++i)
      std::memcpy(s + i * kBlock, a->initial_state + state_at + i * vd, w * sizeof(float));
  prepare(a, b, 0, kh, keys[0]);
  Lanes kv, o, d;
  column_dots(s, keys[0].k, kd, kv);
  for (int64_t t = 0; t < a->tokens; ++t) {
    const Keys& cur = keys[t % 2];
    Keys& next = keys[(t + 1) % 2];
    const float decay = std::exp(a->g[b * a->g_ld[0] + t * a->g_ld[1] + h]);
    const float beta = load(a->beta, b * a->beta_ld[0] + t * a->beta_ld[1] + h, a->beta_dtype);
    alignas(64) float vt[kBlock] = {};
    load_row(a->v, b * a->v_ld[0] + t * a->v_ld[1] + h * a->v_ld[2] + c0 * v_inc, dt, w, vt, v_inc);
    load_lanes(d, vt);
    for (int u = 0; u < kRegs; ++u) d.r[u] = beta * (d.r[u] - decay * kv.r[u]);
    if (const int64_t f = t + kAhead; f < a->tokens) {
      prefetch_row(a->q, b * a->q_ld[0] + f * a->q_ld[1] + kh * a->q_ld[2], kd, dt);
      prefetch_row(a->k, b * a->k_ld[0] + f * a->k_ld[1] + kh * a->k_ld[2], kd, dt);
      prefetch_row(a->v, b * a->v_ld[0] + f * a->v_ld[1] + h * a->v_ld[2] + c0 * v_inc, w, dt);
    }
    if (t + 1 < a->tokens) {
      prepare(a, b, t + 1, kh, next);
      update_rows<true>(s, kd, cur, next.k, d, decay, o, kv);
    } else {
      update_rows<false>(s, kd, cur, nullptr, d, decay, o, kv);
    }
    alignas(64) float ot[kBlock];
    store_lanes(ot, o);
    const int64_t out_at = ((b * a->tokens + t) * a->v_heads + h) * vd + c0;
    if (dt == FRT_BF16) {
      uint16_t* out = static_cast<uint16_t*>(a->out) + out_at;
      for (int64_t c = 0; c < w; ++c) out[c] = f32_to_bf16(ot[c]);
    } else {
      copy_floats(static_cast<float*>(a->out) + out_at, ot, w);
    }
  }
  for (int64_t i = 0; i < kd; ++i)
    std::memcpy(a->final_state + state_at + i * vd, s + i * kBlock, w * sizeof(float));
}

int32_t refuse(const frt_gated_delta_args* a, frt_error* err, int32_t reason, const char* why) {
  return fail(err, reason,
              "gated delta (batch %lld, tokens %lld, heads %lld/%lld, k_dim %lld, v_dim %lld, "
              "%s, beta %s): %s",
              static_cast<long long>(a->batch), static_cast<long long>(a->tokens),
              static_cast<long long>(a->k_heads), static_cast<long long>(a->v_heads),
              static_cast<long long>(a->k_dim), static_cast<long long>(a->v_dim),
              dtype_name(a->x_dtype), dtype_name(a->beta_dtype), why);
}

bool activation_dtype(int32_t dt) { return dt == FRT_F32 || dt == FRT_BF16; }

}  // namespace

int32_t gated_delta_supports(const frt_gated_delta_args* a, frt_error* err) {
  if (a == nullptr) return fail(err, FRT_REASON_LAYOUT, "gated delta: no arguments");
  if (a->batch < 1 || a->tokens < 1 || a->k_heads < 1 || a->v_heads < 1 || a->k_dim < 1 ||
      a->v_dim < 1)
    return refuse(a, err, FRT_REASON_SHAPE, "every dimension must be at least 1");
  if (a->v_heads % a->k_heads != 0)
    return refuse(a, err, FRT_REASON_SHAPE, "v_heads is not a multiple of k_heads");
  if (a->k_dim > kMaxKeyDim) return refuse(a, err, FRT_REASON_SHAPE, "k_dim above 256");
  if (!activation_dtype(a->x_dtype))
    return refuse(a, err, FRT_REASON_DTYPE, "q, k, v and out must be f32 or bf16");
  if (!activation_dtype(a->beta_dtype))
    return refuse(a, err, FRT_REASON_DTYPE, "beta must be f32 or bf16");
  if (a->q == nullptr || a->k == nullptr || a->v == nullptr || a->g == nullptr ||
      a->beta == nullptr)
    return refuse(a, err, FRT_REASON_LAYOUT, "q, k, v, g and beta are required");
  if (a->final_state == nullptr || a->out == nullptr)
    return refuse(a, err, FRT_REASON_LAYOUT, "final_state and out are required");
  if (!std::isfinite(a->scale)) return refuse(a, err, FRT_REASON_FORMAT, "scale is not finite");
  if (a->q_inc < 0 || a->k_inc < 0 || a->v_inc < 0)
    return refuse(a, err, FRT_REASON_LAYOUT, "a negative element stride");
  // A negative epsilon would take the root of a negative sum for a zero vector.
  if (a->l2norm && !(std::isfinite(a->l2_eps) && a->l2_eps >= 0.0f))
    return refuse(a, err, FRT_REASON_FORMAT, "l2_eps must be finite and at least 0");
  return ok(err);
}

int32_t gated_delta_run(const frt_gated_delta_args* a, int32_t ith, int32_t nth, frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  if (gated_delta_supports(a, err) != FRT_REASON_OK) {
    if (err != nullptr) err->code = FRT_E_INVALID;
    return FRT_E_INVALID;
  }
  const int64_t blocks = div_up(a->v_dim, kBlock);
  const Range r = split(a->batch * a->v_heads * blocks, ith, nth);
  for (int64_t item = r.begin; item < r.end; ++item) {
    const int64_t c0 = item % blocks * kBlock, bh = item / blocks;
    const int64_t w = a->v_dim - c0 < kBlock ? a->v_dim - c0 : kBlock;
    run_block(a, bh / a->v_heads, bh % a->v_heads, c0, w);
  }
  return ok(err);
}

}  // namespace frt::kern
