// The int4 form (Note [W4A8] in ref/w4a8_blocks_ref.cpp) with AVX2: the 4-row x FRT_PANEL tile,
// the two column halves of a 64-byte oct as two ymm, int16 sums per block widened once by
// vpmaddwd, the panel and scales prefetched. The same integers and fp32 bits as the reference.
// Where a block's scale and min come from is a parameter: f16 streams (int4_gemm) or the super
// records (int4_super_gemm).
#include <frt_kern/util.h>

#include "gemm_tiles.h"
#include "x86/avx2/gemm_avx2.h"
#include "x86/prefetch.h"

namespace frt::kern {
namespace {

constexpr int64_t kHalf = FRT_PANEL / 2;

// int4_gemm's f16 scales and (Mins) mins, one stream each, as two column halves.
template <bool Mins>
struct F16Blocks {
  static constexpr bool kMins = Mins;
  const uint16_t *sp, *mp;
  static __m256 half(const uint16_t* at) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
  }
  __m256 scale(int64_t b, int h) const { return half(sp + b * FRT_PANEL + h * kHalf); }
  __m256 min(int64_t b, int h) const { return half(mp + b * FRT_PANEL + h * kHalf); }
  void prefetch(int64_t b) const { prefetch_block_scales<Mins>(sp, mp, b); }
};

// int4_super_gemm: block b is group b % 8 of super record b / 8; scale = d * sc and
// min = -(dmin * m), both exact in f32 (the sign flipped by its bit, as the reference negates).
struct SuperBlocks {
  static constexpr bool kMins = true;
  const uint8_t* records;  // the panel's first
  static __m256 coded(const uint8_t* rec, int unit_at, int codes_at, int64_t g, int h) {
    const __m256 unit = _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + unit_at + 2 * h * kHalf)));
    const __m128i codes = _mm_loadl_epi64(
        reinterpret_cast<const __m128i*>(rec + codes_at + g * FRT_PANEL + h * kHalf));
    return _mm256_mul_ps(unit, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(codes)));
  }
  const uint8_t* record(int64_t b) const {
    return records + (b / FRT_SUPER4_GROUPS) * FRT_SUPER4_RECORD;
  }
  __m256 scale(int64_t b, int h) const {
    return coded(record(b), 0, FRT_SUPER4_SC_AT, b % FRT_SUPER4_GROUPS, h);
  }
  __m256 min(int64_t b, int h) const {
    const __m256 o =
        coded(record(b), FRT_SUPER4_DMIN_AT, FRT_SUPER4_M_AT, b % FRT_SUPER4_GROUPS, h);
    return _mm256_castsi256_ps(
        _mm256_xor_si256(_mm256_castps_si256(o), _mm256_set1_epi32(INT32_MIN)));
  }
  void prefetch(int64_t b) const { prefetch_super_record(records, b); }
};

// One column half of oct o's nibbles of one half of the oct (inputs 8o..8o+3 or 8o+4..8o+7) as
// bytes, merged for the int5 forms with their fifth bits (see the zmm tile).
template <bool Five, bool High>
__m256i nibbles(__m256i v, __m256i plane, int64_t o) {
  const __m256i low = _mm256_set1_epi8(0x0f);
  const __m256i n = _mm256_and_si256(High ? _mm256_srli_epi16(v, 4) : v, low);
  if constexpr (!Five) return n;
  const __m256i top = High ? _mm256_srl_epi16(plane, _mm_cvtsi64_si128(o))
                           : _mm256_sll_epi16(plane, _mm_cvtsi64_si128(4 - o));
  return _mm256_or_si256(n, _mm256_and_si256(top, _mm256_set1_epi8(0x10)));
}

template <int R, class Scales, bool Five>
void w4a8_blocks_tile_avx2(const frt_packed_weight* w, int64_t p, const Scales& sc,
                           const BlockRows& q, int64_t r0, const float* bias, float* tile) {
  constexpr bool Mins = Scales::kMins;
  constexpr int64_t kBlockBytes = Five ? FRT_INT5_BLOCK : kOctsPerBlock * 64;
  constexpr int32_t kOffset = Five ? 16 : 8;  // the symmetric forms' zero
  const int64_t blocks = w->k / kGemmActBlock;
  const uint8_t* wp = static_cast<const uint8_t*>(w->qdata) + p * blocks * kBlockBytes;
  const int8_t* a[R];
  const float* d[R];
  const int32_t* sa[R];
  for (int r = 0; r < R; ++r) {
    a[r] = q.a + (r0 + r) * q.lda;
    d[r] = q.d + (r0 + r) * q.ldd;
    sa[r] = q.sum + (r0 + r) * q.ldd;
    for (int h = 0; h < 2; ++h) _mm256_store_ps(tile + r * FRT_PANEL + 8 * h, _mm256_setzero_ps());
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < blocks; ++b) {
    // Per column half: int16 pair sums (int4: a block's reach 30480), or for the int5 forms
    // int32, widened per oct (a block of 5-bit products would reach 62992).
    __m256i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    const uint8_t* wb = wp + b * kBlockBytes;
    sc.prefetch(b);
    __m256i plane[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    if constexpr (Five) {
      _mm_prefetch(reinterpret_cast<const char*>(wb + FRT_INT6_PLANES_AT + kGemmPrefetchAhead),
                   _MM_HINT_T0);
      for (int h = 0; h < 2; ++h)
        plane[h] =
            _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + FRT_INT6_PLANES_AT + 32 * h));
    }
    for (int64_t o = 0; o < kOctsPerBlock; ++o) {
      _mm_prefetch(reinterpret_cast<const char*>(wb + o * 64 + kGemmPrefetchAhead), _MM_HINT_T0);
      __m256i nl[2], nh[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + o * 64 + 32 * h));
        nl[h] = nibbles<Five, false>(v, plane[h], o);
        nh[h] = nibbles<Five, true>(v, plane[h], o);
      }
      for (int r = 0; r < R; ++r) {
        int32_t q0, q1;
        std::memcpy(&q0, a[r] + b * kGemmActBlock + 8 * o, 4);
        std::memcpy(&q1, a[r] + b * kGemmActBlock + 8 * o + 4, 4);
        const __m256i a0 = _mm256_set1_epi32(q0), a1 = _mm256_set1_epi32(q1);
        for (int h = 0; h < 2; ++h) {
          const __m256i pair =
              _mm256_add_epi16(_mm256_maddubs_epi16(nl[h], a0), _mm256_maddubs_epi16(nh[h], a1));
          if constexpr (Five)
            acc[r][h] = _mm256_add_epi32(acc[r][h], _mm256_madd_epi16(pair, ones));
          else
            acc[r][h] = _mm256_add_epi16(acc[r][h], pair);
        }
      }
    }
    const __m256 s[2] = {sc.scale(b, 0), sc.scale(b, 1)};
    __m256 m[2] = {};
    if constexpr (Mins) m[0] = sc.min(b, 0), m[1] = sc.min(b, 1);
    for (int r = 0; r < R; ++r) {
      const __m256 db = _mm256_set1_ps(d[r][b]);
      for (int h = 0; h < 2; ++h) {
        __m256i i = Five ? acc[r][h] : _mm256_madd_epi16(acc[r][h], ones);
        if constexpr (!Mins) i = _mm256_sub_epi32(i, _mm256_set1_epi32(kOffset * sa[r][b]));
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

}  // namespace

void w4a8_blocks_tile_4x16_avx2(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                                int64_t r0, int64_t rows, const float* bias, float* tile) {
  const auto run = [&](const auto& sc, auto five) {
    with_tile_rows(rows, [&](auto r) {
      w4a8_blocks_tile_avx2<decltype(r)::value, std::decay_t<decltype(sc)>, decltype(five)::value>(
          w, p, sc, q, r0, bias, tile);
    });
  };
  const bool five = gemm_int5_format(w->format);
  if (gemm_super4_format(w->format)) {
    const SuperBlocks sc{super_records(w, p)};
    return five ? run(sc, std::true_type{}) : run(sc, std::false_type{});
  }
  const int64_t at = p * (w->k / kGemmActBlock) * FRT_PANEL;
  const auto* sp = static_cast<const uint16_t*>(w->scales) + at;
  const auto* mp = w->mins != nullptr ? static_cast<const uint16_t*>(w->mins) + at : nullptr;
  if (mp != nullptr) {
    const F16Blocks<true> sc{sp, mp};
    return five ? run(sc, std::true_type{}) : run(sc, std::false_type{});
  }
  const F16Blocks<false> sc{sp, mp};
  return five ? run(sc, std::true_type{}) : run(sc, std::false_type{});
}

}  // namespace frt::kern
