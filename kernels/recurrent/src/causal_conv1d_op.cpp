// FRT_OP_CAUSAL_CONV1D: the short depthwise causal convolution before a linear-attention layer
// (Qwen3-Next, Mamba), prefill (many tokens) and decode (one) alike, with its rolling state.
#include <frt_kern/util.h>

#include <cmath>
#include <cstring>

#include "recurrent_ops.h"

#if defined(__AVX2__)
#include <frt_kern/exp_avx2.h>
#include <immintrin.h>
#endif

namespace frt::kern {
namespace {

// Tokens a block's window holds at once: the window is [kernel - 1 + kChunk][kBlock] fp32.
constexpr int64_t kChunk = 64;

inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t v) { return bf16_to_f32(v); }
inline void from_f32(float v, float* out) { *out = v; }
inline void from_f32(float v, uint16_t* out) { *out = f32_to_bf16(v); }

// x = x / (1 + e^-x) in every lane. With AVX2 the exponentials are exp_avx2.h's, eight at a
// time: one std::exp per element cost more than the convolution.
inline void silu(float* x) {
#if defined(__AVX2__)
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  for (int c = 0; c < kBlock; c += 8) {
    const __m256 v = _mm256_loadu_ps(x + c);
    _mm256_storeu_ps(x + c, _mm256_div_ps(v, _mm256_add_ps(one, exp_ps(_mm256_sub_ps(zero, v)))));
  }
#else
  for (int c = 0; c < kBlock; ++c) x[c] = x[c] / (1.0f + std::exp(-x[c]));
#endif
}

// Channels [c0, c0 + w) of sequence b, elements of type T (float or bf16 bits). The channels are
// the vector lanes (Note [Lanes]), so the loops are the same whichever of channels and tokens is
// the contiguous axis of x, y and the state.
template <typename T>
void run_block(const frt_causal_conv1d_args* a, int64_t b, int64_t c0, int64_t w) {
  const int64_t taps = a->kernel, hist = taps - 1, len = a->state_len;
  const auto* x = static_cast<const T*>(a->x);
  const auto* weight = static_cast<const T*>(a->weight);
  const auto* bias = static_cast<const T*>(a->bias);
  auto* state = static_cast<T*>(a->state);
  auto* y = static_cast<T*>(a->y);
  const int64_t* xl = a->x_ld;
  const int64_t* yl = a->y_ld;
  const int64_t* sl = a->state_ld;
  alignas(64) float wt[kMaxTaps][kBlock] = {};  // wt[j][c] = weight[c0 + c][j]
  alignas(64) float bs[kBlock] = {};
  // Window row r is position t0 - hist + r; lanes past w stay zero throughout.
  alignas(64) float win[(kMaxTaps - 1 + kChunk) * kBlock] = {};
  for (int64_t c = 0; c < w; ++c) {
    for (int64_t j = 0; j < taps; ++j) wt[j][c] = to_f32(weight[(c0 + c) * taps + j]);
    if (bias != nullptr) bs[c] = to_f32(bias[c0 + c]);
  }
  Lanes wl[kMaxTaps], bl;
  for (int64_t j = 0; j < taps; ++j) load_lanes(wl[j], wt[j]);
  load_lanes(bl, bs);
  x += b * xl[0] + c0 * xl[1];
  y += b * yl[0] + c0 * yl[1];
  if (state != nullptr) state += b * sl[0] + c0 * sl[1];
  if (state != nullptr)
    for (int64_t p = 0; p < hist; ++p)
      for (int64_t c = 0; c < w; ++c)
        win[p * kBlock + c] = to_f32(state[c * sl[1] + (len - hist + p) * sl[2]]);
  for (int64_t t0 = 0; t0 < a->tokens; t0 += kChunk) {
    const int64_t n = a->tokens - t0 < kChunk ? a->tokens - t0 : kChunk;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < w; ++c)
        win[(hist + i) * kBlock + c] = to_f32(x[c * xl[1] + (t0 + i) * xl[2]]);
    for (int64_t i = 0; i < n; ++i) {
      Lanes acc = bl;
      for (int64_t j = 0; j < taps; ++j)
        for (int u = 0; u < kRegs; ++u) {
          Vec v;
          std::memcpy(&v, win + (i + j) * kBlock + u * kWidth, sizeof v);
          acc.r[u] += wl[j].r[u] * v;
        }
      alignas(64) float out[kBlock];
      store_lanes(out, acc);
      if (a->act == FRT_ACT_SILU) silu(out);
      for (int64_t c = 0; c < w; ++c) from_f32(out[c], &y[c * yl[1] + (t0 + i) * yl[2]]);
    }
    for (int64_t r = 0; r < hist * kBlock; ++r) win[r] = win[n * kBlock + r];
  }
  if (state == nullptr) return;
  // The state becomes the last len positions of state ++ x, after every read of the old state
  // above. Ascending positions: position p takes p + tokens, which no earlier step overwrote.
  for (int64_t p = 0; p < len; ++p) {
    const int64_t from = p + a->tokens;  // position in state ++ x
    for (int64_t c = 0; c < w; ++c)
      state[c * sl[1] + p * sl[2]] =
          from < len ? state[c * sl[1] + from * sl[2]] : x[c * xl[1] + (from - len) * xl[2]];
  }
}

int32_t refuse(const frt_causal_conv1d_args* a, frt_error* err, int32_t reason, const char* why) {
  return fail(err, reason,
              "causal conv1d (batch %lld, channels %lld, tokens %lld, kernel %lld, state %s%lld, "
              "%s, act %d): %s",
              static_cast<long long>(a->batch), static_cast<long long>(a->channels),
              static_cast<long long>(a->tokens), static_cast<long long>(a->kernel),
              a->state == nullptr ? "none, len " : "len ", static_cast<long long>(a->state_len),
              dtype_name(a->dtype), a->act, why);
}

}  // namespace

int32_t causal_conv1d_supports(const frt_causal_conv1d_args* a, frt_error* err) {
  if (a == nullptr) return fail(err, FRT_REASON_LAYOUT, "causal conv1d: no arguments");
  if (a->batch < 1 || a->channels < 1 || a->tokens < 1 || a->kernel < 1)
    return refuse(a, err, FRT_REASON_SHAPE, "every dimension must be at least 1");
  if (a->kernel > kMaxTaps) return refuse(a, err, FRT_REASON_SHAPE, "more than 16 taps");
  if (a->state != nullptr && a->state_len < a->kernel - 1)
    return refuse(a, err, FRT_REASON_SHAPE, "state_len below kernel - 1");
  if (a->dtype != FRT_F32 && a->dtype != FRT_BF16)
    return refuse(a, err, FRT_REASON_DTYPE, "dtype must be f32 or bf16");
  if (a->act != FRT_ACT_SILU && a->act != -1)
    return refuse(a, err, FRT_REASON_FORMAT, "activation must be silu or none (-1)");
  if (a->x == nullptr || a->weight == nullptr || a->y == nullptr)
    return refuse(a, err, FRT_REASON_LAYOUT, "x, weight and y are required");
  return ok(err);
}

int32_t causal_conv1d_run(const frt_causal_conv1d_args* a, int32_t ith, int32_t nth,
                          frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  if (causal_conv1d_supports(a, err) != FRT_REASON_OK) {
    if (err != nullptr) err->code = FRT_E_INVALID;
    return FRT_E_INVALID;
  }
  const int64_t blocks = div_up(a->channels, kBlock);
  const Range r = split(a->batch * blocks, ith, nth);
  for (int64_t item = r.begin; item < r.end; ++item) {
    const int64_t c0 = item % blocks * kBlock;
    const int64_t w = a->channels - c0 < kBlock ? a->channels - c0 : kBlock;
    if (a->dtype == FRT_BF16)
      run_block<uint16_t>(a, item / blocks, c0, w);
    else
      run_block<float>(a, item / blocks, c0, w);
  }
  return ok(err);
}

}  // namespace frt::kern
