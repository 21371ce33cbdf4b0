// AVX-512 panels (the avx512vnni variant): the weight-only forms, fp activations. One panel is
// FRT_PANEL = 16 output channels = one zmm of fp32, so each packed row (int8: one k; int4: a pair
// of k) is 16 bytes widened to one zmm, half the converts and FMAs of the AVX2 panels per weight.
// The same sums as panels_avx2.cpp (Note [Accumulator chains] there): a single row runs four k
// per step into separate accumulators, a block of rows two per row; with 32 registers the
// running results stay in registers, and rows go in blocks of eight (in_eights), so each widened
// weight feeds sixteen FMAs where a block of four fed eight.
// CPUs without AVX-512 test these through SIMDe (Note [Emulated zmm variant], zmm_simde.h).
#include <frt_kern/hsum.h>
#include <frt_kern/panel_prefetch.h>
#include <frt_kern/panels.h>
#include <frt_kern/zmm.h>
#include <frt_kern/zmm_scales.h>

namespace frt::kern {
namespace {

inline __m512 load_i8x16(const int8_t* p) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

inline __m512 bcast(const float* p) { return _mm512_set1_ps(*p); }

inline void prefetch(const void* p) {
  _mm_prefetch(static_cast<const char*>(p) + kPrefetchBytes, _MM_HINT_T0);
}

// The sum of k packed int8 rows times x, four k per step into four accumulators.
inline __m512 int8_sum1(const int8_t* q, int64_t i0, int64_t i1, const float* x) {
  __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
  int64_t i = i0;
  for (; i + 4 <= i1; i += 4) {
    const int8_t* r = q + i * FRT_PANEL;
    prefetch(r);
    a = _mm512_fmadd_ps(load_i8x16(r), bcast(x + i), a);
    b = _mm512_fmadd_ps(load_i8x16(r + 16), bcast(x + i + 1), b);
    c = _mm512_fmadd_ps(load_i8x16(r + 32), bcast(x + i + 2), c);
    d = _mm512_fmadd_ps(load_i8x16(r + 48), bcast(x + i + 3), d);
  }
  for (; i < i1; ++i) a = _mm512_fmadd_ps(load_i8x16(q + i * FRT_PANEL), bcast(x + i), a);
  return _mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d));
}

// The same for MR rows sharing each widened row; even and odd k accumulate apart. Inlined, so
// the 2 * MR accumulators stay in registers across a group's call (a call of eight rows out of
// line zeroed and stored them through the stack once per group: 20-30% of a group of 64).
template <int MR>
[[gnu::always_inline]] inline void int8_sums(const int8_t* q, int64_t i0, int64_t i1,
                                             const float* x, int64_t ldx, __m512 (&sum)[MR]) {
  __m512 ev[MR], od[MR];
  for (int r = 0; r < MR; ++r) ev[r] = od[r] = _mm512_setzero_ps();
  int64_t i = i0;
  for (; i + 2 <= i1; i += 2) {
    const int8_t* row = q + i * FRT_PANEL;
    prefetch_block(row, i);
    const __m512 w0 = load_i8x16(row), w1 = load_i8x16(row + 16);
    for (int r = 0; r < MR; ++r) {
      ev[r] = _mm512_fmadd_ps(w0, bcast(x + r * ldx + i), ev[r]);
      od[r] = _mm512_fmadd_ps(w1, bcast(x + r * ldx + i + 1), od[r]);
    }
  }
  if (i < i1) {
    const __m512 w0 = load_i8x16(q + i * FRT_PANEL);
    for (int r = 0; r < MR; ++r) ev[r] = _mm512_fmadd_ps(w0, bcast(x + r * ldx + i), ev[r]);
  }
  for (int r = 0; r < MR; ++r) sum[r] = _mm512_add_ps(ev[r], od[r]);
}

// One packed int4 row (16 columns, k and k+1) as fp32: even k in the low nibbles, odd k high.
struct Nibbles {
  __m512 even, odd;
};
// The even nibbles are looked up (vpermps reads only the low four bits of each lane's index, so
// no mask is needed), the odd ones shifted and converted. At one row the panel is bound by these
// uops beside its two FMAs: on Intel's cores the widening and the lookup take the shuffle port and
// the shift and one convert the port-0-only units, where the mask and two converts made it one
// more uop with three of them on port 0 (on the AMX Xeon 9-23% more weights a second from L2, by
// form; not measured on AMD). A nibble becomes the same exact float: the sums are unchanged.
inline Nibbles load_nibbles(const uint8_t* row) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row)));
  const __m512 values = _mm512_setr_ps(0.f, 1.f, 2.f, 3.f, 4.f, 5.f, 6.f, 7.f, 8.f, 9.f, 10.f, 11.f,
                                       12.f, 13.f, 14.f, 15.f);
  return {_mm512_permutexvar_ps(v, values), _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4))};
}

template <typename Scales>
void int4_row1(const uint8_t* q, const frt_packed_weight* w, const Scales& sc, const float* x,
               const float* xsum, float* out) {
  const int64_t groups = w->k / w->group, pairs = w->group / 2;
  __m512 res = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* qg = q + g * pairs * FRT_PANEL;
    const float* xg = x + g * w->group;
    __m512 e = _mm512_setzero_ps(), o = e, f = e, p = e;
    for (int64_t t = 0; t < pairs; t += 2) {  // pairs is 16, 32 or 64
      prefetch(qg + t * FRT_PANEL);
      const float* xt = xg + 2 * t;
      const Nibbles a = load_nibbles(qg + t * FRT_PANEL);
      const Nibbles b = load_nibbles(qg + (t + 1) * FRT_PANEL);
      e = _mm512_fmadd_ps(a.even, bcast(xt), e);
      o = _mm512_fmadd_ps(a.odd, bcast(xt + 1), o);
      f = _mm512_fmadd_ps(b.even, bcast(xt + 2), f);
      p = _mm512_fmadd_ps(b.odd, bcast(xt + 3), p);
    }
    res = apply_group(sc, g, xsum[g], _mm512_add_ps(_mm512_add_ps(e, o), _mm512_add_ps(f, p)), res);
  }
  _mm512_storeu_ps(out, res);
}

template <int MR, typename Scales>
void int4_rows(const uint8_t* q, const frt_packed_weight* w, const Scales& sc, const float* x,
               int64_t ldx, const float* xsum, float* out) {
  const int64_t groups = w->k / w->group, pairs = w->group / 2;
  __m512 res[MR];
  for (int r = 0; r < MR; ++r) res[r] = _mm512_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* qg = q + g * pairs * FRT_PANEL;
    __m512 ev[MR], od[MR];
    for (int r = 0; r < MR; ++r) ev[r] = od[r] = _mm512_setzero_ps();
    for (int64_t t = 0; t < pairs; ++t) {
      prefetch_block(qg + t * FRT_PANEL, t);
      const Nibbles a = load_nibbles(qg + t * FRT_PANEL);
      for (int r = 0; r < MR; ++r) {
        const float* xt = x + r * ldx + g * w->group + 2 * t;
        ev[r] = _mm512_fmadd_ps(a.even, bcast(xt), ev[r]);
        od[r] = _mm512_fmadd_ps(a.odd, bcast(xt + 1), od[r]);
      }
    }
    for (int r = 0; r < MR; ++r)
      res[r] = apply_group(sc, g, xsum[r * groups + g], _mm512_add_ps(ev[r], od[r]), res[r]);
  }
  for (int r = 0; r < MR; ++r) _mm512_storeu_ps(out + r * FRT_PANEL, res[r]);
}

}  // namespace

void int8_panel_avx512(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                       int64_t m, float* out) {
  const int64_t k = w->k;
  const auto* q = static_cast<const int8_t*>(w->qdata) + p * k * FRT_PANEL;
  const __m512 scale = _mm512_loadu_ps(static_cast<const float*>(w->scales) + p * FRT_PANEL);
  in_eights(
      m,
      [&](auto mr, int64_t r) {
        constexpr int MR = decltype(mr)::value;
        __m512 sum[MR];
        int8_sums<MR>(q, 0, k, x + r * ldx, ldx, sum);
        for (int i = 0; i < MR; ++i)
          _mm512_storeu_ps(out + (r + i) * FRT_PANEL, _mm512_mul_ps(sum[i], scale));
      },
      [&](int64_t r) {
        _mm512_storeu_ps(out + r * FRT_PANEL,
                         _mm512_mul_ps(int8_sum1(q, 0, k, x + r * ldx), scale));
      });
}

namespace {

// Each group's sum is scaled into the running result as it closes (group % 4 == 0).
template <typename Scales>
void int8g_panel(const frt_packed_weight* w, int64_t p, const Scales& sc, const float* x,
                 int64_t ldx, int64_t m, float* out) {
  const int64_t k = w->k, group = w->group, groups = k / group;
  const auto* q = static_cast<const int8_t*>(w->qdata) + p * k * FRT_PANEL;
  in_eights(
      m,
      [&](auto mr, int64_t r) {
        constexpr int MR = decltype(mr)::value;
        __m512 res[MR], sum[MR];
        for (int i = 0; i < MR; ++i) res[i] = _mm512_setzero_ps();
        for (int64_t g = 0; g < groups; ++g) {
          int8_sums<MR>(q, g * group, (g + 1) * group, x + r * ldx, ldx, sum);
          const __m512 s = sc.scale(g);
          for (int i = 0; i < MR; ++i) res[i] = _mm512_fmadd_ps(s, sum[i], res[i]);
        }
        for (int i = 0; i < MR; ++i) _mm512_storeu_ps(out + (r + i) * FRT_PANEL, res[i]);
      },
      [&](int64_t r) {
        __m512 res = _mm512_setzero_ps();
        for (int64_t g = 0; g < groups; ++g)
          res = _mm512_fmadd_ps(sc.scale(g), int8_sum1(q, g * group, (g + 1) * group, x + r * ldx),
                                res);
        _mm512_storeu_ps(out + r * FRT_PANEL, res);
      });
}

}  // namespace

void int8g_panel_avx512(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                        int64_t m, float* out) {
  int8g_panel(w, p, StoredScales{w, p * (w->k / w->group) * FRT_PANEL}, x, ldx, m, out);
}

void int8s_panel_avx512(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                        int64_t m, float* out) {
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
  in_eights(
      m,
      [&](auto mr, int64_t r) {
        int4_rows<decltype(mr)::value>(q, w, sc, x + r * ldx, ldx, xsum + r * groups,
                                       out + r * FRT_PANEL);
      },
      [&](int64_t r) { int4_row1(q, w, sc, x + r * ldx, xsum + r * groups, out + r * FRT_PANEL); });
}

}  // namespace

void int4_panel_avx512(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                       const float* xsum, int64_t m, float* out) {
  int4_panel(w, p, StoredScales{w, p * (w->k / w->group) * FRT_PANEL}, x, ldx, xsum, m, out);
}

void int4s_panel_avx512(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                        const float* xsum, int64_t m, float* out) {
  const auto* records =
      static_cast<const uint8_t*>(w->scales) + p * (w->k / FRT_SUPER_K) * FRT_SUPER4_RECORD;
  int4_panel(w, p, SuperScales{records}, x, ldx, xsum, m, out);
}

namespace {

// The first n < 16 lanes.
inline __mmask16 first(int64_t n) { return static_cast<__mmask16>((1u << n) - 1u); }

inline __m512 bf16x16(__m256i h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

}  // namespace

// Four accumulators (Note [Accumulator chains]); the tail is one masked step.
float dot_f32_avx512(const float* x, const float* w, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16), _mm512_loadu_ps(w + i + 16), a1);
    a2 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 32), _mm512_loadu_ps(w + i + 32), a2);
    a3 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 48), _mm512_loadu_ps(w + i + 48), a3);
  }
  for (; i + 16 <= n; i += 16)
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i), a0);
  if (i < n) {
    const __mmask16 k = first(n - i);
    a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, x + i), _mm512_maskz_loadu_ps(k, w + i), a1);
  }
  return hsum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

float dot_bf16_avx512(const float* x, const uint16_t* w, int64_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i),
                         bf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i))), a0);
    a1 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i + 16),
                         bf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i + 16))),
                         a1);
  }
  for (; i + 16 <= n; i += 16)
    a0 = _mm512_fmadd_ps(_mm512_loadu_ps(x + i),
                         bf16x16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + i))), a0);
  if (i < n) {
    const __mmask16 k = first(n - i);
    a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, x + i),
                         bf16x16(_mm256_maskz_loadu_epi16(k, w + i)), a1);
  }
  return hsum(_mm512_add_ps(a0, a1));
}

}  // namespace frt::kern
