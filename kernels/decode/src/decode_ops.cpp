// The decode-step primitives. Plain loops over fp32 with the dot products going through the
// panel table (scalar in generic, AVX2 in the others); each op splits its outer dimension
// (rows, heads, output features) across the caller's threads.
#include "decode_ops.h"

#include <frt_kern/panels.h>
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#if defined(__AVX2__)
#include <frt_kern/exp_avx2.h>
#include <frt_kern/hsum.h>
#include <immintrin.h>
#endif

namespace frt::kern {

int32_t rmsnorm_run(const frt_rmsnorm_args* a, int32_t ith, int32_t nth, frt_error* err) {
  if (a == nullptr || a->x == nullptr || a->y == nullptr || a->weight == nullptr || a->width < 1)
    return fail(err, FRT_E_INVALID, "rmsnorm: bad arguments");
  for (int64_t r = ith; r < a->rows; r += nth) {
    const float* x = a->x + r * a->ldx;
    float* y = a->y + r * a->ldy;
    // The variant's vector dot product: a serial sum of squares is one dependent add per
    // element, four cycles each, which a 1024-wide row of a prompt feels.
    const float ss = kPanels.dot_f32(x, x, a->width);
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

// A cache's elements as f32: f32 itself, or bf16 (f32's top half) widened as it loads.
namespace {

inline float widen(float x) { return x; }
inline float widen(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

#if defined(FRT_ZMM)
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
#endif
#if defined(__AVX2__)
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
#endif

}  // namespace

// Note [Grouped attention]: a decode row's attention reads every cached K and V row of a layer
// and does a multiply-add per element for each query head of the row's group. The work is split
// by KV head, and a KV head's query heads are taken two at a time: one pass over the K rows
// forms both heads' scores, one pass over the V rows both heads' outputs, so DRAM sees each row
// once per pair. Rows are read in position order (the cache holds a head's positions
// contiguously, Note [KV cache layout] in core/src/decode/program.cpp) and prefetched
// kAheadRows ahead: reading four rows a column chunk at a time, as an earlier version did, left
// the hardware prefetchers behind (13 GB/s from DRAM on one thread, 40 from L2). In the zmm
// path the pair's query vectors and output sums stay in registers (head_dim 64..128); the AVX2
// path reads q from L1 and sums V in 64-wide passes. A score is two multiply-add chains (even
// and odd column chunks) and one horizontal sum; per score and output the order of additions
// is fixed by head_dim alone, so a split across threads changes no bit. A bf16 cache (the decode
// loop's kv_cache="bf16", Note [KV cache dtype] in core/src/decode/program.cpp) takes the same
// passes over half the bytes, each row widened as it loads.
namespace {

constexpr int64_t kAheadRows = 16;
template <typename T>
inline void prefetch_row(const T* row, int64_t d) {
  const char* bytes = reinterpret_cast<const char*>(row);
  for (int64_t b = 0; b < d * static_cast<int64_t>(sizeof(T)); b += 64)
    __builtin_prefetch(bytes + b);
}

// s[0..n) <- softmax(s): the max subtracted, exponentials, normalised by their sum. With AVX2 the
// exponentials are exp_avx2.h's, eight at a time: one std::exp per score and query head was ~1
// ms of a Qwen3-0.6B decode step (86K scores).
void softmax(float* s, int64_t n) {
  float mx = -INFINITY;
  for (int64_t t = 0; t < n; ++t) mx = s[t] > mx ? s[t] : mx;
  float total = 0.0f;
  int64_t t = 0;
#if defined(__AVX2__)
  const __m256 vmx = _mm256_set1_ps(mx);
  __m256 sum = _mm256_setzero_ps();
  for (; t + 8 <= n; t += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + t), vmx));
    _mm256_storeu_ps(s + t, e);
    sum = _mm256_add_ps(sum, e);
  }
  total = hsum(sum);
#endif
  for (; t < n; ++t) total += (s[t] = std::exp(s[t] - mx));
  const float inv = 1.0f / total;
  for (t = 0; t < n; ++t) s[t] *= inv;
}

// The query heads of one KV head a pass serves (NH = 1 or 2) and where their results go.
struct HeadPair {
  const float* q[2];
  float* s[2];    // scores, then probabilities, [positions]
  float* out[2];  // [head_dim]
};

#if defined(FRT_ZMM)
// head_dim = 16 * NC.
template <int NH, int NC, typename T>
void attend_zmm(const HeadPair& hp, const T* k, const T* v, int64_t ld, int64_t positions,
                float scale) {
  constexpr int64_t d = 16 * NC;
  __m512 qv[NH][NC];
  for (int g = 0; g < NH; ++g)
    for (int c = 0; c < NC; ++c) qv[g][c] = _mm512_loadu_ps(hp.q[g] + 16 * c);
  for (int64_t t = 0; t < positions; ++t) {
    if (t + kAheadRows < positions) prefetch_row(k + (t + kAheadRows) * ld, d);
    const T* row = k + t * ld;
    __m512 even[NH], odd[NH];
    for (int g = 0; g < NH; ++g) even[g] = odd[g] = _mm512_setzero_ps();
    for (int c = 0; c < NC; ++c) {
      const __m512 kc = load16(row + 16 * c);
      for (int g = 0; g < NH; ++g) {
        if (c % 2 == 0)
          even[g] = _mm512_fmadd_ps(qv[g][c], kc, even[g]);
        else
          odd[g] = _mm512_fmadd_ps(qv[g][c], kc, odd[g]);
      }
    }
    for (int g = 0; g < NH; ++g) hp.s[g][t] = hsum(_mm512_add_ps(even[g], odd[g])) * scale;
  }
  for (int g = 0; g < NH; ++g) softmax(hp.s[g], positions);
  __m512 acc[NH][NC];
  for (int g = 0; g < NH; ++g)
    for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t t = 0; t < positions; ++t) {
    if (t + kAheadRows < positions) prefetch_row(v + (t + kAheadRows) * ld, d);
    const T* row = v + t * ld;
    __m512 p[NH];
    for (int g = 0; g < NH; ++g) p[g] = _mm512_set1_ps(hp.s[g][t]);
    for (int c = 0; c < NC; ++c) {
      const __m512 vc = load16(row + 16 * c);
      for (int g = 0; g < NH; ++g) acc[g][c] = _mm512_fmadd_ps(p[g], vc, acc[g][c]);
    }
  }
  for (int g = 0; g < NH; ++g)
    for (int c = 0; c < NC; ++c) _mm512_storeu_ps(hp.out[g] + 16 * c, acc[g][c]);
}

template <int NH, typename T>
bool attend_zmm_any(const HeadPair& hp, const T* k, const T* v, int64_t ld, int64_t d,
                    int64_t positions, float scale) {
  switch (d) {
    case 64:
      return attend_zmm<NH, 4>(hp, k, v, ld, positions, scale), true;
    case 80:
      return attend_zmm<NH, 5>(hp, k, v, ld, positions, scale), true;
    case 96:
      return attend_zmm<NH, 6>(hp, k, v, ld, positions, scale), true;
    case 128:
      return attend_zmm<NH, 8>(hp, k, v, ld, positions, scale), true;
    default:
      return false;
  }
}
#endif

// s[g] = scale * q[g] . row over d for the NH heads of a pass, the row's chunks loaded once: two
// chains of 8-wide chunks per head, then the scalar tail.
template <int NH, typename T>
inline void scores_at(const HeadPair& hp, const T* row, int64_t d, float scale, int64_t t) {
  float sum[NH] = {};
  int64_t i = 0;
#if defined(__AVX2__)
  __m256 even[NH], odd[NH];
  for (int g = 0; g < NH; ++g) even[g] = odd[g] = _mm256_setzero_ps();
  for (; i + 16 <= d; i += 16) {
    const __m256 k0 = load8(row + i), k1 = load8(row + i + 8);
    for (int g = 0; g < NH; ++g) {
      even[g] = _mm256_fmadd_ps(_mm256_loadu_ps(hp.q[g] + i), k0, even[g]);
      odd[g] = _mm256_fmadd_ps(_mm256_loadu_ps(hp.q[g] + i + 8), k1, odd[g]);
    }
  }
  if (i + 8 <= d) {
    const __m256 k0 = load8(row + i);
    for (int g = 0; g < NH; ++g)
      even[g] = _mm256_fmadd_ps(_mm256_loadu_ps(hp.q[g] + i), k0, even[g]);
    i += 8;
  }
  for (int g = 0; g < NH; ++g) sum[g] = hsum(_mm256_add_ps(even[g], odd[g]));
#endif
  for (; i < d; ++i)
    for (int g = 0; g < NH; ++g) sum[g] += hp.q[g][i] * widen(row[i]);
  for (int g = 0; g < NH; ++g) hp.s[g][t] = sum[g] * scale;
}

// out[i] = sum_t p[t] * v[t * ldv + i] for i < d.
template <typename T>
void weighted_rows(const float* p, const T* v, int64_t ldv, int64_t positions, int64_t d,
                   float* out) {
  int64_t i = 0;
#if defined(__AVX2__)
  for (; i + 64 <= d; i += 64) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t t = 0; t < positions; ++t) {
      if (i == 0 && t + kAheadRows < positions) prefetch_row(v + (t + kAheadRows) * ldv, d);
      const __m256 pt = _mm256_set1_ps(p[t]);
      const T* row = v + t * ldv + i;
      for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(pt, load8(row + 8 * c), acc[c]);
    }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(out + i + 8 * c, acc[c]);
  }
  for (; i + 8 <= d; i += 8) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t t = 0; t < positions; ++t)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), load8(v + t * ldv + i), acc);
    _mm256_storeu_ps(out + i, acc);
  }
#endif
  for (; i < d; ++i) {
    float acc = 0.0f;
    for (int64_t t = 0; t < positions; ++t) acc += p[t] * widen(v[t * ldv + i]);
    out[i] = acc;
  }
}

// One pass of up to two query heads over a KV head's rows. Softcapped scores (softcap > 0) take
// the path that forms all scores before the softmax: the cap goes between the two.
template <typename T>
void attend_pair(const HeadPair& hp, int nh, const T* k, const T* v, int64_t ld, int64_t d,
                 int64_t positions, float scale, float softcap) {
#if defined(FRT_ZMM)
  if (softcap == 0 && (nh == 2 ? attend_zmm_any<2>(hp, k, v, ld, d, positions, scale)
                               : attend_zmm_any<1>(hp, k, v, ld, d, positions, scale)))
    return;
#endif
  for (int64_t t = 0; t < positions; ++t) {
    if (t + kAheadRows < positions) prefetch_row(k + (t + kAheadRows) * ld, d);
    if (nh == 2)
      scores_at<2>(hp, k + t * ld, d, scale, t);
    else
      scores_at<1>(hp, k + t * ld, d, scale, t);
  }
  for (int g = 0; g < nh; ++g) {
    if (softcap > 0)
      for (int64_t t = 0; t < positions; ++t)
        hp.s[g][t] = softcap * std::tanh(hp.s[g][t] / softcap);
    softmax(hp.s[g], positions);
    weighted_rows(hp.s[g], v, ld, positions, d, hp.out[g]);
  }
}

// Query heads [h0, h1) of KV head kvh, two at a time, over a cache of T.
template <typename T>
void attend(const frt_cache_attention_args* a, int64_t kvh, int64_t h0, int64_t h1) {
  const int64_t d = a->head_dim;
  for (int64_t h = h0; h < h1; h += 2) {
    const int nh = h + 1 < h1 ? 2 : 1;
    HeadPair hp{};
    for (int g = 0; g < nh; ++g) {
      hp.q[g] = a->q + (h + g) * d;
      hp.s[g] = a->scores + (h + g) * a->scores_stride;
      hp.out[g] = a->out + (h + g) * d;
    }
    attend_pair(hp, nh, static_cast<const T*>(a->k_cache) + kvh * a->ld_head,
                static_cast<const T*>(a->v_cache) + kvh * a->ld_head, a->ld_pos, d, a->positions,
                a->scale, a->softcap);
  }
}

void attend_heads(const frt_cache_attention_args* a, int64_t kvh, int64_t h0, int64_t h1) {
  if (a->cache_dtype == FRT_BF16)
    attend<uint16_t>(a, kvh, h0, h1);
  else
    attend<float>(a, kvh, h0, h1);
}

// Every attention kind runs as FRT_OP_CACHE_ATTENTION's arguments: attention and
// capped_attention are its f32 cases.
int32_t run_attention(const frt_cache_attention_args* a, int32_t ith, int32_t nth, frt_error* err) {
  if (a == nullptr || a->q == nullptr || a->k_cache == nullptr || a->v_cache == nullptr ||
      a->out == nullptr || a->scores == nullptr || a->kv_heads < 1 || a->heads % a->kv_heads != 0 ||
      a->positions < 1 || a->scores_stride < a->positions || a->ld_pos < a->head_dim ||
      a->ld_head < a->head_dim || (a->cache_dtype != FRT_F32 && a->cache_dtype != FRT_BF16) ||
      !(a->softcap >= 0) || !std::isfinite(a->softcap))
    return fail(err, FRT_E_INVALID, "attention: bad arguments");
  const int64_t group = a->heads / a->kv_heads;
  if (a->kv_heads >= nth) {  // whole groups per thread
    const Range kv = split(a->kv_heads, ith, nth);
    for (int64_t kvh = kv.begin; kvh < kv.end; ++kvh)
      attend_heads(a, kvh, kvh * group, (kvh + 1) * group);
  } else {  // fewer KV heads than threads: split the query heads
    const Range heads = split(a->heads, ith, nth);
    for (int64_t h = heads.begin; h < heads.end; ++h) attend_heads(a, h / group, h, h + 1);
  }
  return ok(err);
}

frt_cache_attention_args over_f32(const frt_attention_args& a, float softcap) {
  return {a.heads, a.kv_heads, a.head_dim, a.positions, FRT_F32,
          a.q,     a.k_cache,  a.v_cache,  a.ld_pos,    a.ld_head,
          a.scale, softcap,    a.out,      a.scores,    a.scores_stride};
}

}  // namespace

int32_t attention_run(const frt_attention_args* a, int32_t ith, int32_t nth, frt_error* err) {
  if (a == nullptr) return fail(err, FRT_E_INVALID, "attention: bad arguments");
  const frt_cache_attention_args c = over_f32(*a, 0.0f);
  return run_attention(&c, ith, nth, err);
}

int32_t capped_attention_run(const frt_capped_attention_args* a, int32_t ith, int32_t nth,
                             frt_error* err) {
  if (a == nullptr || !(a->softcap > 0))
    return fail(err, FRT_E_INVALID, "capped attention: the softcap must be positive");
  const frt_cache_attention_args c = over_f32(a->attention, a->softcap);
  return run_attention(&c, ith, nth, err);
}

int32_t cache_attention_run(const frt_cache_attention_args* a, int32_t ith, int32_t nth,
                            frt_error* err) {
  return run_attention(a, ith, nth, err);
}

// Note [Paged attention]: a serving engine keeps every sequence's keys and values in one pool of
// slots and names each row's positions by a slot table, so a row's K/V vectors lie wherever the
// allocator put them (SGLang's torch-native backend gathers them into a copy per request, then
// calls the host's attention, request by request). Here the work items are (row, KV head) pairs
// split across threads in one call; an item's query heads pass over its rows one head at a time
// (the rows of one item, 256 positions of 128 bf16 are 64 KiB, stay in L2 for the next head), and
// the slot of the row 16 positions ahead is prefetched, since the hardware prefetchers cannot
// follow a table. A bf16 pool is widened to f32 as it is loaded (bf16 is f32's top half). Per
// score and output the order of additions is fixed by head_dim alone: a split across threads
// changes no bit.
namespace {

// One item's rows: position t's vector of the item's KV head.
template <typename T>
struct SlotRows {
  const T* head;  // the pool at the item's KV head
  const int32_t* slot;
  int64_t ld_slot;
  const T* at(int64_t t) const { return head + slot[t] * ld_slot; }
  void prefetch(int64_t t, int64_t d) const { prefetch_row(at(t), d); }
};

// scale * q . row over d: two chains of vector chunks, then the scalar tail.
template <typename T>
float paged_score(const float* q, const T* row, int64_t d) {
  int64_t i = 0;
  float sum = 0.0f;
#if defined(FRT_ZMM)
  __m512 even = _mm512_setzero_ps(), odd = _mm512_setzero_ps();
  for (; i + 32 <= d; i += 32) {
    even = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load16(row + i), even);
    odd = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 16), load16(row + i + 16), odd);
  }
  if (i + 16 <= d) {
    even = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), load16(row + i), even);
    i += 16;
  }
  sum = hsum(_mm512_add_ps(even, odd));
#elif defined(__AVX2__)
  __m256 even = _mm256_setzero_ps(), odd = _mm256_setzero_ps();
  for (; i + 16 <= d; i += 16) {
    even = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(row + i), even);
    odd = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 8), load8(row + i + 8), odd);
  }
  if (i + 8 <= d) {
    even = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(row + i), even);
    i += 8;
  }
  sum = hsum(_mm256_add_ps(even, odd));
#endif
  for (; i < d; ++i) sum += q[i] * widen(row[i]);
  return sum;
}

// out[i] = sum_t p[t] * row_t[i] for i < d, 64 columns a pass with the sums in registers.
template <typename T>
void paged_weighted(const float* p, const SlotRows<T>& v, int64_t n, int64_t d, float* out) {
  int64_t i = 0;
#if defined(FRT_ZMM)
  for (; i + 64 <= d; i += 64) {
    __m512 acc[4];
    for (auto& a : acc) a = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      if (i == 0 && t + kAheadRows < n) v.prefetch(t + kAheadRows, d);
      const __m512 pt = _mm512_set1_ps(p[t]);
      const T* row = v.at(t) + i;
      for (int c = 0; c < 4; ++c) acc[c] = _mm512_fmadd_ps(pt, load16(row + 16 * c), acc[c]);
    }
    for (int c = 0; c < 4; ++c) _mm512_storeu_ps(out + i + 16 * c, acc[c]);
  }
  for (; i + 16 <= d; i += 16) {  // head_dim 80, 96, 112: the rest 16 columns a pass
    __m512 acc = _mm512_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      if (i == 0 && t + kAheadRows < n) v.prefetch(t + kAheadRows, d);
      acc = _mm512_fmadd_ps(_mm512_set1_ps(p[t]), load16(v.at(t) + i), acc);
    }
    _mm512_storeu_ps(out + i, acc);
  }
#elif defined(__AVX2__)
  for (; i + 64 <= d; i += 64) {
    __m256 acc[8];
    for (auto& a : acc) a = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      if (i == 0 && t + kAheadRows < n) v.prefetch(t + kAheadRows, d);
      const __m256 pt = _mm256_set1_ps(p[t]);
      const T* row = v.at(t) + i;
      for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(pt, load8(row + 8 * c), acc[c]);
    }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(out + i + 8 * c, acc[c]);
  }
  for (; i + 8 <= d; i += 8) {  // head_dim 72, 80, 96: the rest 8 columns a pass
    __m256 acc = _mm256_setzero_ps();
    for (int64_t t = 0; t < n; ++t) {
      if (i == 0 && t + kAheadRows < n) v.prefetch(t + kAheadRows, d);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), load8(v.at(t) + i), acc);
    }
    _mm256_storeu_ps(out + i, acc);
  }
#endif
  for (; i < d; ++i) {
    float acc = 0.0f;
    for (int64_t t = 0; t < n; ++t) acc += p[t] * widen(v.at(t)[i]);
    out[i] = acc;
  }
}

// Row b's query heads of KV head j.
template <typename T>
void attend_paged(const frt_paged_attention_args* a, int64_t b, int64_t j) {
  const int64_t d = a->head_dim, n = a->lengths[b], group = a->heads / a->kv_heads;
  const int32_t* slot = a->table + a->rows[b] * a->ld_table;
  const SlotRows<T> k{static_cast<const T*>(a->k_pool) + j * a->ld_head, slot, a->ld_slot};
  const SlotRows<T> v{static_cast<const T*>(a->v_pool) + j * a->ld_head, slot, a->ld_slot};
  for (int64_t h = j * group; h < (j + 1) * group; ++h) {
    const float* q = a->q + b * a->ld_q + h * d;
    float* s = a->scores + (b * a->heads + h) * a->scores_stride;
    for (int64_t t = 0; t < n; ++t) {
      if (h == j * group && t + kAheadRows < n) k.prefetch(t + kAheadRows, d);
      s[t] = paged_score(q, k.at(t), d) * a->scale;
    }
    if (a->softcap > 0)
      for (int64_t t = 0; t < n; ++t) s[t] = a->softcap * std::tanh(s[t] / a->softcap);
    softmax(s, n);
    paged_weighted(s, v, n, d, a->out + b * a->ld_out + h * d);
  }
}

// Why row b cannot be read as asked, or nullptr.
const char* paged_row_refusal(const frt_paged_attention_args* a, int64_t b) {
  const int64_t n = a->lengths[b];
  if (a->rows[b] < 0 || a->rows[b] >= a->table_lines || n < 1 || n > a->table_width ||
      n > a->scores_stride)
    return "a row's table line or length is out of range";
  const int32_t* slot = a->table + a->rows[b] * a->ld_table;
  for (int64_t t = 0; t < n; ++t)
    if (slot[t] < 0 || slot[t] >= a->slots) return "a slot outside the pool";
  return nullptr;
}

}  // namespace

int32_t paged_attention_run(const frt_paged_attention_args* a, int32_t ith, int32_t nth,
                            frt_error* err) {
  if (a == nullptr || a->batch < 1 || a->kv_heads < 1 || a->heads % a->kv_heads != 0 ||
      a->head_dim < 1 || a->q == nullptr || a->k_pool == nullptr || a->v_pool == nullptr ||
      a->table == nullptr || a->rows == nullptr || a->lengths == nullptr || a->out == nullptr ||
      a->scores == nullptr || a->ld_out < a->heads * a->head_dim || a->ld_head < a->head_dim ||
      a->table_lines < 1 || a->table_width < 1 || a->table_width > a->ld_table ||
      (a->batch > 1 && a->ld_q < a->heads * a->head_dim) || a->ld_slot < a->head_dim ||
      a->slots < 1 || !(a->scale > 0) || !(a->softcap >= 0) ||
      (a->cache_dtype != FRT_F32 && a->cache_dtype != FRT_BF16))
    return fail(err, FRT_E_INVALID, "paged attention: bad arguments");
  const Range items = split(a->batch * a->kv_heads, ith, nth);
  for (int64_t it = items.begin; it < items.end; ++it)
    if (const char* why = paged_row_refusal(a, it / a->kv_heads))
      return fail(err, FRT_E_INVALID, "paged attention: row %lld: %s",
                  static_cast<long long>(it / a->kv_heads), why);
  for (int64_t it = items.begin; it < items.end; ++it) {
    if (a->cache_dtype == FRT_F32)
      attend_paged<float>(a, it / a->kv_heads, it % a->kv_heads);
    else
      attend_paged<uint16_t>(a, it / a->kv_heads, it % a->kv_heads);
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

// The panel table's feed-forward epilogue (Note [Vector activations] in
// common/src/x86/avx2/activate_avx2.cpp: one vector exp per element, every variant the same
// bits), each thread a range of whole 64-element pieces, so that only the last range has a tail
// and every element takes the path it takes unsplit.
int32_t gated_act_run(const frt_gated_act_args* a, int32_t ith, int32_t nth, frt_error* err) {
  if (a == nullptr || a->gate == nullptr || a->up == nullptr || a->out == nullptr || a->n < 0 ||
      (a->act != FRT_ACT_SILU && a->act != FRT_ACT_GELU_TANH && a->act != FRT_ACT_GELU))
    return fail(err, FRT_E_INVALID, "gated activation: bad arguments");
  constexpr int64_t kPiece = 64;
  const Range pieces = split(div_up(a->n, kPiece), ith, nth);
  const int64_t b = pieces.begin * kPiece, e = std::min(a->n, pieces.end * kPiece);
  if (b < e) kPanels.activate(a->act, a->gate + b, nullptr, a->up + b, a->out + b, e - b);
  return ok(err);
}

}  // namespace frt::kern
