// The int4 forms (Note [W4A8] in ref/w4a8_blocks_ref.cpp) with zmm: the 4-row x FRT_PANEL tile,
// one 64-byte load per oct of the panel, its low and high nibbles through one vpdpbusd each (two
// chains), the panel and scales prefetched; its epilogue is the AVX2 one lane for lane, so the
// bits agree with every variant. Where a block's scale and min come from is a parameter: f16
// streams (int4_gemm) or the super records (int4_super_gemm).
#include <frt_kern/util.h>

#include "gemm_tiles.h"
#include "x86/avx512/gemm_zmm.h"
#include "x86/avx512/w4a8_zmm.h"
#include "x86/prefetch.h"

namespace frt::kern {
namespace {

template <int R, class Scales, bool Five>
void w4a8_blocks_tile_zmm(const frt_packed_weight* w, int64_t p, const Scales& sc,
                          const BlockRows& q, int64_t r0, const float* bias, float* tile) {
  constexpr bool Mins = Scales::kMins;
  constexpr int64_t kBlockBytes = Five ? FRT_INT5_BLOCK : kOctsPerBlock * 64;
  constexpr int32_t kOffset = Five ? 16 : 8;  // the symmetric forms' zero
  // The panel's prefetch distance: 2 KiB (eight int4 blocks, the scales' distance), or for the
  // int5 forms eight of their blocks.
  constexpr int64_t kAhead = Five ? 8 * kBlockBytes : kGemmPrefetchAhead;
  const int64_t blocks = w->k / kGemmActBlock;
  const uint8_t* wp = static_cast<const uint8_t*>(w->qdata) + p * blocks * kBlockBytes;
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
  for (int64_t b = 0; b < blocks; ++b) {
    __m512i lo[R], hi[R];  // inputs 8o..8o+3 and 8o+4..8o+7: two chains per row
    for (int r = 0; r < R; ++r) lo[r] = hi[r] = _mm512_setzero_si512();
    const uint8_t* wb = wp + b * kBlockBytes;
    sc.prefetch(b);
    __m512i plane = _mm512_setzero_si512();
    if constexpr (Five) {
      for (int64_t line = 0; line < kBlockBytes; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(wb + line + kAhead), _MM_HINT_T0);
      plane = _mm512_loadu_si512(wb + FRT_INT6_PLANES_AT);
    }
    for (int64_t o = 0; o < kOctsPerBlock; ++o) {
      if constexpr (!Five)
        _mm_prefetch(reinterpret_cast<const char*>(wb + o * 64 + kAhead), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(wb + o * 64);
      const __m512i nl = nibbles<Five, false>(v, plane, o);
      const __m512i nh = nibbles<Five, true>(v, plane, o);
      for (int r = 0; r < R; ++r) {
        int32_t q0, q1;
        std::memcpy(&q0, a[r] + b * kGemmActBlock + 8 * o, 4);
        std::memcpy(&q1, a[r] + b * kGemmActBlock + 8 * o + 4, 4);
        lo[r] = _mm512_dpbusd_epi32(lo[r], nl, _mm512_set1_epi32(q0));
        hi[r] = _mm512_dpbusd_epi32(hi[r], nh, _mm512_set1_epi32(q1));
      }
    }
    const __m512 s = sc.scale(b);
    __m512 m = _mm512_setzero_ps();
    if constexpr (Mins) m = sc.min(b);
    for (int r = 0; r < R; ++r) {
      __m512i i = _mm512_add_epi32(lo[r], hi[r]);
      if constexpr (!Mins) i = _mm512_sub_epi32(i, _mm512_set1_epi32(kOffset * sa[r][b]));
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

}  // namespace

void w4a8_blocks_tile_4x16_zmm(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile) {
  const auto run = [&](const auto& sc, auto five) {
    with_tile_rows(rows, [&](auto r) {
      w4a8_blocks_tile_zmm<decltype(r)::value, std::decay_t<decltype(sc)>, decltype(five)::value>(
          w, p, sc, q, r0, bias, tile);
    });
  };
  with_w4a8_scales(w, p, run);
}

}  // namespace frt::kern
