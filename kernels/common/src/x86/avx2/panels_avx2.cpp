// AVX2 + FMA panels. One panel is FRT_PANEL = 16 output channels = two ymm columns; each packed
// row of the panel is one k (int8: 16 bytes) or a pair of k (int4: 16 bytes of two nibbles).
//
// Note [Accumulator chains]: at decode rows the loop is bound by memory, but a single FMA chain
// per ymm would cap it at one packed row per FMA latency (4 cycles on Zen 3, ~4 B/cycle/core),
// near the DRAM rate of one core. So fewer rows get more independent accumulators (KU): every
// instantiation keeps about eight chains in flight.
#include <frt_kern/panels.h>
#include <immintrin.h>

namespace frt::kern {
namespace {

inline __m256 load_i8x8(const int8_t* p) {
  return _mm256_cvtepi32_ps(
      _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
}

template <int MR, int KU>
void int8_rows(const int8_t* q, int64_t k, const float* x, int64_t ldx, const float* scale,
               float* out) {
  __m256 acc[KU][MR][2];
  for (int u = 0; u < KU; ++u)
    for (int r = 0; r < MR; ++r) acc[u][r][0] = acc[u][r][1] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + KU <= k; i += KU) {
    for (int u = 0; u < KU; ++u) {
      const int8_t* row = q + (i + u) * FRT_PANEL;
      const __m256 w0 = load_i8x8(row), w1 = load_i8x8(row + 8);
      for (int r = 0; r < MR; ++r) {
        const __m256 xb = _mm256_broadcast_ss(x + r * ldx + i + u);
        acc[u][r][0] = _mm256_fmadd_ps(w0, xb, acc[u][r][0]);
        acc[u][r][1] = _mm256_fmadd_ps(w1, xb, acc[u][r][1]);
      }
    }
  }
  for (; i < k; ++i) {
    const int8_t* row = q + i * FRT_PANEL;
    const __m256 w0 = load_i8x8(row), w1 = load_i8x8(row + 8);
    for (int r = 0; r < MR; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * ldx + i);
      acc[0][r][0] = _mm256_fmadd_ps(w0, xb, acc[0][r][0]);
      acc[0][r][1] = _mm256_fmadd_ps(w1, xb, acc[0][r][1]);
    }
  }
  const __m256 s0 = _mm256_loadu_ps(scale), s1 = _mm256_loadu_ps(scale + 8);
  for (int r = 0; r < MR; ++r) {
    __m256 a0 = acc[0][r][0], a1 = acc[0][r][1];
    for (int u = 1; u < KU; ++u) {
      a0 = _mm256_add_ps(a0, acc[u][r][0]);
      a1 = _mm256_add_ps(a1, acc[u][r][1]);
    }
    _mm256_storeu_ps(out + r * FRT_PANEL, _mm256_mul_ps(a0, s0));
    _mm256_storeu_ps(out + r * FRT_PANEL + 8, _mm256_mul_ps(a1, s1));
  }
}

// KU packed rows (k pairs) per step; even and odd k keep separate accumulators (Note
// [Accumulator chains]). The zero point is applied once per group through the row's group sum:
// sum (q - z) s x = s (sum q x - z sum x).
template <int MR, int KU>
void int4_rows(const uint8_t* q, int64_t k, int64_t group, const float* x, int64_t ldx,
               const float* xsum, const float* scale, const float* zero, float* out) {
  const int64_t groups = k / group, pairs = group / 2, ldxs = groups;
  const __m256i low4 = _mm256_set1_epi32(0x0f);
  __m256 res[MR][2];
  for (int r = 0; r < MR; ++r) res[r][0] = res[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* qg = q + g * pairs * FRT_PANEL;
    const float* xg = x + g * group;
    __m256 acc[2 * KU][MR][2];
    for (int u = 0; u < 2 * KU; ++u)
      for (int r = 0; r < MR; ++r) acc[u][r][0] = acc[u][r][1] = _mm256_setzero_ps();
    for (int64_t t = 0; t < pairs; t += KU) {  // pairs is a multiple of 16, KU <= 2
      for (int u = 0; u < KU; ++u) {
        const uint8_t* row = qg + (t + u) * FRT_PANEL;
        const __m256i v0 =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row)));
        const __m256i v1 =
            _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + 8)));
        const __m256 e0 = _mm256_cvtepi32_ps(_mm256_and_si256(v0, low4));
        const __m256 o0 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v0, 4));
        const __m256 e1 = _mm256_cvtepi32_ps(_mm256_and_si256(v1, low4));
        const __m256 o1 = _mm256_cvtepi32_ps(_mm256_srli_epi32(v1, 4));
        for (int r = 0; r < MR; ++r) {
          const float* xr = xg + r * ldx + 2 * (t + u);
          const __m256 xe = _mm256_broadcast_ss(xr), xo = _mm256_broadcast_ss(xr + 1);
          acc[2 * u][r][0] = _mm256_fmadd_ps(e0, xe, acc[2 * u][r][0]);
          acc[2 * u][r][1] = _mm256_fmadd_ps(e1, xe, acc[2 * u][r][1]);
          acc[2 * u + 1][r][0] = _mm256_fmadd_ps(o0, xo, acc[2 * u + 1][r][0]);
          acc[2 * u + 1][r][1] = _mm256_fmadd_ps(o1, xo, acc[2 * u + 1][r][1]);
        }
      }
    }
    const float* sg = scale + g * FRT_PANEL;
    const float* zg = zero + g * FRT_PANEL;
    const __m256 s0 = _mm256_loadu_ps(sg), s1 = _mm256_loadu_ps(sg + 8);
    const __m256 z0 = _mm256_loadu_ps(zg), z1 = _mm256_loadu_ps(zg + 8);
    for (int r = 0; r < MR; ++r) {
      __m256 a0 = acc[0][r][0], a1 = acc[0][r][1];
      for (int u = 1; u < 2 * KU; ++u) {
        a0 = _mm256_add_ps(a0, acc[u][r][0]);
        a1 = _mm256_add_ps(a1, acc[u][r][1]);
      }
      const __m256 xs = _mm256_broadcast_ss(xsum + r * ldxs + g);
      res[r][0] = _mm256_fmadd_ps(s0, _mm256_fnmadd_ps(z0, xs, a0), res[r][0]);
      res[r][1] = _mm256_fmadd_ps(s1, _mm256_fnmadd_ps(z1, xs, a1), res[r][1]);
    }
  }
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(out + r * FRT_PANEL, res[r][0]);
    _mm256_storeu_ps(out + r * FRT_PANEL + 8, res[r][1]);
  }
}

}  // namespace

// Rows go in blocks of four (int8) or two (int4); the panel is re-read from L1/L2 for each
// block, so DRAM still sees every weight byte once per call.
void int8_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                     float* out) {
  const int64_t k = w->k;
  const auto* q = static_cast<const int8_t*>(w->qdata) + p * k * FRT_PANEL;
  const float* scale = w->scales + p * FRT_PANEL;
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) int8_rows<4, 1>(q, k, x + r * ldx, ldx, scale, out + r * FRT_PANEL);
  const float* xr = x + r * ldx;
  float* outr = out + r * FRT_PANEL;
  switch (m - r) {
    case 3: int8_rows<3, 1>(q, k, xr, ldx, scale, outr); break;
    case 2: int8_rows<2, 2>(q, k, xr, ldx, scale, outr); break;
    case 1: int8_rows<1, 4>(q, k, xr, ldx, scale, outr); break;
    default: break;
  }
}

void int4_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                     const float* xsum, int64_t m, float* out) {
  const int64_t k = w->k, group = w->group, groups = k / group;
  const auto* q = static_cast<const uint8_t*>(w->qdata) + p * (k / 2) * FRT_PANEL;
  const float* scale = w->scales + p * groups * FRT_PANEL;
  const float* zero = w->zeros + p * groups * FRT_PANEL;
  int64_t r = 0;
  for (; r + 2 <= m; r += 2)
    int4_rows<2, 1>(q, k, group, x + r * ldx, ldx, xsum + r * groups, scale, zero,
                    out + r * FRT_PANEL);
  if (r < m)
    int4_rows<1, 2>(q, k, group, x + r * ldx, ldx, xsum + r * groups, scale, zero,
                    out + r * FRT_PANEL);
}

}  // namespace frt::kern
