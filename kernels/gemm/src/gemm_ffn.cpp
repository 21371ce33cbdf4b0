// flashrt/gemm's feed-forward: y = down(act(up(x) + b_up)) + b_down over FRT_W_INT8_GEMM weights.
//
// Note [GEMM feed-forward]: the op runs in one phase, over blocks of rows. A thread takes a
// contiguous run of row blocks and, for each block, (1) quantizes its x rows (Note [W8A8 rows]),
// (2) runs the up GEMM panel by panel with the bias added in the tile's epilogue and the
// activation applied to the tile while it is in L1, into an fp32 hidden block, (3) requantizes
// each hidden row (same 7-bit form; a row's scale needs all its columns, so the block is whole
// first), (4) runs the down GEMM with its bias and writes y. The hidden block (block rows x the
// intermediate width) never leaves the thread's slot of the workspace, so it is written and read
// back while cache-resident, where two projection seats with a host activation between them take
// the whole [rows, intermediate] tensor through memory and torch. Inside a block each weight
// panel is reused by every 4-row tile of the block.
//
// The workspace holds one slot per thread that can get work, up to kMaxSlots (the ABI's
// workspace() does not know the thread count); threads past that get no block. Pages of slots
// no thread touches are never backed.
//
// Every variant computes the same bits: the integer GEMM and quantization are shared with the
// linear op (gemm_kernels.cpp), and the activation here is one definition written twice, with the
// same IEEE operations in the same order (no FMA, built with -ffp-contract=off): AVX2 eight at a
// time, the scalar mirror for the generic variant and for tails. It is a rational function of
// one exp (Cephes' range reduction and polynomial):
//   silu(g) = g / (1 + e^-g),  gelu_tanh(g) = g / (1 + e^-2u),  u = sqrt(2/pi) (g + 0.044715 g^3)
//   gelu(g) = 0.5 g (1 + erf(g / sqrt 2)), erf by Abramowitz & Stegun 7.1.26 (|err| <= 1.5e-7)
// A NaN input stays NaN (the clamps keep the input on an unordered compare).
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "gemm_op.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace frt::kern {
namespace {

constexpr int64_t kBlockRows = 32;  // rows per block (the hidden block: 32 x intermediate fp32)
constexpr int64_t kMaxSlots = 32;   // threads that can get blocks

// exp's constants: clamps that keep 2^n normal and finite, ln 2 in two parts, the polynomial.
constexpr float kExpHi = 88.0f, kExpLo = -87.0f, kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
constexpr float kP[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                         4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};
constexpr float kInvSqrt2 = 0.7071067811865476f, kTwoSqrt2OverPi = 1.5957691216057308f;
constexpr float kCubic = 0.044715f, kAsP = 0.3275911f;
constexpr float kAs[5] = {1.061405429f, -1.453152027f, 1.421413741f, -0.284496736f, 0.254829592f};

float exp1(float x) {
  x = kExpHi < x ? kExpHi : x;  // as _mm256_min_ps(hi, x): NaN stays
  x = kExpLo > x ? kExpLo : x;  // as _mm256_max_ps(lo, x)
  const float fx = std::floor(x * kLog2e + 0.5f);
  x = x - fx * kLn2Hi;
  x = x - fx * kLn2Lo;
  float y = kP[0];
  for (int i = 1; i < 6; ++i) y = y * x + kP[i];
  y = y * (x * x) + (x + 1.0f);
  if (std::isnan(fx)) return y;  // NaN: no exponent to build
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(fx) + 127) << 23;
  float pow2;
  std::memcpy(&pow2, &bits, 4);
  return y * pow2;
}

float act1(int32_t act, float g) {
  if (act == FRT_ACT_GELU) {
    const float x = g * kInvSqrt2;
    const float ax = std::fabs(x);
    const float t = 1.0f / (kAsP * ax + 1.0f);
    float poly = kAs[0];
    for (int i = 1; i < 5; ++i) poly = poly * t + kAs[i];
    poly = poly * t;
    const float erf_abs = 1.0f - poly * exp1(0.0f - ax * ax);
    const float erf = std::signbit(x) ? -erf_abs : erf_abs;
    return (0.5f * g) * (1.0f + erf);
  }
  float z = g;  // silu
  if (act == FRT_ACT_GELU_TANH) z = kTwoSqrt2OverPi * (kCubic * ((g * g) * g) + g);
  return g / (1.0f + exp1(0.0f - z));
}

#if defined(__AVX2__)
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(kExpLo), _mm256_min_ps(_mm256_set1_ps(kExpHi), x));
  const __m256 fx = _mm256_floor_ps(
      _mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _mm256_set1_ps(0.5f)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(kLn2Hi)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(fx, _mm256_set1_ps(kLn2Lo)));
  __m256 y = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) y = _mm256_add_ps(_mm256_mul_ps(y, x), _mm256_set1_ps(kP[i]));
  y = _mm256_add_ps(_mm256_mul_ps(y, _mm256_mul_ps(x, x)), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
  const __m256i n = _mm256_add_epi32(_mm256_cvttps_epi32(fx), _mm256_set1_epi32(127));
  return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(n, 23)));
}

inline __m256 act8(int32_t act, __m256 g) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  if (act == FRT_ACT_GELU) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 x = _mm256_mul_ps(g, _mm256_set1_ps(kInvSqrt2));
    const __m256 ax = _mm256_andnot_ps(sign, x);
    const __m256 t =
        _mm256_div_ps(one, _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(kAsP), ax), one));
    __m256 poly = _mm256_set1_ps(kAs[0]);
    for (int i = 1; i < 5; ++i)
      poly = _mm256_add_ps(_mm256_mul_ps(poly, t), _mm256_set1_ps(kAs[i]));
    poly = _mm256_mul_ps(poly, t);
    const __m256 e = exp8(_mm256_sub_ps(zero, _mm256_mul_ps(ax, ax)));
    const __m256 erf_abs = _mm256_sub_ps(one, _mm256_mul_ps(poly, e));
    const __m256 erf = _mm256_xor_ps(erf_abs, _mm256_and_ps(sign, x));
    return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), g), _mm256_add_ps(one, erf));
  }
  __m256 z = g;
  if (act == FRT_ACT_GELU_TANH) {
    const __m256 g3 = _mm256_mul_ps(_mm256_mul_ps(g, g), g);
    z = _mm256_mul_ps(_mm256_set1_ps(kTwoSqrt2OverPi),
                      _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(kCubic), g3), g));
  }
  return _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_sub_ps(zero, z))));
}
#endif

// out[i] = act(in[i]) for i < n.
void activate(int32_t act, const float* in, float* out, int64_t n) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, act8(act, _mm256_loadu_ps(in + i)));
#endif
  for (; i < n; ++i) out[i] = act1(act, in[i]);
}

bool known_act(int32_t act) {
  return act == FRT_ACT_SILU || act == FRT_ACT_GELU || act == FRT_ACT_GELU_TANH;
}

// A form check of one of the two weights, its message prefixed with which.
int32_t check_part(const char* what, int32_t wformat, int64_t n, int64_t k, int32_t x_dtype,
                   int32_t y_dtype, frt_error* err) {
  const int32_t r = gemm_check_form(wformat, n, k, x_dtype, y_dtype, err);
  if (r != FRT_REASON_OK && err != nullptr) {
    char inner[200];
    std::memcpy(inner, err->message, sizeof inner - 1);
    inner[sizeof inner - 1] = '\0';
    std::snprintf(err->message, sizeof err->message, "ffn %s: %.200s", what, inner);
  }
  return r;
}

// One thread's slot: the block's quantized x rows, its fp32 hidden rows, their quantized form.
struct Slot {
  QuantRows xq, hq;
  float* h;
  int64_t ldh;  // floats per hidden row: whole up panels
};

struct SlotLayout {
  int64_t xu, xs, h, hu, hs, bytes, ldh;
};

SlotLayout slot_layout(const frt_ffn_args* a) {
  SlotLayout l{};
  l.ldh = div_up(a->up->n, FRT_PANEL) * FRT_PANEL;
  const int64_t params = align64(kBlockRows * 4);  // one float or int32 per row
  l.xu = 0;
  l.xs = l.xu + align64(kBlockRows * gemm_row_stride(a->up->k));
  l.h = l.xs + 2 * params;
  l.hu = l.h + align64(kBlockRows * l.ldh * 4);
  l.hs = l.hu + align64(kBlockRows * gemm_row_stride(a->up->n));
  l.bytes = l.hs + 2 * params;
  return l;
}

int64_t slots_for(int64_t m) { return std::min(kMaxSlots, div_up(m, 4)); }

Slot slot_at(const frt_ffn_args* a, int32_t i) {
  const SlotLayout l = slot_layout(a);
  auto* base = static_cast<uint8_t*>(a->workspace) + i * l.bytes;
  const int64_t params = align64(kBlockRows * 4);
  Slot s{};
  s.xq = {base + l.xu, gemm_row_stride(a->up->k), reinterpret_cast<float*>(base + l.xs),
          reinterpret_cast<int32_t*>(base + l.xs + params)};
  s.hq = {base + l.hu, gemm_row_stride(a->up->n), reinterpret_cast<float*>(base + l.hs),
          reinterpret_cast<int32_t*>(base + l.hs + params)};
  s.h = reinterpret_cast<float*>(base + l.h);
  s.ldh = l.ldh;
  return s;
}

// Rows [r0, r0 + rows) of the call, rows <= kBlockRows, through the slot.
void run_block(const frt_ffn_args* a, const Slot& s, int64_t r0, int64_t rows) {
  const frt_packed_weight *up = a->up, *down = a->down;
  const int64_t xsize = a->x_dtype == FRT_F32 ? 4 : 2;
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(static_cast<const char*>(a->x) + (r0 + r) * a->ldx * xsize, a->x_dtype, up->k,
                 s.xq.u + r * s.xq.lda, s.xq.scale + r, s.xq.zero + r);
  alignas(64) float tile[4 * FRT_PANEL];
  const int64_t up_panels = div_up(up->n, FRT_PANEL);
  for (int64_t p = 0; p < up_panels; ++p)
    for (int64_t t = 0; t < rows; t += 4) {
      const int64_t tr = std::min<int64_t>(4, rows - t);
      gemm_tile(up, p, s.xq, t, tr, a->up_bias, tile);
      for (int64_t r = 0; r < tr; ++r)
        activate(a->act, tile + r * FRT_PANEL, s.h + (t + r) * s.ldh + p * FRT_PANEL, FRT_PANEL);
    }
  for (int64_t r = 0; r < rows; ++r)
    quantize_row(s.h + r * s.ldh, FRT_F32, up->n, s.hq.u + r * s.hq.lda, s.hq.scale + r,
                 s.hq.zero + r);
  const int64_t down_panels = div_up(down->n, FRT_PANEL);
  for (int64_t p = 0; p < down_panels; ++p)
    for (int64_t t = 0; t < rows; t += 4) {
      const int64_t tr = std::min<int64_t>(4, rows - t);
      gemm_tile(down, p, s.hq, t, tr, a->down_bias, tile);
      gemm_store_rows(tile, tr, r0 + t, p, down->n, a->y, a->y_dtype, a->ldy);
    }
}

}  // namespace

int32_t gemm_ffn_supports_form(const frt_op_desc* d, frt_error* err) {
  if (!known_act(d->act))
    return fail(err, FRT_REASON_FORMAT, "gemm ffn: activation %d not in {silu, gelu, gelu_tanh}",
                d->act);
  if (d->rows_max < 1)
    return fail(err, FRT_REASON_ROWS_OUT_OF_BAND, "gemm ffn: rows up to %lld",
                static_cast<long long>(d->rows_max));
  if (int32_t r = check_part("up", d->wformat, d->inner, d->k, d->x_dtype, d->y_dtype, err);
      r != FRT_REASON_OK)
    return r;
  return check_part("down", d->wformat, d->n, d->inner, d->x_dtype, d->y_dtype, err);
}

int32_t gemm_ffn_supports(const frt_ffn_args* a, frt_error* err) {
  if (a == nullptr || a->up == nullptr || a->down == nullptr)
    return fail(err, FRT_REASON_FORMAT, "gemm ffn: no arguments");
  if (a->gate != nullptr)
    return fail(err, FRT_REASON_FORMAT, "gemm ffn: ungated, gate must be NULL");
  if (!known_act(a->act))
    return fail(err, FRT_REASON_FORMAT, "gemm ffn: activation %d not in {silu, gelu, gelu_tanh}",
                a->act);
  const frt_packed_weight *up = a->up, *down = a->down;
  if (int32_t r = check_part("up", up->format, up->n, up->k, a->x_dtype, a->y_dtype, err);
      r != FRT_REASON_OK)
    return r;
  if (int32_t r = check_part("down", down->format, down->n, down->k, a->x_dtype, a->y_dtype, err);
      r != FRT_REASON_OK)
    return r;
  if (down->k != up->n)
    return fail(err, FRT_REASON_SHAPE, "gemm ffn: up %lldx%lld, down %lldx%lld do not chain",
                static_cast<long long>(up->n), static_cast<long long>(up->k),
                static_cast<long long>(down->n), static_cast<long long>(down->k));
  for (const frt_packed_weight* w : {up, down})
    if (w->qdata == nullptr || w->scales == nullptr || w->mins == nullptr)
      return fail(err, FRT_REASON_FORMAT,
                  "gemm ffn: int8_gemm weight without data, scales or sums");
  if (a->m < 1)
    return fail(err, FRT_REASON_ROWS_OUT_OF_BAND, "gemm ffn: rows M=%lld",
                static_cast<long long>(a->m));
  if (a->x == nullptr || a->y == nullptr)
    return fail(err, FRT_REASON_LAYOUT, "gemm ffn: missing input or output");
  if (a->ldx < up->k || a->ldy < down->n)
    return fail(err, FRT_REASON_LAYOUT,
                "gemm ffn: row strides %lld/%lld below widths k=%lld n=%lld",
                static_cast<long long>(a->ldx), static_cast<long long>(a->ldy),
                static_cast<long long>(up->k), static_cast<long long>(down->n));
  return ok(err);
}

int64_t gemm_ffn_workspace(const frt_ffn_args* a) { return slots_for(a->m) * slot_layout(a).bytes; }

int32_t gemm_ffn_run(const frt_ffn_args* a, int32_t phase, int32_t ith, int32_t nth,
                     frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  if (phase != 0) return fail(err, FRT_E_INVALID, "gemm ffn has no phase %d", phase);
  if (a->workspace == nullptr) return fail(err, FRT_E_INVALID, "no workspace");
  const int64_t used = std::min<int64_t>(nth, slots_for(a->m));
  if (ith >= used) return ok(err);
  // Blocks of at most kBlockRows, as many as needed to give every used thread a share.
  const int64_t block = std::clamp<int64_t>(div_up(div_up(a->m, used), 4) * 4, 4, kBlockRows);
  const Range blocks = split(div_up(a->m, block), ith, static_cast<int32_t>(used));
  const Slot s = slot_at(a, ith);
  for (int64_t b = blocks.begin; b < blocks.end; ++b) {
    const int64_t r0 = b * block;
    run_block(a, s, r0, std::min(block, a->m - r0));
  }
  return ok(err);
}

}  // namespace frt::kern
