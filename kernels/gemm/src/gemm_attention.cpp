// flashrt/gemm's sequence attention (FRT_OP_SEQUENCE_ATTENTION, kernel ABI 4.9): every query of
// a sequence against every key, bf16 in and out, no mask. The checks, the packs the tiles read
// and the portable path every variant has; the amx variant's tiles are x86/amx/attention_amx.cpp.
#include "gemm_attention.h"

#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gemm_op.h"
#include "gemm_tiles.h"

namespace frt::kern {

// Note [Sequence attention]: a work item is one sequence, one head and sixteen queries; a thread
// takes a contiguous share of the items, and an item's arithmetic does not depend on which thread
// runs it or on how many there are (the same bits at any thread count). Keys go by in blocks of
// kAttnKeyBlock with an online softmax: the scores of a block (fp32, in base 2), the running
// maximum, the weights 2^(score - maximum) summed unrounded into the denominator, the output's
// running sum rescaled when the maximum moves, and out = sum / denominator rounded once to bf16.
// Two paths compute it:
//   - the portable one (every variant; the amx variant's past kAttnTileMaxHeadDim): fp32
//     products of the widened bf16 values, the weights unrounded;
//   - the amx variant's AMX-BF16 tiles (Note [Sequence attention tiles] in attention_amx.cpp):
//     the same products summed in another order, and the weights rounded to bf16 before they
//     weight the values (as a bf16 host's attention rounds its probabilities).
// So the two paths agree to the error of those roundings (at most ~2^-8 of the largest |v| on top
// of the output's own rounding: the kernel tests hold both to float64 by that bound), not bitwise.

namespace {

bool on_tiles(const frt_sequence_attention_args* a) {
  return kGemmTiles.attention_amx != nullptr && a->head_dim <= kAttnTileMaxHeadDim;
}

// Phase 0 of the tile path: the keys and transposed values of one sequence and KV head, keys
// [k0, k1) (k0 a multiple of 32), in the tiles of Note [Sequence attention packs]; the last block
// of keys writes the padding past kv_len too.
void pack_keys_values(const frt_sequence_attention_args* a, const AttentionPack& p, int64_t b,
                      int64_t kvh, int64_t k0, int64_t k1) {
  const int64_t d = a->head_dim;
  uint16_t* keys = p.keys(b, kvh, a->kv_heads);
  uint16_t* vt = p.values_t(b, kvh, a->kv_heads);
  const bool last = k1 == a->kv_len;
  const int64_t k_end = last ? 16 * p.k_tiles : k1, v_end = last ? 32 * p.blocks : k1;
  for (int64_t t = k0; t < k_end; ++t) {
    const uint16_t* src = t < a->kv_len ? head_row(a->k, a->k_ld, b, t, kvh) : nullptr;
    for (int64_t c = 0; c < p.chunks; ++c) {
      uint16_t* row = keys + p.key_at(t, 32 * c);
      const int64_t have = src != nullptr ? std::clamp<int64_t>(d - 32 * c, 0, 32) : 0;
      if (have > 0) std::memcpy(row, src + 32 * c, static_cast<size_t>(have) * 2);
      std::memset(row + have, 0, static_cast<size_t>(32 - have) * 2);
    }
  }
  for (int64_t t = k0; t < v_end; ++t) {
    const uint16_t* src = t < a->kv_len ? head_row(a->v, a->v_ld, b, t, kvh) : nullptr;
    for (int64_t i = 0; i < 16 * p.v_tiles; ++i)
      vt[p.value_at(t, i)] = src != nullptr && i < d ? src[i] : uint16_t{0};
  }
}

// The sixteen queries of an item in lanes: parts of the variant's register width (sixteen floats
// with AVX-512, eight with AVX, four without) in GCC's vector extension, so GCC keeps them in
// registers (a vector wider than the variant's registers it lowers through the stack). The same
// arithmetic lane by lane in every variant. (GCC warns that passing such a vector by value differs
// between ISAs; these functions are this file's own, inlined, never across a library boundary.)
#pragma GCC diagnostic ignored "-Wpsabi"
#if defined(__AVX512F__)
constexpr int kPartLanes = 16;
#elif defined(__AVX__)
constexpr int kPartLanes = 8;
#else
constexpr int kPartLanes = 4;
#endif
typedef float Part __attribute__((vector_size(kPartLanes * 4)));
typedef int32_t IntPart __attribute__((vector_size(kPartLanes * 4)));
constexpr int kParts = static_cast<int>(kAttnQueries) / kPartLanes;
struct Lanes {
  Part p[kParts];
};

inline Lanes splat(float v) {
  Lanes r;
  for (Part& x : r.p) x = Part{} + v;
  return r;
}
// mask ? a : b lane by lane (a mask lane all ones or zero), in bitwise operations.
inline Part select(IntPart mask, Part a, Part b) {
  return (Part)(((IntPart)a & mask) | ((IntPart)b & ~mask));
}
// The larger of a and b per lane, b where a is NaN.
inline Part larger(Part a, Part b) { return select(a > b, a, b); }

// A running maximum as the weights' base: 0 where it is -inf.
inline Part base(Part m) { return select(m == -std::numeric_limits<float>::infinity(), Part{}, m); }

// 2^x for -126 <= x < 128 on a part's lanes: n = floor(x) (a truncation stepped down, which
// every x86 tier vectorizes), 2^(x - n) by kExp2Poly, times 2^n through the exponent bits; x
// below -126 counts as -126 (a weight that weighs nothing), and NaN stays NaN.
inline Part exp2_part(Part x) {
  const IntPart nan = x != x;
  x = select(nan, Part{}, select(x < kExp2Lo, Part{} + kExp2Lo, x));
  Part n = __builtin_convertvector(__builtin_convertvector(x, IntPart), Part);
  n = select(n > x, n - 1.0f, n);
  const Part f = x - n;
  Part p = Part{} + kExp2Poly[5];
  for (int i = 4; i >= 0; --i) p = p * f + kExp2Poly[i];
  const Part scale = (Part)((__builtin_convertvector(n, IntPart) + 127) << 23);
  return select(nan, Part{} + std::numeric_limits<float>::quiet_NaN(), p * scale);
}

// One item on the portable path (Note [Sequence attention]): the queries in the lanes.
void portable_item(const frt_sequence_attention_args* a, const AttentionItem& it) {
  constexpr int64_t Q = kAttnQueries;
  static_assert(sizeof(Lanes) == Q * sizeof(float));
  const int64_t d = a->head_dim, nq = std::min(Q, a->q_len - it.q0);
  const int64_t kvh = it.h / (a->heads / a->kv_heads);
  Lanes qt[kAttnMaxHeadDim];  // dim i of every query, zero past nq
  Lanes o[kAttnMaxHeadDim];   // the running sums of weighted values
  Lanes s[kAttnKeyBlock];     // a block's scores in base 2
  for (int64_t i = 0; i < d; ++i) {
    float row[Q];
    for (int64_t n = 0; n < Q; ++n)
      row[n] = n < nq ? bf16_to_f32(head_row(a->q, a->q_ld, it.b, it.q0 + n, it.h)[i]) : 0.0f;
    std::memcpy(&qt[i], row, sizeof row);
    o[i] = splat(0.0f);
  }
  Lanes m = splat(-std::numeric_limits<float>::infinity()), l = splat(0.0f);
  const float c = a->scale * kAttnLog2e;
  for (int64_t k0 = 0; k0 < a->kv_len; k0 += kAttnKeyBlock) {
    const int64_t nk = std::min(kAttnKeyBlock, a->kv_len - k0);
    Lanes block_max = splat(-std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < nk; ++j) {
      const uint16_t* key = head_row(a->k, a->k_ld, it.b, k0 + j, kvh);
      Lanes dot = splat(0.0f);
      for (int64_t i = 0; i < d; ++i) {
        const float kv = bf16_to_f32(key[i]);
        for (int u = 0; u < kParts; ++u) dot.p[u] += qt[i].p[u] * kv;
      }
      for (int u = 0; u < kParts; ++u) {
        s[j].p[u] = dot.p[u] * c;
        block_max.p[u] = larger(s[j].p[u], block_max.p[u]);
      }
    }
    // The running maximum, and the base the weights are taken against: the maximum, or 0 while
    // every score so far is -inf (each weight 2^-inf: 0, not -inf - -inf). The old base less the
    // new rescales the sums (from a maximum of -inf: the sums are still 0).
    Lanes alpha;
    for (int u = 0; u < kParts; ++u) {
      const Part grown = larger(block_max.p[u], m.p[u]);
      alpha.p[u] = exp2_part(base(m.p[u]) - base(grown));
      m.p[u] = grown;
      l.p[u] *= alpha.p[u];
    }
    for (int64_t i = 0; i < d; ++i)
      for (int u = 0; u < kParts; ++u) o[i].p[u] *= alpha.p[u];
    for (int64_t j = 0; j < nk; ++j) {
      Lanes p;
      for (int u = 0; u < kParts; ++u) {
        p.p[u] = exp2_part(s[j].p[u] - base(m.p[u]));
        l.p[u] += p.p[u];
      }
      const uint16_t* value = head_row(a->v, a->v_ld, it.b, k0 + j, kvh);
      for (int64_t i = 0; i < d; ++i) {
        const float vv = bf16_to_f32(value[i]);
        for (int u = 0; u < kParts; ++u) o[i].p[u] += p.p[u] * vv;
      }
    }
  }
  float sums[Q];
  std::memcpy(sums, &l, sizeof sums);
  for (int64_t i = 0; i < d; ++i) {
    float row[Q];
    std::memcpy(row, &o[i], sizeof row);
    for (int64_t n = 0; n < nq; ++n)
      head_row(a->out, a->out_ld, it.b, it.q0 + n, it.h)[i] = f32_to_bf16(row[n] / sums[n]);
  }
}

}  // namespace

int32_t seq_attention_supports_form(const frt_op_desc* d, frt_error* err) {
  if (d->x_dtype != FRT_BF16 || d->k < 1 || d->k > kAttnMaxHeadDim)
    return fail(err, d->x_dtype != FRT_BF16 ? FRT_REASON_DTYPE : FRT_REASON_SHAPE,
                "sequence_attention over %s heads of %lld: takes bf16 heads of 1..%lld",
                dtype_name(d->x_dtype), static_cast<long long>(d->k),
                static_cast<long long>(kAttnMaxHeadDim));
  return ok(err);
}

int32_t seq_attention_supports(const frt_sequence_attention_args* a, frt_error* err) {
  if (a == nullptr) return fail(err, FRT_REASON_LAYOUT, "sequence_attention: no arguments");
  if (a->dtype != FRT_BF16)
    return fail(err, FRT_REASON_DTYPE, "sequence_attention over %s: takes bf16",
                dtype_name(a->dtype));
  if (a->batch < 1 || a->heads < 1 || a->kv_heads < 1 || a->q_len < 1 || a->kv_len < 1 ||
      a->head_dim < 1 || a->head_dim > kAttnMaxHeadDim || a->heads % a->kv_heads != 0)
    return fail(err, FRT_REASON_SHAPE,
                "sequence_attention: %lld sequences, %lld heads over %lld KV heads of %lld, "
                "%lld queries, %lld keys: takes at least one of each, heads a multiple of KV "
                "heads, head_dim 1..%lld",
                static_cast<long long>(a->batch), static_cast<long long>(a->heads),
                static_cast<long long>(a->kv_heads), static_cast<long long>(a->head_dim),
                static_cast<long long>(a->q_len), static_cast<long long>(a->kv_len),
                static_cast<long long>(kAttnMaxHeadDim));
  if (a->q == nullptr || a->k == nullptr || a->v == nullptr || a->out == nullptr)
    return fail(err, FRT_REASON_LAYOUT, "sequence_attention: missing q, k, v or output");
  if (!std::isfinite(a->scale * kAttnLog2e))
    return fail(err, FRT_REASON_FORMAT, "sequence_attention: scale %g is not finite (in base 2)",
                static_cast<double>(a->scale));
  // The packs' elements (and every offset) stay far inside int64.
  const double pack_elements = static_cast<double>(a->batch) * static_cast<double>(a->kv_heads) *
                               (static_cast<double>(a->kv_len) + 32) * (a->head_dim + 32) * 2;
  if (pack_elements > 0x1p52 || static_cast<double>(a->q_len) * a->batch * a->heads > 0x1p52)
    return fail(err, FRT_REASON_SHAPE,
                "sequence_attention: %lld x %lld queries and %lld keys "
                "are past what it indexes",
                static_cast<long long>(a->batch), static_cast<long long>(a->q_len),
                static_cast<long long>(a->kv_len));
  return ok(err);
}

int64_t seq_attention_workspace(const frt_sequence_attention_args* a) {
  if (!on_tiles(a)) return 0;
  return a->batch * a->kv_heads * attention_pack(a).per_head * 2;
}

int32_t seq_attention_run(const frt_sequence_attention_args* a, int32_t phase, int32_t ith,
                          int32_t nth, frt_error* err) {
  if (nth < 1 || ith < 0 || ith >= nth) return fail(err, FRT_E_INVALID, "bad thread split");
  const bool tiles = on_tiles(a);
  if (tiles && a->workspace == nullptr) return fail(err, FRT_E_INVALID, "no workspace");
  const AttentionPack pack = attention_pack(a);
  if (phase == 0) {  // the packs, in blocks of 64 keys a sequence and KV head
    if (!tiles) return ok(err);
    const int64_t blocks = div_up(a->kv_len, 64);
    const Range r = split(a->batch * a->kv_heads * blocks, ith, nth);
    for (int64_t i = r.begin; i < r.end; ++i) {
      const int64_t head = i / blocks, k0 = i % blocks * 64;
      pack_keys_values(a, pack, head / a->kv_heads, head % a->kv_heads, k0,
                       std::min(a->kv_len, k0 + 64));
    }
    return ok(err);
  }
  if (phase != 1) return fail(err, FRT_E_INVALID, "sequence_attention has 2 phases, got %d", phase);
  const Range r = split(a->batch * a->heads * div_up(a->q_len, kAttnQueries), ith, nth);
  if (tiles) {
    kGemmTiles.attention_amx(a, pack, r.begin, r.end);
  } else {
    for (int64_t i = r.begin; i < r.end; ++i) portable_item(a, attention_item(a, i));
  }
  return ok(err);
}

}  // namespace frt::kern
