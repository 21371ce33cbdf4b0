// The block forms (Notes [W8A8 blocks] and [W4A8]) on AMX-INT8 tiles (Note [AMX blocks]): the
// same integers as the zmm tiles and their epilogues lane for lane, so the same fp32 bits.
#include <frt_kern/amx_tiles.h>
#include <frt_kern/util.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "gemm_tiles.h"
#include "x86/avx512/gemm_zmm.h"
#include "x86/avx512/w4a8_zmm.h"

namespace frt::kern {
namespace {

// Note [AMX blocks]: every activation block of 32 inputs has its own scale, so a block's int32
// sums must be scaled before the next block's are added: the tiles run one block (K = 32) per
// product, 16 rows x 32 bytes of activations (A) against the block's 8 quads x 16 columns of
// weights (B, one 512-byte tile per panel), into zeroed 16x16 C tiles, which go out to an int32
// buffer; the vector unit then adds them into the rows' fp32 sums f in the zmm tile's order
// (f += float(sum) * d, block by block), so the bits are the zmm tile's. The int8 form's bytes
// are both signed (tdpbssd; the zmm tile's flip to q + 128 gives the same sums) and its B tiles
// are read in place (a partial last block from a zero-padded copy); the nibble forms' octs are
// split into their low and high quads (the int5 forms' fifth bits merged) in a 512-byte buffer
// per panel and block, read unsigned (tdpbsud).
//
// The order, each part measured on the Xeon (bench/results/amx/gemm_ablation.json): for each
// block, its B tiles once, then every 16-row group of the pass (128 rows, the op code's
// kAmxBlockFormRows, so f stays in L1: 256 rows took 3-13% longer) under them, the groups
// alternating between two sets of C tiles so one set's sums go out while the other's are formed;
// each product's sums are scaled one product behind, so the vector work overlaps the tiles (at
// 512 x 3072 x 3072 in int8 the tiles alone took 5.2 ms, the scaling alone 5.2, both 8.3). The
// rows the tiles take are quantized into tile order (BlockRows::tiled: 512 contiguous bytes per
// A tile, where row-major rows are 16 lines lda apart): 1-13% less time. A K = 32 product fills
// half a tdpbusd's depth and its sums must go out and be scaled every block, so these forms run
// at a fraction of the per-row form's speed: the scaling (a convert, a multiply and an add per
// 16 sums, two more for a block's min) bounds them.

constexpr int kC = 0, kA = 4, kB = 6;               // tile registers, as in Note [AMX rows]
constexpr int64_t kBlockQuads = kGemmActBlock / 4;  // B rows per block
constexpr int64_t kLd = 2 * FRT_PANEL;              // int32 / fp32 per row of a row group's sums

amx::TileConfig blocks_config() {
  amx::TileConfig c;
  for (int t = kC; t < kC + 4; ++t) c.rows[t] = 16, c.colsb[t] = 64;
  for (int t = kA; t < kA + 2; ++t) c.rows[t] = 16, c.colsb[t] = kGemmActBlock;
  for (int t = kB; t < kB + 2; ++t) c.rows[t] = kBlockQuads, c.colsb[t] = 64;
  return c;
}

// int8_gemm in activation blocks: block b of a panel is its quads 8b .. 8b + 7 in place.
class Int8Source {
 public:
  Int8Source(const frt_packed_weight* w, int64_t p, int64_t np) {
    const int64_t kq = div_up(w->k, 4);
    full_ = kq / kBlockQuads;
    blocks_ = div_up(kq, kBlockQuads);
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t pb = p + std::min(b, np - 1);
      panel_[b] = static_cast<const int8_t*>(w->qdata) + pb * kq * 64;
      if (full_ < blocks_)
        std::memcpy(tail_[b], panel_[b] + full_ * 512, (kq - full_ * kBlockQuads) * 64);
      scale_[b] = _mm512_loadu_ps(static_cast<const float*>(w->scales) + pb * FRT_PANEL);
    }
  }
  int64_t blocks() const { return blocks_; }
  template <int NB>
  void load_weights(int64_t b) {
    amx::load<kB + 0>(b < full_ ? panel_[0] + b * 512 : tail_[0], 64);
    if constexpr (NB == 2) amx::load<kB + 1>(b < full_ ? panel_[1] + b * 512 : tail_[1], 64);
  }
  template <int C, int A, int B>
  static void product() {
    amx::dpbssd<C, A, B>();
  }
  struct Block {
    __m512 add(__m512 f, __m512i sum, int, float d, int32_t) const {
      return _mm512_add_ps(f, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(d)));
    }
  };
  Block block(int64_t) const { return {}; }
  __m512 finish(__m512 f, int pb, __m512 bias) const {
    return _mm512_add_ps(_mm512_mul_ps(f, scale_[pb]), bias);
  }

 private:
  const int8_t* panel_[2];
  alignas(64) int8_t tail_[2][512] = {};
  __m512 scale_[2];
  int64_t full_, blocks_;
};

// The nibble forms (int4_gemm, int4_super_gemm, int5_gemm, int5_super_gemm): each block's octs
// split into B rows 2o (inputs 8o..8o+3) and 2o + 1 (8o+4..8o+7), as the zmm tile's two chains.
template <class Scales, bool Five>
class NibbleSource {
  static constexpr bool kMins = Scales::kMins;
  static constexpr int64_t kBlockBytes = Five ? FRT_INT5_BLOCK : kOctsPerBlock * 64;
  static constexpr int32_t kOffset = Five ? 16 : 8;  // the symmetric forms' zero

 public:
  NibbleSource(const frt_packed_weight* w, int64_t p, int64_t np, const Scales& sc)
      : scales_{sc, np == 2 ? sc.next_panel(w) : sc}, blocks_(w->k / kGemmActBlock) {
    for (int64_t b = 0; b < 2; ++b)
      panel_[b] =
          static_cast<const uint8_t*>(w->qdata) + (p + std::min(b, np - 1)) * blocks_ * kBlockBytes;
  }
  int64_t blocks() const { return blocks_; }
  template <int NB>
  void load_weights(int64_t b) {
    split<0>(b);
    if constexpr (NB == 2) split<1>(b);
  }
  template <int C, int A, int B>
  static void product() {
    amx::dpbsud<C, A, B>();
  }
  struct Block {
    __m512 scale[2], min[2];
    __m512 add(__m512 f, __m512i sum, int pb, float d, int32_t sa) const {
      if constexpr (!kMins) sum = _mm512_sub_epi32(sum, _mm512_set1_epi32(kOffset * sa));
      f = _mm512_add_ps(
          f, _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale[pb], _mm512_set1_ps(d))));
      if constexpr (kMins)
        f = _mm512_add_ps(f, _mm512_mul_ps(min[pb], _mm512_set1_ps(d * static_cast<float>(sa))));
      return f;
    }
  };
  Block block(int64_t b) const {
    Block k;
    for (int pb = 0; pb < 2; ++pb) {
      k.scale[pb] = scales_[pb].scale(b);
      k.min[pb] = kMins ? scales_[pb].min(b) : _mm512_setzero_ps();
    }
    return k;
  }
  __m512 finish(__m512 f, int, __m512 bias) const { return _mm512_add_ps(f, bias); }

 private:
  template <int PB>
  void split(int64_t b) {
    const uint8_t* wb = panel_[PB] + b * kBlockBytes;
    __m512i plane = _mm512_setzero_si512();
    if constexpr (Five) plane = _mm512_loadu_si512(wb + FRT_INT6_PLANES_AT);
    for (int64_t o = 0; o < kOctsPerBlock; ++o) {
      const __m512i v = _mm512_loadu_si512(wb + o * 64);
      const __m512i low = nibbles<Five, false>(v, plane, o);  // (SIMDe's stores are macros)
      const __m512i high = nibbles<Five, true>(v, plane, o);
      _mm512_store_si512(quads_[PB] + 2 * o * 64, low);
      _mm512_store_si512(quads_[PB] + (2 * o + 1) * 64, high);
    }
    amx::load<kB + PB>(quads_[PB], 64);
  }
  Scales scales_[2];
  const uint8_t* panel_[2];
  alignas(64) uint8_t quads_[2][kBlockQuads * 64];
  int64_t blocks_;
};

// Rows [r0, r0 + rows) (16-row groups) against NB panels: for each block, its B tiles once and
// every group's product, the products alternating between two sets of C tiles (set s: C 2s and
// 2s + 1 from A 4 + s) so one set's sums go out while the other's are formed; each product's sums
// added into f one product behind; then f finished into y.
template <int NB, class Source>
void pass(Source& src, const BlockRows& q, int64_t r0, int64_t rows, const __m512 (&bias)[2],
          const int64_t (&c0)[2], const int64_t (&cols)[2], void* y, int32_t y_dtype, int64_t ldy) {
  alignas(64) float f[kGemmAmxBlockRows * kLd];
  std::memset(f, 0, rows * kLd * sizeof(float));
  // The sums 64 bytes off f's rows modulo 4 KiB: their loads would otherwise wait on the stores
  // to f at the same page offset (4K aliasing).
  alignas(64) int32_t sum_buffer[2 * 16 * kLd + 16];
  int32_t* const sums[2] = {sum_buffer + 16, sum_buffer + 16 + 16 * kLd};
  const int64_t groups = rows / 16, blocks = src.blocks();
  const bool tiled = r0 < q.tiled;  // the op code tiles all of the tiles' rows or none
  // Group g's sums of block b (in sums[set]) into f.
  const auto add = [&](int64_t b, int64_t g, int set) {
    const auto k = src.block(b);
    for (int64_t i = 0; i < 16; ++i) {
      const int64_t r = r0 + 16 * g + i;
      const float d = q.d[r * q.ldd + b];
      const int32_t sa = q.sum[r * q.ldd + b];
      for (int pb = 0; pb < NB; ++pb) {
        float* fi = f + (16 * g + i) * kLd + 16 * pb;
        _mm512_store_ps(fi, k.add(_mm512_load_ps(fi),
                                  _mm512_load_si512(sums[set] + i * kLd + 16 * pb), pb, d, sa));
      }
    }
  };
  const auto product = [&](auto set, int64_t b, int64_t g) {
    constexpr int S = decltype(set)::value;
    amx::zero<kC + 2 * S>();
    if constexpr (NB == 2) amx::zero<kC + 2 * S + 1>();
    if (tiled)
      amx::load<kA + S>(q.a + (b * (q.tiled / 16) + r0 / 16 + g) * 512, kGemmActBlock);
    else
      amx::load<kA + S>(q.a + (r0 + 16 * g) * q.lda + b * kGemmActBlock, q.lda);
    Source::template product<kC + 2 * S, kA + S, kB + 0>();
    if constexpr (NB == 2) Source::template product<kC + 2 * S + 1, kA + S, kB + 1>();
    amx::store<kC + 2 * S>(sums[S], kLd * 4);
    if constexpr (NB == 2) amx::store<kC + 2 * S + 1>(sums[S] + 16, kLd * 4);
  };
  int64_t last_b = -1, last_g = 0;
  int set = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    src.template load_weights<NB>(b);
    for (int64_t g = 0; g < groups; ++g, set ^= 1) {
      if (set == 0)
        product(std::integral_constant<int, 0>{}, b, g);
      else
        product(std::integral_constant<int, 1>{}, b, g);
      if (last_b >= 0) add(last_b, last_g, set ^ 1);
      last_b = b, last_g = g;
    }
  }
  add(last_b, last_g, set ^ 1);
  for (int64_t i = 0; i < rows; ++i)
    for (int pb = 0; pb < NB; ++pb)
      gemm_store16_y(src.finish(_mm512_load_ps(f + i * kLd + 16 * pb), pb, bias[pb]), r0 + i,
                     c0[pb], cols[pb], y, y_dtype, ldy);
}

template <class Source>
void run_blocks(Source& src, const frt_packed_weight* w, int64_t p, int64_t np, const BlockRows& q,
                int64_t r0, int64_t rows, const float* bias, void* y, int32_t y_dtype,
                int64_t ldy) {
  __m512 bv[2];
  int64_t c0[2], cols[2];
  for (int64_t b = 0; b < 2; ++b) {
    const int64_t pb = p + std::min(b, np - 1);
    alignas(64) float panel_bias[FRT_PANEL];
    gemm_panel_bias(w, pb, bias, panel_bias);
    bv[b] = _mm512_load_ps(panel_bias);
    c0[b] = pb * FRT_PANEL;
    cols[b] = std::min<int64_t>(FRT_PANEL, w->n - c0[b]);
  }
  amx::configure(blocks_config());
  if (np == 2)
    pass<2>(src, q, r0, rows, bv, c0, cols, y, y_dtype, ldy);
  else
    pass<1>(src, q, r0, rows, bv, c0, cols, y, y_dtype, ldy);
  amx::release();
}

}  // namespace

void blocks_amx(const frt_packed_weight* w, int64_t p, int64_t np, const BlockRows& q, int64_t r0,
                int64_t rows, const float* bias, void* y, int32_t y_dtype, int64_t ldy) {
  if (w->format == FRT_W_INT8_GEMM) {
    Int8Source src(w, p, np);
    return run_blocks(src, w, p, np, q, r0, rows, bias, y, y_dtype, ldy);
  }
  with_w4a8_scales(w, p, [&](const auto& sc, auto five) {
    NibbleSource<std::decay_t<decltype(sc)>, decltype(five)::value> src(w, p, np, sc);
    run_blocks(src, w, p, np, q, r0, rows, bias, y, y_dtype, ldy);
  });
}

}  // namespace frt::kern
