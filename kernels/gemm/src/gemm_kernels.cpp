// The per-ISA halves of flashrt/gemm: row quantization and the 4-row x FRT_PANEL integer tile.
// Built once per variant: a zmm tile with vpdpbusd in avx512vnni (FRT_ZMM), the AVX2 path where
// the flags allow it (the avx512vnni variant keeps its row quantization), the scalar reference
// elsewhere. All compute the same integers and, built without FMA contraction
// (kernels/CMakeLists.txt) and with one epilogue order, the same fp32 bits.
//
// Note [W8A8 rows]: activations are quantized per row, asymmetric, to seven bits (u in 0..127;
// frt_kernel_abi.h, FRT_W_INT8_GEMM). vpmaddubsw multiplies u8 by s8 and adds neighbouring
// pairs in int16 with saturation: with eight-bit u (up to 255) a pair reaches 2 * 255 * 127 and
// saturates, with seven bits 2 * 127 * 127 = 32258 fits, so the int16 step is exact. (fbgemm's
// "reduce_range" makes the same choice on CPUs without VNNI.) vpdpbusd (the zmm tile) multiplies
// u8 by s8 into int32 with no int16 step: the same sums. One zmm holds a whole quad of the panel
// (16 columns x 4 k, 64 bytes), so a row's quad is one instruction. The zero point z is removed
// after the integer product: sum_i (u_i - z) q_ci = sum_i u_i q_ci - z * colsum_c.
#include <frt_kern/util.h>

#include <algorithm>
#include <cmath>

#include "gemm_isa.h"
#include "gemm_op.h"

namespace frt::kern {
namespace {

inline uint8_t quantize_one(float v, float inv, int32_t z) {
  const float u = std::nearbyint(v * inv) + static_cast<float>(z);
  return static_cast<uint8_t>(std::clamp(u, 0.0f, 127.0f));
}

#if defined(__AVX2__)
inline __m256i quantize8(const void* x, int32_t dt, int64_t i, __m256 inv, __m256i z) {
  const __m256i v =
      _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(gemm_load8(x, dt, i), inv)), z);
  return _mm256_min_epi32(_mm256_max_epi32(v, _mm256_setzero_si256()), _mm256_set1_epi32(127));
}
#endif

}  // namespace

void quantize_row(const void* x, int32_t dt, int64_t k, uint8_t* u, float* scale, int32_t* zero) {
  float lo = 0, hi = 0;
  bool nan = false;
  int64_t i = 0;
#if defined(FRT_ZMM)
  // Masked past k: the lanes left out are 0, and 0 is inside [lo, hi] from the start.
  __m512 vlo = _mm512_setzero_ps(), vhi = vlo;
  __mmask16 vnan = 0;
  for (; i < k; i = std::min(i + 16, k)) {
    const __m512 v = gemm_load16(x, dt, i, k - i);
    vlo = _mm512_min_ps(vlo, v);
    vhi = _mm512_max_ps(vhi, v);
    vnan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  }
  alignas(64) float l[16], h[16];
  _mm512_store_ps(l, vlo);
  _mm512_store_ps(h, vhi);
  for (int j = 0; j < 16; ++j) lo = std::min(lo, l[j]), hi = std::max(hi, h[j]);
  nan = vnan != 0;
#elif defined(__AVX2__)
  __m256 vlo = _mm256_setzero_ps(), vhi = vlo, vnan = vlo;
  for (; i + 8 <= k; i += 8) {
    const __m256 v = gemm_load8(x, dt, i);
    vlo = _mm256_min_ps(vlo, v);
    vhi = _mm256_max_ps(vhi, v);
    vnan = _mm256_or_ps(vnan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float l[8], h[8];
  _mm256_store_ps(l, vlo);
  _mm256_store_ps(h, vhi);
  for (int j = 0; j < 8; ++j) lo = std::min(lo, l[j]), hi = std::max(hi, h[j]);
  nan = _mm256_movemask_ps(vnan) != 0;
#endif
  for (; i < k; ++i) {
    const float v = gemm_load_x(x, dt, i);
    lo = std::min(lo, v), hi = std::max(hi, v);
    nan |= std::isnan(v);
  }
  if (nan || !std::isfinite(hi - lo)) {  // no finite scale: the row's outputs come out NaN
    *scale = std::nanf("");
    *zero = 0;
    std::memset(u, 0, static_cast<size_t>(div_up(k, 4) * 4));
    return;
  }
  float s = (hi - lo) / 127.0f;
  if (!(s > 0)) s = 1.0f;
  const float inv = 1.0f / s;
  const int32_t z = static_cast<int32_t>(std::clamp(std::nearbyint(-lo * inv), 0.0f, 127.0f));
  *scale = s;
  *zero = z;
  i = 0;
#if defined(FRT_ZMM)
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512i vz = _mm512_set1_epi32(z), top = _mm512_set1_epi32(127);
  for (; i < k; i = std::min(i + 16, k)) {  // quantize_one's steps, sixteen at a time
    const __m512i v =
        _mm512_add_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(gemm_load16(x, dt, i, k - i), vinv)), vz);
    gemm_store16_bytes(u + i, _mm512_min_epi32(_mm512_max_epi32(v, _mm512_setzero_si512()), top),
                       k - i);
  }
#elif defined(__AVX2__)
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256i vz = _mm256_set1_epi32(z);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (; i + 32 <= k; i += 32) {
    const __m256i ab =
        _mm256_packs_epi32(quantize8(x, dt, i, vinv, vz), quantize8(x, dt, i + 8, vinv, vz));
    const __m256i cd =
        _mm256_packs_epi32(quantize8(x, dt, i + 16, vinv, vz), quantize8(x, dt, i + 24, vinv, vz));
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(u + i), bytes);
  }
#endif
  for (; i < k; ++i) u[i] = quantize_one(gemm_load_x(x, dt, i), inv, z);
  for (; i < div_up(k, 4) * 4; ++i) u[i] = 0;
}

namespace {

// The epilogue shared by both paths: y = float(acc - z * colsum) * (s_x * scale) + bias.
inline float finish(int32_t acc, int32_t z, int32_t colsum, float sx, float sc, float b) {
  return static_cast<float>(acc - z * colsum) * (sx * sc) + b;
}

#if defined(FRT_ZMM)
template <int R>
void tile_zmm(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
              const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  const uint8_t* a[R];
  __m512i acc[R];
  for (int r = 0; r < R; ++r) {
    a[r] = q.u + (r0 + r) * q.lda;
    acc[r] = _mm512_setzero_si512();
  }
  for (int64_t t = 0; t < kq; ++t) {
    const __m512i wv = _mm512_loadu_si512(wp + t * 64);
    for (int r = 0; r < R; ++r) {
      int32_t quad;
      std::memcpy(&quad, a[r] + 4 * t, 4);
      acc[r] = _mm512_dpbusd_epi32(acc[r], _mm512_set1_epi32(quad), wv);
    }
  }
  alignas(64) float b[FRT_PANEL];
  gemm_panel_bias(w, p, bias, b);
  const float* sc = static_cast<const float*>(w->scales) + p * FRT_PANEL;
  const float* cs = static_cast<const float*>(w->mins) + p * FRT_PANEL;  // column sums
  const __m512i colsum = _mm512_cvtps_epi32(_mm512_loadu_ps(cs));
  const __m512 scale = _mm512_loadu_ps(sc), bv = _mm512_load_ps(b);
  for (int r = 0; r < R; ++r) {  // finish()'s order: float(acc - z * colsum) * (sx * sc) + b
    const __m512i i =
        _mm512_sub_epi32(acc[r], _mm512_mullo_epi32(_mm512_set1_epi32(q.zero[r0 + r]), colsum));
    const __m512 f =
        _mm512_mul_ps(_mm512_cvtepi32_ps(i), _mm512_mul_ps(_mm512_set1_ps(q.scale[r0 + r]), scale));
    _mm512_storeu_ps(tile + r * FRT_PANEL, _mm512_add_ps(f, bv));
  }
}
#elif defined(__AVX2__)
template <int R>
void tile_avx2(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0,
               const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  const uint8_t* a[R];
  __m256i acc[R][2];
  for (int r = 0; r < R; ++r) {
    a[r] = q.u + (r0 + r) * q.lda;
    acc[r][0] = acc[r][1] = _mm256_setzero_si256();
  }
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t t = 0; t < kq; ++t) {
    const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + t * 64));
    const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wp + t * 64 + 32));
    for (int r = 0; r < R; ++r) {
      int32_t quad;
      std::memcpy(&quad, a[r] + 4 * t, 4);
      const __m256i av = _mm256_set1_epi32(quad);
      acc[r][0] =
          _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(av, w0), ones));
      acc[r][1] =
          _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(av, w1), ones));
    }
  }
  alignas(32) float b[FRT_PANEL];
  gemm_panel_bias(w, p, bias, b);
  const float* sc = static_cast<const float*>(w->scales) + p * FRT_PANEL;
  const float* cs = static_cast<const float*>(w->mins) + p * FRT_PANEL;  // column sums
  const __m256i colsum[2] = {_mm256_cvtps_epi32(_mm256_loadu_ps(cs)),
                             _mm256_cvtps_epi32(_mm256_loadu_ps(cs + 8))};
  for (int r = 0; r < R; ++r) {
    const __m256 sx = _mm256_set1_ps(q.scale[r0 + r]);
    const __m256i z = _mm256_set1_epi32(q.zero[r0 + r]);
    for (int h = 0; h < 2; ++h) {
      const __m256i i = _mm256_sub_epi32(acc[r][h], _mm256_mullo_epi32(z, colsum[h]));
      const __m256 f =
          _mm256_mul_ps(_mm256_cvtepi32_ps(i), _mm256_mul_ps(sx, _mm256_loadu_ps(sc + 8 * h)));
      _mm256_store_ps(tile + r * FRT_PANEL + 8 * h, _mm256_add_ps(f, _mm256_load_ps(b + 8 * h)));
    }
  }
}
#else
void tile_ref(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0, int64_t rows,
              const float* bias, float* tile) {
  const int64_t kq = div_up(w->k, 4);
  const int8_t* wp = static_cast<const int8_t*>(w->qdata) + p * kq * 4 * FRT_PANEL;
  float b[FRT_PANEL];
  gemm_panel_bias(w, p, bias, b);
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* a = q.u + (r0 + r) * q.lda;
    int32_t acc[FRT_PANEL] = {};
    for (int64_t t = 0; t < kq; ++t)
      for (int64_t c = 0; c < FRT_PANEL; ++c)
        for (int64_t j = 0; j < 4; ++j)
          acc[c] += static_cast<int32_t>(a[4 * t + j]) * wp[(t * FRT_PANEL + c) * 4 + j];
    for (int64_t c = 0; c < FRT_PANEL; ++c)
      tile[r * FRT_PANEL + c] =
          finish(acc[c], q.zero[r0 + r],
                 static_cast<int32_t>(static_cast<const float*>(w->mins)[p * FRT_PANEL + c]),
                 q.scale[r0 + r], static_cast<const float*>(w->scales)[p * FRT_PANEL + c], b[c]);
  }
}
#endif

}  // namespace

void gemm_tile(const frt_packed_weight* w, int64_t p, const QuantRows& q, int64_t r0, int64_t rows,
               const float* bias, float* tile) {
#if defined(FRT_ZMM)
  with_tile_rows(rows, [&](auto r) { tile_zmm<decltype(r)::value>(w, p, q, r0, bias, tile); });
#elif defined(__AVX2__)
  with_tile_rows(rows, [&](auto r) { tile_avx2<decltype(r)::value>(w, p, q, r0, bias, tile); });
#else
  tile_ref(w, p, q, r0, rows, bias, tile);
#endif
}

}  // namespace frt::kern
