// Q6_K's six-bit values (Note [W6A8] in ref/w6a8_blocks_ref.cpp) with zmm: the 4-row x FRT_PANEL
// tile; per oct one 64-byte load of nibbles, the oct's top bits out of the block's two planes by
// a 16-bit shift and one ternary-logic merge ((nibble) | (plane & 0x30)), and one vpdpbusd per
// half oct in four chains (a group's low and high halves); the epilogue in the reference's order,
// so the bits agree with every variant.
#include <frt_kern/util.h>

#include "gemm_tiles.h"
#include "x86/avx512/gemm_zmm.h"
#include "x86/prefetch.h"

namespace frt::kern {
namespace {

// The top two bits of oct t (bits 2t..2t+1 of each plane byte) moved to bits 4..5: a 16-bit
// shift, whose bits crossing into the neighbouring byte fall outside 4..5 (masked by the caller).
template <int T>
__m512i top_bits(__m512i plane) {
  if constexpr (T == 0) return _mm512_slli_epi16(plane, 4);
  if constexpr (T == 1) return _mm512_slli_epi16(plane, 2);
  if constexpr (T == 2) return plane;
  return _mm512_srli_epi16(plane, 2);
}

// Sixteen columns' scales of group g of a record: d * sc, exact in f32.
inline __m512 group_scale(const uint8_t* rec, int64_t g) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec)));
  const __m128i codes =
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + FRT_SUPER8_SC_AT + g * FRT_PANEL));
  return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes)));
}

template <int R, int T>
void oct(const uint8_t* wb, __m512i plane0, __m512i plane1, const int8_t* const* a, int64_t at,
         __m512i (&lo)[R], __m512i (&hi)[R]) {
  const __m512i low = _mm512_set1_epi8(0x0f), top = _mm512_set1_epi8(0x30);
  const __m512i v = _mm512_loadu_si512(wb + 64 * T);
  // u = nibble | (plane's bits & 0x30): ternary logic A | (B & C) is 0xF8.
  const __m512i ul =
      _mm512_ternarylogic_epi32(_mm512_and_si512(v, low), top_bits<T>(plane0), top, 0xF8);
  const __m512i uh = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(v, 4), low),
                                               top_bits<T>(plane1), top, 0xF8);
  for (int r = 0; r < R; ++r) {
    int32_t q0, q1;
    std::memcpy(&q0, a[r] + at + 8 * T, 4);
    std::memcpy(&q1, a[r] + at + 8 * T + 4, 4);
    lo[r] = _mm512_dpbusd_epi32(lo[r], ul, _mm512_set1_epi32(q0));
    hi[r] = _mm512_dpbusd_epi32(hi[r], uh, _mm512_set1_epi32(q1));
  }
}

template <int R>
void w6a8_blocks_tile_zmm(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                          const float* bias, float* tile) {
  const int64_t blocks = w->k / kGemmActBlock;
  const uint8_t* wp = static_cast<const uint8_t*>(w->qdata) + p * blocks * FRT_INT6_BLOCK;
  const uint8_t* records = super8_records(w, p);
  const int8_t* a[R];
  const float* d[R];
  const int32_t *sa[R], *ha[R];
  __m512 f[R];
  for (int r = 0; r < R; ++r) {
    a[r] = q.a + (r0 + r) * q.lda;
    d[r] = q.d + (r0 + r) * q.ldd;
    sa[r] = q.sum + (r0 + r) * q.ldd;
    ha[r] = q.half + (r0 + r) * q.ldd;
    f[r] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = wp + b * FRT_INT6_BLOCK;
    for (int64_t line = 0; line < FRT_INT6_BLOCK; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(wb + line + kGemmPrefetchAhead), _MM_HINT_T0);
    if (b % FRT_SUPER4_GROUPS == 0)  // the next super-block's record, 288 bytes
      for (int64_t line = 0; line < FRT_SUPER8_RECORD; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(
                         records + (b / FRT_SUPER4_GROUPS + 1) * FRT_SUPER8_RECORD + line),
                     _MM_HINT_T0);
    const __m512i plane0 = _mm512_loadu_si512(wb + FRT_INT6_PLANES_AT);
    const __m512i plane1 = _mm512_loadu_si512(wb + FRT_INT6_PLANES_AT + 64);
    __m512i lo0[R], hi0[R], lo1[R], hi1[R];  // groups 0 (octs 0, 1) and 1 (octs 2, 3)
    for (int r = 0; r < R; ++r) lo0[r] = hi0[r] = lo1[r] = hi1[r] = _mm512_setzero_si512();
    const int64_t at = b * kGemmActBlock;
    oct<R, 0>(wb, plane0, plane1, a, at, lo0, hi0);
    oct<R, 1>(wb, plane0, plane1, a, at, lo0, hi0);
    oct<R, 2>(wb, plane0, plane1, a, at, lo1, hi1);
    oct<R, 3>(wb, plane0, plane1, a, at, lo1, hi1);
    const uint8_t* rec = records + (b / FRT_SUPER4_GROUPS) * FRT_SUPER8_RECORD;
    const int64_t g = 2 * (b % FRT_SUPER4_GROUPS);
    const __m512 s0 = group_scale(rec, g), s1 = group_scale(rec, g + 1);
    for (int r = 0; r < R; ++r) {
      const __m512 db = _mm512_set1_ps(d[r][b]);
      const __m512i i0 =
          _mm512_sub_epi32(_mm512_add_epi32(lo0[r], hi0[r]), _mm512_set1_epi32(32 * ha[r][b]));
      const __m512i i1 = _mm512_sub_epi32(_mm512_add_epi32(lo1[r], hi1[r]),
                                          _mm512_set1_epi32(32 * (sa[r][b] - ha[r][b])));
      f[r] = _mm512_add_ps(f[r], _mm512_mul_ps(_mm512_cvtepi32_ps(i0), _mm512_mul_ps(s0, db)));
      f[r] = _mm512_add_ps(f[r], _mm512_mul_ps(_mm512_cvtepi32_ps(i1), _mm512_mul_ps(s1, db)));
    }
  }
  alignas(64) float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  const __m512 bv = _mm512_load_ps(bb);
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(tile + r * FRT_PANEL, _mm512_add_ps(f[r], bv));
}

}  // namespace

void w6a8_blocks_tile_4x16_zmm(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile) {
  with_tile_rows(
      rows, [&](auto r) { w6a8_blocks_tile_zmm<decltype(r)::value>(w, p, q, r0, bias, tile); });
}

}  // namespace frt::kern
