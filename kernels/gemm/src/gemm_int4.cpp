// flashrt/gemm's linear over int4 weights (FRT_W_INT4_GEMM) with activations per block of 32:
// the w4a8 decode form. Built per variant like gemm_blocks.cpp (zmm with vpdpbusd, AVX2, scalar);
// every path computes the same integers and, without FMA contraction, the same fp32 bits.
//
// Note [W4A8]: the weights are nibbles q in [0, 15] (W = (q - 8) * s, or q * s + min), in groups
// of 32 inputs that coincide with the activation blocks (Note [W8A8 blocks]: a in [-127, 127],
// scale d per block). Unsigned nibbles are what vpmaddubsw wants as its unsigned operand, so no
// sign trick is needed, and a pair sums to at most 2 * 15 * 127 = 3810: the eight quads of a
// block add up in int16 (|sum| <= 30480) before one vpmaddwd widens them. The offset (8, or the
// min) is applied per block through the block's activation sum s_a:
//   symmetric: f += float(sum a q - 8 s_a) * (s * d)   (the subtraction is exact in int32)
//   with mins: f += float(sum a q) * (s * d);  f += min * (d * float(s_a)).
// Per 32 inputs a row streams 16 bytes of nibbles and 2 of scale (4 with a min): Q4_0's and
// Q4_1's sizes. A column's eight inputs 8o..8o+7 sit in four bytes, inputs i and i + 4 sharing a
// byte (frt_kernel_abi.h): masking the low nibbles of a 64-byte load gives all sixteen columns'
// inputs 8o..8o+3, shifting down the high ones 8o+4..8o+7, each against one broadcast
// activation quad. The zmm tile spends a load, two masks, a shift and two vpdpbusd per 128
// weights (the 3.1 layout, two columns to a byte, took a broadcast load, a variable shift, a mask
// and an activation broadcast per 64); the AVX2 tile reads the two column halves as two ymm.
#include <frt_kern/util.h>

#include <algorithm>

#include "gemm_isa.h"
#include "gemm_op.h"

namespace frt::kern {
namespace {

constexpr int64_t kOcts = kGemmActBlock / 8;  // octs (eight inputs) per block
constexpr int64_t kHalf = FRT_PANEL / 2;

#if defined(FRT_ZMM) || defined(__AVX2__)
// The scales (and mins) of block b + 8: streams of their own, read once per block, prefetched at
// the weights' distance (kGemmPrefetchAhead is 8 blocks of panel).
template <bool Mins>
inline void prefetch_block_scales(const uint16_t* sp, const uint16_t* mp, int64_t b) {
  _mm_prefetch(reinterpret_cast<const char*>(sp + (b + 8) * FRT_PANEL), _MM_HINT_T0);
  if constexpr (Mins)
    _mm_prefetch(reinterpret_cast<const char*>(mp + (b + 8) * FRT_PANEL), _MM_HINT_T0);
}
#endif

#if defined(FRT_ZMM)
template <int R, bool Mins>
void tile_int4_zmm(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                   const float* bias, float* tile) {
  const int64_t blocks = w->k / kGemmActBlock;
  const uint8_t* wp = static_cast<const uint8_t*>(w->qdata) + p * (w->k / 8) * 64;
  const uint16_t* sp = static_cast<const uint16_t*>(w->scales) + p * blocks * FRT_PANEL;
  const uint16_t* mp =
      Mins ? static_cast<const uint16_t*>(w->mins) + p * blocks * FRT_PANEL : nullptr;
  const int8_t* a[R];
  const float* d[R];
  const int32_t* sa[R];
  __m512 f[R];
  for (int r = 0; r < R; ++r) {
    a[r] = q.a + (r0 + r) * q.lda;
    d[r] = q.d + (r0 + r) * q.ldd;
    sa[r] = q.sum + (r0 + r) * q.ldd;
    f[r] = _mm512_setzero_ps();
  }
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i lo[R], hi[R];  // inputs 8o..8o+3 and 8o+4..8o+7: two chains per row
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
    const uint8_t* wb = wp + b * kOcts * 64;
    prefetch_block_scales<Mins>(sp, mp, b);
    for (int64_t o = 0; o < kOcts; ++o) {
      _mm_prefetch(reinterpret_cast<const char*>(wb + o * 64 + kGemmPrefetchAhead), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(wb + o * 64);
      const __m512i nl = _mm512_and_si512(v, low);
      const __m512i nh = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
      for (int r = 0; r < R; ++r) {
        int32_t q0, q1;
        std::memcpy(&q0, a[r] + b * kGemmActBlock + 8 * o, 4);
        std::memcpy(&q1, a[r] + b * kGemmActBlock + 8 * o + 4, 4);
        lo[r] = _mm512_dpbusd_epi32(lo[r], nl, _mm512_set1_epi32(q0));
        hi[r] = _mm512_dpbusd_epi32(hi[r], nh, _mm512_set1_epi32(q1));
      }
    }
    const __m512 s =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + b * FRT_PANEL)));
    __m512 m = _mm512_setzero_ps();
    if constexpr (Mins)
      m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mp + b * FRT_PANEL)));
    for (int r = 0; r < R; ++r) {
      __m512i i = _mm512_add_epi32(lo[r], hi[r]);
      if constexpr (!Mins) i = _mm512_sub_epi32(i, _mm512_set1_epi32(8 * sa[r][b]));
      f[r] = _mm512_add_ps(
          f[r], _mm512_mul_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(s, _mm512_set1_ps(d[r][b]))));
      if constexpr (Mins)
        f[r] = _mm512_add_ps(
            f[r], _mm512_mul_ps(m, _mm512_set1_ps(d[r][b] * static_cast<float>(sa[r][b]))));
    }
  }
  alignas(64) float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  const __m512 bv = _mm512_load_ps(bb);
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(tile + r * FRT_PANEL, _mm512_add_ps(f[r], bv));
}
#elif defined(__AVX2__)
template <int R, bool Mins>
void tile_int4_avx2(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                    const float* bias, float* tile) {
  const int64_t blocks = w->k / kGemmActBlock;
  const uint8_t* wp = static_cast<const uint8_t*>(w->qdata) + p * (w->k / 8) * 64;
  const uint16_t* sp = static_cast<const uint16_t*>(w->scales) + p * blocks * FRT_PANEL;
  const uint16_t* mp =
      Mins ? static_cast<const uint16_t*>(w->mins) + p * blocks * FRT_PANEL : nullptr;
  const int8_t* a[R];
  const float* d[R];
  const int32_t* sa[R];
  for (int r = 0; r < R; ++r) {
    a[r] = q.a + (r0 + r) * q.lda;
    d[r] = q.d + (r0 + r) * q.ldd;
    sa[r] = q.sum + (r0 + r) * q.ldd;
    for (int h = 0; h < 2; ++h) _mm256_store_ps(tile + r * FRT_PANEL + 8 * h, _mm256_setzero_ps());
  }
  const __m256i low = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < blocks; ++b) {
    __m256i acc[R][2];  // int16 pair sums per column half
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    const uint8_t* wb = wp + b * kOcts * 64;
    prefetch_block_scales<Mins>(sp, mp, b);
    for (int64_t o = 0; o < kOcts; ++o) {
      _mm_prefetch(reinterpret_cast<const char*>(wb + o * 64 + kGemmPrefetchAhead), _MM_HINT_T0);
      __m256i nl[2], nh[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + o * 64 + 32 * h));
        nl[h] = _mm256_and_si256(v, low);
        nh[h] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
      }
      for (int r = 0; r < R; ++r) {
        int32_t q0, q1;
        std::memcpy(&q0, a[r] + b * kGemmActBlock + 8 * o, 4);
        std::memcpy(&q1, a[r] + b * kGemmActBlock + 8 * o + 4, 4);
        const __m256i a0 = _mm256_set1_epi32(q0), a1 = _mm256_set1_epi32(q1);
        for (int h = 0; h < 2; ++h)
          acc[r][h] = _mm256_add_epi16(
              acc[r][h],
              _mm256_add_epi16(_mm256_maddubs_epi16(nl[h], a0), _mm256_maddubs_epi16(nh[h], a1)));
      }
    }
    const uint16_t* sb = sp + b * FRT_PANEL;
    const __m256 s[2] = {
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb))),
        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sb + kHalf)))};
    __m256 m[2] = {};
    if constexpr (Mins) {
      const uint16_t* mb = mp + b * FRT_PANEL;
      m[0] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mb)));
      m[1] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mb + kHalf)));
    }
    for (int r = 0; r < R; ++r) {
      const __m256 db = _mm256_set1_ps(d[r][b]);
      for (int h = 0; h < 2; ++h) {
        __m256i i = _mm256_madd_epi16(acc[r][h], ones);
        if constexpr (!Mins) i = _mm256_sub_epi32(i, _mm256_set1_epi32(8 * sa[r][b]));
        float* f = tile + r * FRT_PANEL + 8 * h;
        __m256 v = _mm256_add_ps(_mm256_load_ps(f),
                                 _mm256_mul_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(s[h], db)));
        if constexpr (Mins)
          v = _mm256_add_ps(
              v, _mm256_mul_ps(m[h], _mm256_set1_ps(d[r][b] * static_cast<float>(sa[r][b]))));
        _mm256_store_ps(f, v);
      }
    }
  }
  alignas(32) float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      float* f = tile + r * FRT_PANEL + 8 * h;
      _mm256_store_ps(f, _mm256_add_ps(_mm256_load_ps(f), _mm256_load_ps(bb + 8 * h)));
    }
}
#else
void tile_int4_ref(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                   int64_t rows, const float* bias, float* tile) {
  const int64_t blocks = w->k / kGemmActBlock;
  const uint8_t* wp = static_cast<const uint8_t*>(w->qdata) + p * (w->k / 8) * 64;
  const int64_t at0 = p * blocks * FRT_PANEL;
  float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* a = q.a + (r0 + r) * q.lda;
    const float* d = q.d + (r0 + r) * q.ldd;
    const int32_t* sa = q.sum + (r0 + r) * q.ldd;
    float f[FRT_PANEL] = {};
    for (int64_t b = 0; b < blocks; ++b) {
      int32_t acc[FRT_PANEL] = {};
      for (int64_t o = b * kOcts; o < (b + 1) * kOcts; ++o)
        for (int64_t c = 0; c < FRT_PANEL; ++c)
          for (int64_t j = 0; j < 4; ++j) {
            const uint8_t byte = wp[(o * FRT_PANEL + c) * 4 + j];
            acc[c] += (byte & 0x0f) * static_cast<int32_t>(a[8 * o + j]) +
                      (byte >> 4) * static_cast<int32_t>(a[8 * o + 4 + j]);
          }
      for (int64_t c = 0; c < FRT_PANEL; ++c) {
        const int64_t at = at0 + b * FRT_PANEL + c;
        const float s = scale_at(w->scales, at, FRT_F16);
        if (w->mins == nullptr) {
          f[c] = f[c] + static_cast<float>(acc[c] - 8 * sa[b]) * (s * d[b]);
        } else {
          f[c] = f[c] + static_cast<float>(acc[c]) * (s * d[b]);
          f[c] = f[c] + scale_at(w->mins, at, FRT_F16) * (d[b] * static_cast<float>(sa[b]));
        }
      }
    }
    for (int64_t c = 0; c < FRT_PANEL; ++c) tile[r * FRT_PANEL + c] = f[c] + bb[c];
  }
}
#endif

}  // namespace

void block_sums(const int8_t* a, int64_t k, int32_t* sum) {
  for (int64_t b = 0; b * kGemmActBlock < k; ++b) {
    int32_t s = 0;
    for (int64_t i = b * kGemmActBlock; i < std::min(k, (b + 1) * kGemmActBlock); ++i) s += a[i];
    sum[b] = s;
  }
}

void gemm_tile_int4(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                    int64_t rows, const float* bias, float* tile) {
#if defined(FRT_ZMM)
  with_tile_rows(rows, [&](auto r) {
    if (w->mins != nullptr)
      tile_int4_zmm<decltype(r)::value, true>(w, p, q, r0, bias, tile);
    else
      tile_int4_zmm<decltype(r)::value, false>(w, p, q, r0, bias, tile);
  });
#elif defined(__AVX2__)
  with_tile_rows(rows, [&](auto r) {
    if (w->mins != nullptr)
      tile_int4_avx2<decltype(r)::value, true>(w, p, q, r0, bias, tile);
    else
      tile_int4_avx2<decltype(r)::value, false>(w, p, q, r0, bias, tile);
  });
#else
  tile_int4_ref(w, p, q, r0, rows, bias, tile);
#endif
}

}  // namespace frt::kern
