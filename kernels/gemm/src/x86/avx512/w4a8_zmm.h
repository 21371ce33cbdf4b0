// What the w4a8 forms' zmm tiles (x86/avx512/w4a8_blocks_zmm.cpp) and AMX tiles
// (x86/amx/blocks_amx.cpp) share: where a block's scale and min come from (int4_gemm's f16
// streams or the super records), and an oct's nibbles as bytes (Note [W4A8]).
#pragma once

#include <frt_kern/util.h>

#include <type_traits>

#include "gemm_tiles.h"
#include "x86/avx512/gemm_zmm.h"
#include "x86/prefetch.h"

namespace frt::kern {

// int4_gemm's f16 scales and (Mins) mins, one stream each.
template <bool Mins>
struct F16Blocks {
  static constexpr bool kMins = Mins;
  const uint16_t *sp, *mp;
  __m512 scale(int64_t b) const {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(sp + b * FRT_PANEL)));
  }
  __m512 min(int64_t b) const {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(mp + b * FRT_PANEL)));
  }
  void prefetch(int64_t b) const { prefetch_block_scales<Mins>(sp, mp, b); }
  // The next panel's streams.
  F16Blocks next_panel(const frt_packed_weight* w) const {
    const int64_t step = w->k / kGemmActBlock * FRT_PANEL;
    return {sp + step, Mins ? mp + step : nullptr};
  }
};

// int4_super_gemm: block b is group b % 8 of super record b / 8; scale = d * sc and
// min = -(dmin * m), both exact in f32 (the sign flipped by its bit, as the reference negates).
struct SuperBlocks {
  static constexpr bool kMins = true;
  const uint8_t* records;  // the panel's first
  static __m512 coded(const uint8_t* rec, int unit_at, int codes_at, int64_t g) {
    const __m512 unit =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + unit_at)));
    const __m128i codes =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + codes_at + g * FRT_PANEL));
    return _mm512_mul_ps(unit, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(codes)));
  }
  const uint8_t* record(int64_t b) const {
    return records + (b / FRT_SUPER4_GROUPS) * FRT_SUPER4_RECORD;
  }
  __m512 scale(int64_t b) const {
    return coded(record(b), 0, FRT_SUPER4_SC_AT, b % FRT_SUPER4_GROUPS);
  }
  __m512 min(int64_t b) const {
    const __m512 o = coded(record(b), FRT_SUPER4_DMIN_AT, FRT_SUPER4_M_AT, b % FRT_SUPER4_GROUPS);
    return _mm512_castsi512_ps(
        _mm512_xor_si512(_mm512_castps_si512(o), _mm512_set1_epi32(INT32_MIN)));
  }
  void prefetch(int64_t b) const { prefetch_super_record(records, b); }
  SuperBlocks next_panel(const frt_packed_weight* w) const {
    return {records + w->k / FRT_SUPER_K * FRT_SUPER4_RECORD};
  }
};

// Oct o's nibbles of one half (inputs 8o..8o+3 or 8o+4..8o+7) as bytes, merged for the int5
// forms with their fifth bits moved to bit 4: the low half's plane bit o up by 4 - o, the high
// half's bit 4 + o down by o (16-bit shifts: what crosses into the neighbouring byte misses
// bit 4).
template <bool Five, bool High>
__m512i nibbles(__m512i v, __m512i plane, int64_t o) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  const __m512i n = _mm512_and_si512(High ? _mm512_srli_epi16(v, 4) : v, low);
  if constexpr (!Five) return n;
  const __m512i top = High ? _mm512_srli_epi16(plane, static_cast<unsigned>(o))
                           : _mm512_slli_epi16(plane, static_cast<unsigned>(4 - o));
  return _mm512_ternarylogic_epi32(n, top, _mm512_set1_epi8(0x10), 0xF8);  // n | (top & 0x10)
}

// run(scales, five) with panel p's block scales (F16Blocks or SuperBlocks) and
// std::bool_constant<w is an int5 form>.
template <class Run>
void with_w4a8_scales(const frt_packed_weight* w, int64_t p, Run&& run) {
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
