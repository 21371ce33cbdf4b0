// Q6_K's six-bit values (Note [W6A8] in ref/w6a8_blocks_ref.cpp) with AVX2: the 4-row x
// FRT_PANEL tile, the two column halves of a 64-byte oct (and of each plane) as two ymm. A pair
// of vpmaddubsw products reaches 2 * 63 * 127, so the oct's two (its low and high quads) are
// added in int16 (<= 32004) and widened by vpmaddwd at once into int32 per group. The same
// integers and fp32 bits as the reference.
#include <frt_kern/util.h>

#include "gemm_tiles.h"
#include "x86/avx2/gemm_avx2.h"
#include "x86/prefetch.h"

namespace frt::kern {
namespace {

constexpr int64_t kHalf = FRT_PANEL / 2;

// The top two bits of oct t moved to bits 4..5 (16-bit shifts; see the zmm tile).
inline __m256i top_bits(__m256i plane, int64_t t) {
  switch (t) {
    case 0:
      return _mm256_slli_epi16(plane, 4);
    case 1:
      return _mm256_slli_epi16(plane, 2);
    case 2:
      return plane;
    default:
      return _mm256_srli_epi16(plane, 2);
  }
}

// Eight columns' scales of group g of a record: d * sc, exact in f32.
inline __m256 group_scale(const uint8_t* rec, int64_t g, int h) {
  const __m256 d =
      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 2 * h * kHalf)));
  const __m128i codes = _mm_loadl_epi64(
      reinterpret_cast<const __m128i*>(rec + FRT_SUPER8_SC_AT + g * FRT_PANEL + h * kHalf));
  return _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)));
}

template <int R>
void w6a8_blocks_tile_avx2(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                           const float* bias, float* tile) {
  const int64_t blocks = w->k / kGemmActBlock;
  const uint8_t* wp = static_cast<const uint8_t*>(w->qdata) + p * blocks * FRT_INT6_BLOCK;
  const uint8_t* records = super8_records(w, p);
  const int8_t* a[R];
  const float* d[R];
  const int32_t *sa[R], *ha[R];
  for (int r = 0; r < R; ++r) {
    a[r] = q.a + (r0 + r) * q.lda;
    d[r] = q.d + (r0 + r) * q.ldd;
    sa[r] = q.sum + (r0 + r) * q.ldd;
    ha[r] = q.half + (r0 + r) * q.ldd;
    for (int h = 0; h < 2; ++h) _mm256_store_ps(tile + r * FRT_PANEL + 8 * h, _mm256_setzero_ps());
  }
  const __m256i low = _mm256_set1_epi8(0x0f), top = _mm256_set1_epi8(0x30);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* wb = wp + b * FRT_INT6_BLOCK;
    for (int64_t line = 0; line < FRT_INT6_BLOCK; line += 64)
      _mm_prefetch(reinterpret_cast<const char*>(wb + line + kGemmPrefetchAhead), _MM_HINT_T0);
    __m256i acc[R][2][2];  // int32 per row, group and column half
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < 2; ++g) acc[r][g][0] = acc[r][g][1] = _mm256_setzero_si256();
    __m256i plane[2][2];  // [first, second][column half]
    for (int pl = 0; pl < 2; ++pl)
      for (int h = 0; h < 2; ++h)
        plane[pl][h] = _mm256_load_si256(
            reinterpret_cast<const __m256i*>(wb + FRT_INT6_PLANES_AT + 64 * pl + 32 * h));
    for (int64_t t = 0; t < 4; ++t) {
      __m256i ul[2], uh[2];
      for (int h = 0; h < 2; ++h) {
        const __m256i v = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + 64 * t + 32 * h));
        ul[h] = _mm256_or_si256(_mm256_and_si256(v, low),
                                _mm256_and_si256(top_bits(plane[0][h], t), top));
        uh[h] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                                _mm256_and_si256(top_bits(plane[1][h], t), top));
      }
      for (int r = 0; r < R; ++r) {
        int32_t q0, q1;
        std::memcpy(&q0, a[r] + b * kGemmActBlock + 8 * t, 4);
        std::memcpy(&q1, a[r] + b * kGemmActBlock + 8 * t + 4, 4);
        const __m256i a0 = _mm256_set1_epi32(q0), a1 = _mm256_set1_epi32(q1);
        for (int h = 0; h < 2; ++h) {
          const __m256i pair =
              _mm256_add_epi16(_mm256_maddubs_epi16(ul[h], a0), _mm256_maddubs_epi16(uh[h], a1));
          acc[r][t / 2][h] = _mm256_add_epi32(acc[r][t / 2][h], _mm256_madd_epi16(pair, ones));
        }
      }
    }
    const uint8_t* rec = records + (b / FRT_SUPER4_GROUPS) * FRT_SUPER8_RECORD;
    const int64_t g = 2 * (b % FRT_SUPER4_GROUPS);
    const __m256 s[2][2] = {{group_scale(rec, g, 0), group_scale(rec, g, 1)},
                            {group_scale(rec, g + 1, 0), group_scale(rec, g + 1, 1)}};
    for (int r = 0; r < R; ++r) {
      const __m256 db = _mm256_set1_ps(d[r][b]);
      const int32_t offset[2] = {32 * ha[r][b], 32 * (sa[r][b] - ha[r][b])};
      for (int h = 0; h < 2; ++h) {
        float* f = tile + r * FRT_PANEL + 8 * h;
        __m256 v = _mm256_load_ps(f);
        for (int gi = 0; gi < 2; ++gi) {
          const __m256i i = _mm256_sub_epi32(acc[r][gi][h], _mm256_set1_epi32(offset[gi]));
          v = _mm256_add_ps(v, _mm256_mul_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(s[gi][h], db)));
        }
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

void w6a8_blocks_tile_4x16_avx2(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                                int64_t r0, int64_t rows, const float* bias, float* tile) {
  with_tile_rows(
      rows, [&](auto r) { w6a8_blocks_tile_avx2<decltype(r)::value>(w, p, q, r0, bias, tile); });
}

}  // namespace frt::kern
