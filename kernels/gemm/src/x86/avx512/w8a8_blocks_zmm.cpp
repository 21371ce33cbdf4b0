// The block form (Note [W8A8 blocks] in ref/w8a8_blocks_ref.cpp) with zmm: every block quantized
// sixteen lanes at a time (a partial last one masked), and the 4-row x FRT_PANEL tile with
// vpdpbusd over the weights flipped to q + 128. The same integers and fp32 bits as the reference.
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gemm_tiles.h"
#include "x86/avx512/gemm_zmm.h"

namespace frt::kern {
namespace {

// One block of n <= 32 inputs, the partial last one included (masked): the same amax, scale and
// rounding as the scalar loop, so every path writes the same bytes.
inline void quantize_block_zmm(const void* x, int32_t dt, int64_t i0, int64_t n, int8_t* a,
                               float* d) {
  const __m512 v[2] = {gemm_load16(x, dt, i0, n),
                       n > 16 ? gemm_load16(x, dt, i0 + 16, n - 16) : _mm512_setzero_ps()};
  alignas(64) float m[16];
  _mm512_store_ps(m, _mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
  float amax = 0;
  for (float e : m) amax = std::max(amax, e);
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  *d = amax / 127.0f;
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  for (int h = 0; h < 2 && 16 * h < n; ++h)
    gemm_store16_bytes(
        a + i0 + 16 * h,
        _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(v[h], vinv)), lo), hi),
        n - 16 * h);
}

// vpdpbusd multiplies unsigned by signed bytes and sums four products straight into int32, so
// nothing saturates: the weight's bytes flipped by 0x80 are q + 128 in [1, 255], the activation
// is the signed operand, and the block's sum is sum (q + 128) a - 128 sum a (exact in int32;
// phase 0 wrote sum a per block). One xor per weight vector, shared by the tile's rows, where
// the sign trick cost an abs, a mask and a masked negate per row.
template <int R>
void w8a8_blocks_tile_zmm(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                          const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  const int8_t* a[R];
  const float* d[R];
  const int32_t* sa[R];
  __m512 f[R];  // the fp32 sums: with 32 registers they stay in registers
  for (int r = 0; r < R; ++r) {
    a[r] = q.a + (r0 + r) * q.lda;
    d[r] = q.d + (r0 + r) * q.ldd;
    sa[r] = q.sum + (r0 + r) * q.ldd;
    f[r] = _mm512_setzero_ps();
  }
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t t0 = 0, b = 0; t0 < kq; t0 += kQuadsPerBlock, ++b) {
    const int64_t t1 = std::min(kq, t0 + kQuadsPerBlock);
    // Two chains per row (even and odd quads): one row's eight vpdpbusd would wait on each other.
    __m512i even[R], odd[R];
    for (int r = 0; r < R; ++r) even[r] = odd[r] = _mm512_setzero_si512();
    int64_t t = t0;
    for (; t + 2 <= t1; t += 2) {
      const __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512(wp + t * 64), flip);
      const __m512i w1 = _mm512_xor_si512(_mm512_loadu_si512(wp + t * 64 + 64), flip);
      for (int r = 0; r < R; ++r) {
        int32_t q0, q1;
        std::memcpy(&q0, a[r] + 4 * t, 4);
        std::memcpy(&q1, a[r] + 4 * t + 4, 4);
        even[r] = _mm512_dpbusd_epi32(even[r], w0, _mm512_set1_epi32(q0));
        odd[r] = _mm512_dpbusd_epi32(odd[r], w1, _mm512_set1_epi32(q1));
      }
    }
    if (t < t1) {
      const __m512i w0 = _mm512_xor_si512(_mm512_loadu_si512(wp + t * 64), flip);
      for (int r = 0; r < R; ++r) {
        int32_t q0;
        std::memcpy(&q0, a[r] + 4 * t, 4);
        even[r] = _mm512_dpbusd_epi32(even[r], w0, _mm512_set1_epi32(q0));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m512i sum =
          _mm512_sub_epi32(_mm512_add_epi32(even[r], odd[r]), _mm512_set1_epi32(128 * sa[r][b]));
      f[r] = _mm512_add_ps(f[r], _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(d[r][b])));
    }
  }
  alignas(64) float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  const __m512 sc = _mm512_loadu_ps(static_cast<const float*>(w->scales) + p * FRT_PANEL);
  const __m512 bv = _mm512_load_ps(bb);
  for (int r = 0; r < R; ++r)
    _mm512_storeu_ps(tile + r * FRT_PANEL, _mm512_add_ps(_mm512_mul_ps(f[r], sc), bv));
}

}  // namespace

void quantize_row_s8_blocks_zmm(const void* x, int32_t dt, int64_t k, int8_t* a, float* d) {
  const int64_t blocks = div_up(k, kGemmActBlock);
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __mmask16 bad = 0;  // |x| == inf or NaN (unordered); lanes past k load as 0
  for (int64_t i = 0; i < k; i = std::min(i + 16, k))
    bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(gemm_load16(x, dt, i, k - i)), inf, _CMP_NLT_UQ);
  if (bad != 0) return s8_nan_row_ref(k, a, d);
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kGemmActBlock, i1 = std::min(k, i0 + kGemmActBlock);
    quantize_block_zmm(x, dt, i0, i1 - i0, a, d + b);
  }
  s8_pad_ref(k, a);
}

void w8a8_blocks_tile_4x16_zmm(const frt_packed_weight* w, int64_t p, const BlockRows& q,
                               int64_t r0, int64_t rows, const float* bias, float* tile) {
  with_tile_rows(
      rows, [&](auto r) { w8a8_blocks_tile_zmm<decltype(r)::value>(w, p, q, r0, bias, tile); });
}

}  // namespace frt::kern
