// flashrt/gemm's linear with activations quantized per block of 32 inputs (an int8_gemm pack
// whose `group` is 32): the decode form. Built per variant like gemm_kernels.cpp; both paths
// compute the same integers and, without FMA contraction, the same fp32 bits.
//
// Note [W8A8 blocks]: per-row activation scales (Note [W8A8 rows]) cost a small decoder dearly:
// one outlier channel after the norm sets the scale of the whole row, and SmolLM2's perplexity
// rose 11.6% with them (bench/results/accuracy.json, "earlier_forms"). Here every 32 inputs of a
// row get their own symmetric scale d = amax / 127 and a = nearbyint(x * 127 / amax) in [-127, 127]
// (the scheme llama.cpp's Q8 activation blocks use). The weights are the same symmetric int8 per
// channel. vpmaddubsw needs one unsigned operand: it multiplies |q| by a carrying q's sign
// (vpsignb), and since |q|, |a| <= 127 a pair sums to at most 32258: no int16 saturation.
// The zmm tile (avx512vnni) forms the same sums with vpdpbusd, (q + 128) times a less 128 times
// the block's sum of a, into int32 directly.
// Each block's int32 sum (|sum| <= 32 * 127 * 127) is exact in fp32; the row accumulates
// f += float(sum) * d block by block, and y = f * scale[c] + bias[c].
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "gemm_isa.h"
#include "gemm_op.h"

namespace frt::kern {
namespace {

constexpr int64_t kQuadsPerBlock = kGemmActBlock / 4;

}  // namespace

#if defined(FRT_ZMM)
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

}  // namespace
#elif defined(__AVX2__)
namespace {

// One full block of 32: the same amax, scale and rounding as the scalar loop (cvtps rounds to
// nearest even, as nearbyint does in the default mode), so both paths write the same bytes.
inline void quantize_block_avx2(const void* x, int32_t dt, int64_t i0, int8_t* a, float* d) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 v[4], m = _mm256_setzero_ps();
  for (int j = 0; j < 4; ++j) {
    v[j] = gemm_load8(x, dt, i0 + 8 * j);
    m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[j]));
  }
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
  const float amax = _mm_cvtss_f32(h);
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  *d = amax / 127.0f;
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  __m256i q[4];
  for (int j = 0; j < 4; ++j)
    q[j] =
        _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[j], vinv)), lo), hi);
  const __m256i w =
      _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(a + i0), _mm256_permutevar8x32_epi32(w, order));
}

}  // namespace
#endif

void quantize_row_blocks(const void* x, int32_t dt, int64_t k, int8_t* a, float* d) {
  const int64_t blocks = div_up(k, kGemmActBlock);
  bool finite = true;
  int64_t i = 0;
#if defined(FRT_ZMM)
  const __m512 inf = _mm512_set1_ps(std::numeric_limits<float>::infinity());
  __mmask16 bad = 0;  // |x| == inf or NaN (unordered); lanes past k load as 0
  for (; i < k; i = std::min(i + 16, k))
    bad |= _mm512_cmp_ps_mask(_mm512_abs_ps(gemm_load16(x, dt, i, k - i)), inf, _CMP_NLT_UQ);
  finite = bad == 0;
#elif defined(__AVX2__)
  const __m256 inf = _mm256_set1_ps(std::numeric_limits<float>::infinity());
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 bad = _mm256_setzero_ps();
  for (; i + 8 <= k; i += 8)  // |x| == inf or NaN (unordered)
    bad = _mm256_or_ps(
        bad, _mm256_cmp_ps(_mm256_andnot_ps(sign, gemm_load8(x, dt, i)), inf, _CMP_NLT_UQ));
  finite = _mm256_movemask_ps(bad) == 0;
#endif
  for (; i < k && finite; ++i) finite = std::isfinite(gemm_load_x(x, dt, i));
  if (!finite) {  // no finite scale: the row's outputs come out NaN
    std::fill(d, d + blocks, std::nanf(""));
    std::memset(a, 0, static_cast<size_t>(div_up(k, 4) * 4));
    return;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kGemmActBlock, i1 = std::min(k, i0 + kGemmActBlock);
#if defined(FRT_ZMM)
    quantize_block_zmm(x, dt, i0, i1 - i0, a, d + b);
    continue;
#elif defined(__AVX2__)
    if (i1 - i0 == kGemmActBlock) {
      quantize_block_avx2(x, dt, i0, a, d + b);
      continue;
    }
#endif
    float amax = 0;
    for (int64_t j = i0; j < i1; ++j) amax = std::max(amax, std::fabs(gemm_load_x(x, dt, j)));
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    d[b] = amax / 127.0f;
    for (int64_t j = i0; j < i1; ++j)
      a[j] = static_cast<int8_t>(
          std::clamp(std::nearbyint(gemm_load_x(x, dt, j) * inv), -127.0f, 127.0f));
  }
  for (int64_t j = k; j < div_up(k, 4) * 4; ++j) a[j] = 0;
}

namespace {

#if defined(FRT_ZMM)
// vpdpbusd multiplies unsigned by signed bytes and sums four products straight into int32, so
// nothing saturates: the weight's bytes flipped by 0x80 are q + 128 in [1, 255], the activation
// is the signed operand, and the block's sum is sum (q + 128) a - 128 sum a (exact in int32;
// phase 0 wrote sum a per block). One xor per weight vector, shared by the tile's rows, where
// the sign trick cost an abs, a mask and a masked negate per row.
template <int R>
void tile_blocks_zmm(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
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
#elif defined(__AVX2__)
template <int R>
void tile_blocks_avx2(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                      const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  const int8_t* a[R];
  const float* d[R];
  for (int r = 0; r < R; ++r) {
    a[r] = q.a + (r0 + r) * q.lda;
    d[r] = q.d + (r0 + r) * q.ldd;
  }
  // The fp32 sums live in the tile (touched once per block), so the inner loop keeps its 2R
  // integer accumulators and the weights in registers without spilling.
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) _mm256_store_ps(tile + r * FRT_PANEL + 8 * h, _mm256_setzero_ps());
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t t0 = 0, b = 0; t0 < kq; t0 += kQuadsPerBlock, ++b) {
    const int64_t t1 = std::min(kq, t0 + kQuadsPerBlock);
    __m256i acc[R][2];
    for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t t = t0; t < t1; ++t) {
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + t * 64));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + t * 64 + 32));
      const __m256i m0 = _mm256_abs_epi8(w0), m1 = _mm256_abs_epi8(w1);
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        std::memcpy(&quad, a[r] + 4 * t, 4);
        const __m256i av = _mm256_set1_epi32(quad);
        acc[r][0] = _mm256_add_epi32(
            acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(m0, _mm256_sign_epi8(av, w0)), ones));
        acc[r][1] = _mm256_add_epi32(
            acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(m1, _mm256_sign_epi8(av, w1)), ones));
      }
    }
    for (int r = 0; r < R; ++r) {
      const __m256 db = _mm256_set1_ps(d[r][b]);
      for (int h = 0; h < 2; ++h) {
        float* f = tile + r * FRT_PANEL + 8 * h;
        _mm256_store_ps(
            f, _mm256_add_ps(_mm256_load_ps(f), _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][h]), db)));
      }
    }
  }
  alignas(32) float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  const float* sc = static_cast<const float*>(w->scales) + p * FRT_PANEL;
  for (int r = 0; r < R; ++r)
    for (int h = 0; h < 2; ++h) {
      float* f = tile + r * FRT_PANEL + 8 * h;
      _mm256_store_ps(f,
                      _mm256_add_ps(_mm256_mul_ps(_mm256_load_ps(f), _mm256_loadu_ps(sc + 8 * h)),
                                    _mm256_load_ps(bb + 8 * h)));
    }
}
#else
void tile_blocks_ref(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                     int64_t rows, const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  const float* sc = static_cast<const float*>(w->scales) + p * FRT_PANEL;
  float bb[FRT_PANEL];
  gemm_panel_bias(w, p, bias, bb);
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* a = q.a + (r0 + r) * q.lda;
    const float* d = q.d + (r0 + r) * q.ldd;
    float f[FRT_PANEL] = {};
    for (int64_t t0 = 0, b = 0; t0 < kq; t0 += kQuadsPerBlock, ++b) {
      const int64_t t1 = std::min(kq, t0 + kQuadsPerBlock);
      int32_t acc[FRT_PANEL] = {};
      for (int64_t t = t0; t < t1; ++t)
        for (int64_t c = 0; c < FRT_PANEL; ++c)
          for (int64_t j = 0; j < 4; ++j)
            acc[c] += static_cast<int32_t>(a[4 * t + j]) * wp[(t * FRT_PANEL + c) * 4 + j];
      for (int64_t c = 0; c < FRT_PANEL; ++c) f[c] = f[c] + static_cast<float>(acc[c]) * d[b];
    }
    for (int64_t c = 0; c < FRT_PANEL; ++c) tile[r * FRT_PANEL + c] = f[c] * sc[c] + bb[c];
  }
}
#endif

}  // namespace

void gemm_tile_blocks(const frt_packed_weight* w, int64_t p, const BlockRows& q, int64_t r0,
                      int64_t rows, const float* bias, float* tile) {
#if defined(FRT_ZMM)
  with_tile_rows(rows,
                 [&](auto r) { tile_blocks_zmm<decltype(r)::value>(w, p, q, r0, bias, tile); });
#elif defined(__AVX2__)
  with_tile_rows(rows,
                 [&](auto r) { tile_blocks_avx2<decltype(r)::value>(w, p, q, r0, bias, tile); });
#else
  tile_blocks_ref(w, p, q, r0, rows, bias, tile);
#endif
}

}  // namespace frt::kern
