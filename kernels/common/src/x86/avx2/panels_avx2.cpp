// AVX2 + FMA panels. One panel is FRT_PANEL = 16 output channels = two ymm columns; each packed
// row of the panel is one k (int8: 16 bytes) or a pair of k (int4: 16 bytes of two nibbles).
//
// Note [Accumulator chains]: at decode rows the loop should be bound by memory, but a single FMA
// chain per ymm would cap it at one packed row per FMA latency (4 cycles on Zen 3, ~4 B/cycle per
// core), below the DRAM rate of one core. So a single row gets four k per step into separate
// accumulators; several rows are independent chains already.
#include <frt_kern/hsum.h>
#include <frt_kern/panel_prefetch.h>
#include <frt_kern/panels.h>
#include <immintrin.h>

namespace frt::kern {
namespace {

inline __m256 load_i8x8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

inline __m256 bcast(const float* p) { return _mm256_broadcast_ss(p); }

// Eight scales (or mins) of a group form from element i, in their stored dtype (F16C converts).
inline __m256 load_scales8(const void* base, int64_t i, int32_t dtype) {
  if (dtype == FRT_F16)
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(base) + i)));
  return _mm256_loadu_ps(static_cast<const float*>(base) + i);
}

// Where a group's scale (and an int4 group's min) come from: stored per group (int8_group,
// int4_group), or as codes under the super-block's f16 scales (int4_super: s = d * sc and
// mn = -(dmin * m); int8_super: s = d * sc), products exact in f32, so a pack of a super form
// and a group pack holding the same values compute the same bits.
struct StoredScales {
  const frt_packed_weight* w;
  int64_t s0;  // the panel's first group scale
  __m256 scale(int64_t g, int h) const {
    return load_scales8(w->scales, s0 + g * FRT_PANEL + 8 * h, w->scale_dtype);
  }
  // res + mn * xs
  __m256 add_min(int64_t g, int h, __m256 xs, __m256 res) const {
    return _mm256_fmadd_ps(load_scales8(w->mins, s0 + g * FRT_PANEL + 8 * h, w->scale_dtype), xs,
                           res);
  }
};
struct SuperScales {
  const uint8_t* records;  // the panel's first super record
  static __m256 coded(const uint8_t* rec, int unit_at, int codes_at, int64_t g, int h) {
    const __m256 unit =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + unit_at + 16 * h)));
    const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(
        rec + codes_at + (g % FRT_SUPER4_GROUPS) * FRT_PANEL + 8 * h));
    return _mm256_mul_ps(unit, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)));
  }
  const uint8_t* record(int64_t g) const {
    return records + (g / FRT_SUPER4_GROUPS) * FRT_SUPER4_RECORD;
  }
  __m256 scale(int64_t g, int h) const { return coded(record(g), 0, FRT_SUPER4_SC_AT, g, h); }
  // res - (dmin * m) * xs: the same rounding as res + (-(dmin * m)) * xs.
  __m256 add_min(int64_t g, int h, __m256 xs, __m256 res) const {
    return _mm256_fnmadd_ps(coded(record(g), FRT_SUPER4_DMIN_AT, FRT_SUPER4_M_AT, g, h), xs, res);
  }
};

struct Super8Scales {
  const uint8_t* records;  // the panel's first super record (FRT_W_INT8_SUPER)
  __m256 scale(int64_t g, int h) const {
    const uint8_t* rec = records + (g / FRT_SUPER8_GROUPS) * FRT_SUPER8_RECORD;
    const __m256 d =
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 16 * h)));
    const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(
        rec + FRT_SUPER8_SC_AT + (g % FRT_SUPER8_GROUPS) * FRT_PANEL + 8 * h));
    return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)));
  }
};

// out += s * acc for group g of one row, both column halves.
template <typename Scales>
inline void add_scaled(const Scales& sc, int64_t g, __m256 acc0, __m256 acc1, float* out) {
  _mm256_storeu_ps(out, _mm256_fmadd_ps(sc.scale(g, 0), acc0, _mm256_loadu_ps(out)));
  _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(sc.scale(g, 1), acc1, _mm256_loadu_ps(out + 8)));
}

// One row, four k per step into four pairs of accumulators. Written out by hand: with arrays of
// accumulators GCC 12 kept a stack copy of every accumulator in the loop (a store per FMA).
void int8_row1(const int8_t* q, int64_t k, const float* x, const float* scale, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
  int64_t i = 0;
  for (; i + 4 <= k; i += 4) {
    const int8_t* r = q + i * FRT_PANEL;
    _mm_prefetch(reinterpret_cast<const char*>(r + kPrefetchBytes), _MM_HINT_T0);
    const __m256 x0 = bcast(x + i), x1 = bcast(x + i + 1), x2 = bcast(x + i + 2),
                 x3 = bcast(x + i + 3);
    a0 = _mm256_fmadd_ps(load_i8x8(r), x0, a0);
    a1 = _mm256_fmadd_ps(load_i8x8(r + 8), x0, a1);
    b0 = _mm256_fmadd_ps(load_i8x8(r + 16), x1, b0);
    b1 = _mm256_fmadd_ps(load_i8x8(r + 24), x1, b1);
    c0 = _mm256_fmadd_ps(load_i8x8(r + 32), x2, c0);
    c1 = _mm256_fmadd_ps(load_i8x8(r + 40), x2, c1);
    d0 = _mm256_fmadd_ps(load_i8x8(r + 48), x3, d0);
    d1 = _mm256_fmadd_ps(load_i8x8(r + 56), x3, d1);
  }
  for (; i < k; ++i) {
    const int8_t* r = q + i * FRT_PANEL;
    const __m256 xi = bcast(x + i);
    a0 = _mm256_fmadd_ps(load_i8x8(r), xi, a0);
    a1 = _mm256_fmadd_ps(load_i8x8(r + 8), xi, a1);
  }
  a0 = _mm256_add_ps(_mm256_add_ps(a0, b0), _mm256_add_ps(c0, d0));
  a1 = _mm256_add_ps(_mm256_add_ps(a1, b1), _mm256_add_ps(c1, d1));
  _mm256_storeu_ps(out, _mm256_mul_ps(a0, _mm256_loadu_ps(scale)));
  _mm256_storeu_ps(out + 8, _mm256_mul_ps(a1, _mm256_loadu_ps(scale + 8)));
}

// MR rows share each converted weight vector; MR >= 2 already gives 2*MR independent chains.
template <int MR>
void int8_rows(const int8_t* q, int64_t k, const float* x, int64_t ldx, const float* scale,
               float* out) {
  __m256 lo[MR], hi[MR];
  for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
  for (int64_t i = 0; i < k; ++i) {
    const int8_t* row = q + i * FRT_PANEL;
    prefetch_block(row, i);
    const __m256 w0 = load_i8x8(row), w1 = load_i8x8(row + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xb = bcast(x + r * ldx + i);
      lo[r] = _mm256_fmadd_ps(w0, xb, lo[r]);
      hi[r] = _mm256_fmadd_ps(w1, xb, hi[r]);
    }
  }
  const __m256 s0 = _mm256_loadu_ps(scale), s1 = _mm256_loadu_ps(scale + 8);
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(out + r * FRT_PANEL, _mm256_mul_ps(lo[r], s0));
    _mm256_storeu_ps(out + r * FRT_PANEL + 8, _mm256_mul_ps(hi[r], s1));
  }
}

// int8 with group scales: one row, four k per step (Note [Accumulator chains]); each group's
// sum is scaled into `out` (L1) as it closes.
template <typename Scales>
void int8g_row1(const int8_t* q, const frt_packed_weight* w, const Scales& sc, const float* x,
                float* out) {
  const int64_t groups = w->k / w->group;
  _mm256_storeu_ps(out, _mm256_setzero_ps());
  _mm256_storeu_ps(out + 8, _mm256_setzero_ps());
  for (int64_t g = 0; g < groups; ++g) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, d1 = a0;
    for (int64_t i = g * w->group; i < (g + 1) * w->group; i += 4) {  // group % 4 == 0
      const int8_t* r = q + i * FRT_PANEL;
      _mm_prefetch(reinterpret_cast<const char*>(r + kPrefetchBytes), _MM_HINT_T0);
      const __m256 x0 = bcast(x + i), x1 = bcast(x + i + 1), x2 = bcast(x + i + 2),
                   x3 = bcast(x + i + 3);
      a0 = _mm256_fmadd_ps(load_i8x8(r), x0, a0);
      a1 = _mm256_fmadd_ps(load_i8x8(r + 8), x0, a1);
      b0 = _mm256_fmadd_ps(load_i8x8(r + 16), x1, b0);
      b1 = _mm256_fmadd_ps(load_i8x8(r + 24), x1, b1);
      c0 = _mm256_fmadd_ps(load_i8x8(r + 32), x2, c0);
      c1 = _mm256_fmadd_ps(load_i8x8(r + 40), x2, c1);
      d0 = _mm256_fmadd_ps(load_i8x8(r + 48), x3, d0);
      d1 = _mm256_fmadd_ps(load_i8x8(r + 56), x3, d1);
    }
    add_scaled(sc, g, _mm256_add_ps(_mm256_add_ps(a0, b0), _mm256_add_ps(c0, d0)),
               _mm256_add_ps(_mm256_add_ps(a1, b1), _mm256_add_ps(c1, d1)), out);
  }
}

template <int MR, typename Scales>
void int8g_rows(const int8_t* q, const frt_packed_weight* w, const Scales& sc, const float* x,
                int64_t ldx, float* out) {
  const int64_t groups = w->k / w->group;
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(out + r * FRT_PANEL, _mm256_setzero_ps());
    _mm256_storeu_ps(out + r * FRT_PANEL + 8, _mm256_setzero_ps());
  }
  for (int64_t g = 0; g < groups; ++g) {
    __m256 lo[MR], hi[MR];
    for (int r = 0; r < MR; ++r) lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t i = g * w->group; i < (g + 1) * w->group; ++i) {
      const int8_t* row = q + i * FRT_PANEL;
      prefetch_block(row, i);
      const __m256 w0 = load_i8x8(row), w1 = load_i8x8(row + 8);
      for (int r = 0; r < MR; ++r) {
        const __m256 xb = bcast(x + r * ldx + i);
        lo[r] = _mm256_fmadd_ps(w0, xb, lo[r]);
        hi[r] = _mm256_fmadd_ps(w1, xb, hi[r]);
      }
    }
    for (int r = 0; r < MR; ++r) add_scaled(sc, g, lo[r], hi[r], out + r * FRT_PANEL);
  }
}

// The min is applied once per group through the row's group sum:
// sum (q s + mn) x = s sum q x + mn sum x.
struct Nibbles {  // one packed row (16 columns, k and k+1) as fp32 columns 0-7 and 8-15
  __m256 even0, odd0, even1, odd1;
};
inline Nibbles load_nibbles(const uint8_t* row) {
  const __m256i low4 = _mm256_set1_epi32(0x0f);
  const __m256i v0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
  const __m256i v1 =
      _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8)));
  return {
      _mm256_cvtepi32_ps(_mm256_and_si256(v0, low4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4)),
      _mm256_cvtepi32_ps(_mm256_and_si256(v1, low4)), _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4))};
}

// out += s * acc + mn * xs for one group of one row, both column halves. The running result
// lives in `out` (L1), not in registers: the group loop needs all sixteen ymm registers.
template <typename Scales>
inline void apply_group(const Scales& sc, int64_t g, float xs, __m256 acc0, __m256 acc1,
                        float* out) {
  const __m256 xsv = _mm256_set1_ps(xs);
  _mm256_storeu_ps(
      out, _mm256_fmadd_ps(sc.scale(g, 0), acc0, sc.add_min(g, 0, xsv, _mm256_loadu_ps(out))));
  _mm256_storeu_ps(out + 8, _mm256_fmadd_ps(sc.scale(g, 1), acc1,
                                            sc.add_min(g, 1, xsv, _mm256_loadu_ps(out + 8))));
}

// One row: two packed rows (four k) per step, even and odd k in separate accumulators (Note
// [Accumulator chains]), named rather than in arrays for the reason given at int8_row1.
template <typename Scales>
void int4_row1(const uint8_t* q, const frt_packed_weight* w, const Scales& sc, const float* x,
               const float* xsum, float* out) {
  const int64_t k = w->k, group = w->group;
  const int64_t groups = k / group, pairs = group / 2;
  _mm256_storeu_ps(out, _mm256_setzero_ps());
  _mm256_storeu_ps(out + 8, _mm256_setzero_ps());
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* qg = q + g * pairs * FRT_PANEL;
    const float* xg = x + g * group;
    __m256 e0 = _mm256_setzero_ps(), e1 = e0, o0 = e0, o1 = e0, f0 = e0, f1 = e0, p0 = e0, p1 = e0;
    for (int64_t t = 0; t < pairs; t += 2) {  // pairs is 16, 32 or 64
      _mm_prefetch(reinterpret_cast<const char*>(qg + t * FRT_PANEL + kPrefetchBytes), _MM_HINT_T0);
      const float* xt = xg + 2 * t;
      const Nibbles a = load_nibbles(qg + t * FRT_PANEL);
      const __m256 x0 = bcast(xt), x1 = bcast(xt + 1);
      e0 = _mm256_fmadd_ps(a.even0, x0, e0);
      e1 = _mm256_fmadd_ps(a.even1, x0, e1);
      o0 = _mm256_fmadd_ps(a.odd0, x1, o0);
      o1 = _mm256_fmadd_ps(a.odd1, x1, o1);
      const Nibbles b = load_nibbles(qg + (t + 1) * FRT_PANEL);
      const __m256 x2 = bcast(xt + 2), x3 = bcast(xt + 3);
      f0 = _mm256_fmadd_ps(b.even0, x2, f0);
      f1 = _mm256_fmadd_ps(b.even1, x2, f1);
      p0 = _mm256_fmadd_ps(b.odd0, x3, p0);
      p1 = _mm256_fmadd_ps(b.odd1, x3, p1);
    }
    apply_group(sc, g, xsum[g], _mm256_add_ps(_mm256_add_ps(e0, o0), _mm256_add_ps(f0, p0)),
                _mm256_add_ps(_mm256_add_ps(e1, o1), _mm256_add_ps(f1, p1)), out);
  }
}

// MR rows share each unpacked row; results gather in `out` group by group.
template <int MR, typename Scales>
void int4_rows(const uint8_t* q, const frt_packed_weight* w, const Scales& sc, const float* x,
               int64_t ldx, const float* xsum, float* out) {
  const int64_t k = w->k, group = w->group;
  const int64_t groups = k / group, pairs = group / 2;
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(out + r * FRT_PANEL, _mm256_setzero_ps());
    _mm256_storeu_ps(out + r * FRT_PANEL + 8, _mm256_setzero_ps());
  }
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* qg = q + g * pairs * FRT_PANEL;
    __m256 ev[MR][2], od[MR][2];
    for (int r = 0; r < MR; ++r) ev[r][0] = ev[r][1] = od[r][0] = od[r][1] = _mm256_setzero_ps();
    for (int64_t t = 0; t < pairs; ++t) {
      prefetch_block(qg + t * FRT_PANEL, t);
      const Nibbles a = load_nibbles(qg + t * FRT_PANEL);
      for (int r = 0; r < MR; ++r) {
        const float* xt = x + r * ldx + g * group + 2 * t;
        const __m256 xe = bcast(xt), xo = bcast(xt + 1);
        ev[r][0] = _mm256_fmadd_ps(a.even0, xe, ev[r][0]);
        ev[r][1] = _mm256_fmadd_ps(a.even1, xe, ev[r][1]);
        od[r][0] = _mm256_fmadd_ps(a.odd0, xo, od[r][0]);
        od[r][1] = _mm256_fmadd_ps(a.odd1, xo, od[r][1]);
      }
    }
    for (int r = 0; r < MR; ++r)
      apply_group(sc, g, xsum[r * groups + g], _mm256_add_ps(ev[r][0], od[r][0]),
                  _mm256_add_ps(ev[r][1], od[r][1]), out + r * FRT_PANEL);
  }
}

}  // namespace

// Rows go in blocks of four (int8) or two (int4); the panel is re-read from L1/L2 for each
// block, so DRAM still sees every weight byte once per call.
void int8_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                     float* out) {
  const int64_t k = w->k;
  const auto* q = static_cast<const int8_t*>(w->qdata) + p * k * FRT_PANEL;
  const float* scale = static_cast<const float*>(w->scales) + p * FRT_PANEL;
  in_fours(
      m,
      [&](auto mr, int64_t r) {
        int8_rows<decltype(mr)::value>(q, k, x + r * ldx, ldx, scale, out + r * FRT_PANEL);
      },
      [&](int64_t r) { int8_row1(q, k, x + r * ldx, scale, out + r * FRT_PANEL); });
}

namespace {

template <typename Scales>
void int8g_panel(const frt_packed_weight* w, int64_t p, const Scales& sc, const float* x,
                 int64_t ldx, int64_t m, float* out) {
  const auto* q = static_cast<const int8_t*>(w->qdata) + p * w->k * FRT_PANEL;
  in_fours(
      m,
      [&](auto mr, int64_t r) {
        int8g_rows<decltype(mr)::value>(q, w, sc, x + r * ldx, ldx, out + r * FRT_PANEL);
      },
      [&](int64_t r) { int8g_row1(q, w, sc, x + r * ldx, out + r * FRT_PANEL); });
}

}  // namespace

void int8g_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                      float* out) {
  int8g_panel(w, p, StoredScales{w, p * (w->k / w->group) * FRT_PANEL}, x, ldx, m, out);
}

void int8s_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                      float* out) {
  const auto* records =
      static_cast<const uint8_t*>(w->scales) + p * (w->k / FRT_SUPER_K) * FRT_SUPER8_RECORD;
  int8g_panel(w, p, Super8Scales{records}, x, ldx, m, out);
}

namespace {

template <typename Scales>
void int4_panel(const frt_packed_weight* w, int64_t p, const Scales& sc, const float* x,
                int64_t ldx, const float* xsum, int64_t m, float* out) {
  const int64_t k = w->k, groups = k / w->group;
  const auto* q = static_cast<const uint8_t*>(w->qdata) + p * (k / 2) * FRT_PANEL;
  int64_t r = 0;
  for (; r + 2 <= m; r += 2)
    int4_rows<2>(q, w, sc, x + r * ldx, ldx, xsum + r * groups, out + r * FRT_PANEL);
  if (r < m) int4_row1(q, w, sc, x + r * ldx, xsum + r * groups, out + r * FRT_PANEL);
}

}  // namespace

void int4_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                     const float* xsum, int64_t m, float* out) {
  int4_panel(w, p, StoredScales{w, p * (w->k / w->group) * FRT_PANEL}, x, ldx, xsum, m, out);
}

void int4s_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                      const float* xsum, int64_t m, float* out) {
  const auto* records =
      static_cast<const uint8_t*>(w->scales) + p * (w->k / FRT_SUPER_K) * FRT_SUPER4_RECORD;
  int4_panel(w, p, SuperScales{records}, x, ldx, xsum, m, out);
}

// Four accumulators (Note [Accumulator chains]); the tail is scalar.
float dot_f32_avx2(const float* x, const float* w, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(w + i + 8), a1);
    a2 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 16), _mm256_loadu_ps(w + i + 16), a2);
    a3 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 24), _mm256_loadu_ps(w + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8)
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(w + i), a0);
  float acc = hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) acc += x[i] * w[i];
  return acc;
}

namespace {
inline __m256 load_bf16x8(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
}  // namespace

float dot_bf16_avx2(const float* x, const uint16_t* w, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load_bf16x8(w + i), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8), load_bf16x8(w + i + 8), a1);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), load_bf16x8(w + i), a0);
  float acc = hsum(_mm256_add_ps(a0, a1));
  for (; i < n; ++i) {
    uint32_t bits = static_cast<uint32_t>(w[i]) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    acc += x[i] * f;
  }
  return acc;
}

}  // namespace frt::kern
