// Sequence attention on AMX-BF16 tiles (Note [Sequence attention tiles]); the op code and the
// portable path are gemm_attention.cpp's.
#include <frt_kern/amx_tiles.h>
#include <frt_kern/util.h>
#include <frt_kern/zmm.h>

#include <algorithm>
#include <limits>

#include "gemm_attention.h"
#include "gemm_tiles.h"
#include "x86/avx512/gemm_zmm.h"

namespace frt::kern {
namespace {

// Note [Sequence attention tiles]: an item (Note [Sequence attention]) computes its transpose,
// O^T = V^T P^T, so that sixteen queries are a tile's sixteen columns and every row the vector
// unit touches is one zmm of sixteen queries:
//   - scores S^T = K Q^T: A is a 16-key x 32-dim tile of the packed keys (Note [Sequence
//     attention packs]), B the item's queries as 16 dim pairs x 16 queries (dims 2r and 2r + 1
//     of query n in word pair n of row r; up to four such tiles, kept in B 2..5 for a block),
//     C a 16-key x 16-query tile of fp32 scores. Two C tiles (two key tiles) are formed at once
//     so neither product waits on the other's result.
//   - the softmax runs down the key rows, query by query in the lanes: a block's maximum is an
//     elementwise max of rows, the weights 2^(x - m) one exp2 a row, the denominator their fp32
//     sum; no horizontal reduction anywhere. The running maximum m moves only when a block's
//     exceeds it by more than kRescaleSlack doublings (the weights stay below 2^8, far inside
//     bf16 and fp32), so the output's rescaling, a multiply of every row of O^T, is rare after
//     the first block; the final division by the denominator, formed against the same m, is
//     exact whichever m it was.
//   - the weights go to bf16 (nearest even, vcvtneps2bf16) as B tiles of 16 key pairs x 16
//     queries, keys 2r and 2r + 1 of a 32-key tile in word pair n of row r (two rows converted,
//     joined and interleaved by one vpermw). The exp2 is a degree-3 polynomial whose error is a
//     twenty-fifth of that rounding.
//   - O^T += V^T P^T: A a 16-dim x 32-key tile of the transposed values, B the weight tiles
//     (in B 2..5: a block's 128 keys), C the running sums of two 16-dim tiles of O^T loaded from
//     and stored back to the item's fp32 rows on the stack.
// Every tile is a whole 16 x 64 bytes (the packs' zero padding), so one configuration serves the
// call: C 0..1, B 2..5, A 6..7. Keys past kv_len in the last block get weight 0 (their padded
// values are 0 too); queries past q_len are zero columns whose results are not stored. Measured
// on the Xeon (docs/benchmarks.md, "Attention over whole sequences"): 0.5-0.8 TFLOP/s, a tenth
// of the tile ceiling; two query tiles an item (2 x 2 blocking), and issuing the next block's
// scores before this block's softmax, measured no faster.
constexpr int kC0 = 0, kC1 = 1, kB0 = 2, kA0 = 6, kA1 = 7;
constexpr int64_t kTileBytes = 64;
constexpr int64_t kPairTiles = kAttnKeyBlock / 32;  // weight tiles a block
constexpr float kRescaleSlack = 8.0f;

amx::TileConfig config() {
  amx::TileConfig c;
  for (int t = 0; t < 8; ++t) c.rows[t] = 16, c.colsb[t] = kTileBytes;
  return c;
}

// B tile kB0 + b (b < 4) loaded, and C += A B(kB0 + b): the register as a literal.
inline void load_b(int b, const void* src, int64_t stride) {
  switch (b) {
    case 0:
      amx::load<kB0>(src, stride);
      break;
    case 1:
      amx::load<kB0 + 1>(src, stride);
      break;
    case 2:
      amx::load<kB0 + 2>(src, stride);
      break;
    default:
      amx::load<kB0 + 3>(src, stride);
      break;
  }
}
template <int C, int A>
inline void dot_b(int b) {
  switch (b) {
    case 0:
      amx::dpbf16ps<C, A, kB0>();
      break;
    case 1:
      amx::dpbf16ps<C, A, kB0 + 1>();
      break;
    case 2:
      amx::dpbf16ps<C, A, kB0 + 2>();
      break;
    default:
      amx::dpbf16ps<C, A, kB0 + 3>();
      break;
  }
}

// 2^f on [0, 1) to the weights' need: a degree-3 fit of the relative error (under 8e-5, a
// twenty-fifth of the bf16 rounding every weight takes after it).
constexpr float kExp2Poly3[4] = {0.9999278783798218f, 0.6957767605781555f, 0.22623352706432343f,
                                 0.07790721952915192f};

// 2^x for sixteen lanes: that polynomial on x - floor(x), scaled by vscalefps. x below -150
// counts as -150 (a weight of 0: so a score of -inf, from a dot product that overflowed, weighs
// nothing rather than making f NaN); NaN stays NaN (max returns its second operand then).
inline __m512 exp2_16(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(-150.0f), x);
  const __m512 n = _mm512_floor_ps(x);
  const __m512 f = _mm512_sub_ps(x, n);
  __m512 p = _mm512_set1_ps(kExp2Poly3[3]);
  for (int i = 2; i >= 0; --i) p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(kExp2Poly3[i]));
  return _mm512_scalef_ps(p, n);
}

// Two rows of sixteen fp32 as bf16 (nearest even, gemm_cvtneps_bf16) interleaved: lane n holds
// lo[n] in its low word and hi[n] in its high one (the pair a B tile row or an output dword
// takes).
inline __m512i bf16_pairs(__m512 lo, __m512 hi) {
  const __m512i both =
      _mm512_inserti64x4(_mm512_castsi256_si512(gemm_cvtneps_bf16(lo)), gemm_cvtneps_bf16(hi), 1);
  const __m512i order = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24,
                                         8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return _mm512_permutexvar_epi16(order, both);
}

void item_on_tiles(const frt_sequence_attention_args* a, const AttentionPack& pack,
                   const AttentionItem& it) {
  const int64_t d = a->head_dim, nq = std::min(kAttnQueries, a->q_len - it.q0);
  const int64_t kvh = it.h / (a->heads / a->kv_heads);
  const int chunks = static_cast<int>(pack.chunks);
  const int64_t o_tiles = pack.v_tiles;
  const uint16_t* keys = pack.keys(it.b, kvh, a->kv_heads);
  const uint16_t* values_t = pack.values_t(it.b, kvh, a->kv_heads);
  alignas(64) uint32_t qt[kAttnTileMaxHeadDim / 32][16][16];  // B tiles of the queries
  alignas(64) uint32_t pt[kPairTiles][16][16];                // B tiles of a block's weights
  alignas(64) float s[kAttnKeyBlock][16];                     // a block's scores (raw)
  alignas(64) float o[kAttnTileMaxHeadDim][16];               // O^T's running sums
  // The queries' dim pairs as B tile rows: pair r of query n is lane n of row r % 16 of tile
  // r / 16 (zero past head_dim and past the last query).
  std::memset(qt, 0, sizeof(uint32_t) * 256 * static_cast<size_t>(chunks));
  for (int64_t n = 0; n < nq; ++n) {
    const uint16_t* q = head_row(a->q, a->q_ld, it.b, it.q0 + n, it.h);
    for (int64_t r = 0; r < d / 2; ++r) {
      uint32_t pair;
      std::memcpy(&pair, q + 2 * r, 4);
      qt[r / 16][r % 16][n] = pair;
    }
    if (d % 2 != 0) qt[d / 32][d / 2 % 16][n] = q[d - 1];
  }
  for (int64_t i = 0; i < 16 * o_tiles; ++i) _mm512_store_ps(o[i], _mm512_setzero_ps());
  const __m512 c2 = _mm512_set1_ps(a->scale * kAttnLog2e), slack = _mm512_set1_ps(kRescaleSlack);
  const bool negative_scale = a->scale < 0;
  // The denominator as two sums (even and odd keys), so no add waits on the one before.
  __m512 m = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __m512 l0 = _mm512_setzero_ps(), l1 = _mm512_setzero_ps();
  const int64_t blocks = div_up(a->kv_len, kAttnKeyBlock);
  const auto keys_in = [&](int64_t blk) {
    return std::min(kAttnKeyBlock, a->kv_len - blk * kAttnKeyBlock);
  };
  // S^T = K Q^T for block blk into s, two key tiles at a time.
  const auto scores = [&](int64_t blk) {
    const int64_t k0 = blk * kAttnKeyBlock, key_tiles = div_up(keys_in(blk), 16);
    for (int c = 0; c < chunks; ++c) load_b(c, qt[c], kTileBytes);
    for (int64_t t = 0; t < key_tiles; t += 2) {
      const bool two = t + 1 < key_tiles;
      const uint16_t* k_tile = keys + ((k0 / 16 + t) * chunks) * AttentionPack::kTile;
      amx::zero<kC0>();
      if (two) amx::zero<kC1>();
      for (int c = 0; c < chunks; ++c) {
        amx::load<kA0>(k_tile + c * AttentionPack::kTile, kTileBytes);
        dot_b<kC0, kA0>(c);
        if (two) {
          amx::load<kA1>(k_tile + (chunks + c) * AttentionPack::kTile, kTileBytes);
          dot_b<kC1, kA1>(c);
        }
      }
      amx::store<kC0>(s[16 * t], kTileBytes);
      if (two) amx::store<kC1>(s[16 * t + 16], kTileBytes);
    }
  };
  // The softmax step of block blk: the scores s to the weights pt.
  const auto weights = [&](int64_t blk) {
    const int64_t nk = keys_in(blk), pair_tiles = div_up(nk, 32);
    // The block's maximum in base 2 (the extreme raw score times c2: the largest, or the least
    // for a negative scale), four running extremes so no max waits on the one before; the
    // running maximum moves past the slack only.
    __m512 ext[4];
    for (int w = 0; w < 4; ++w) ext[w] = _mm512_load_ps(s[0]);
    for (int64_t j = 1; j < nk; ++j) {
      const __m512 x = _mm512_load_ps(s[j]);
      ext[j % 4] = negative_scale ? _mm512_min_ps(x, ext[j % 4]) : _mm512_max_ps(x, ext[j % 4]);
    }
    const __m512 extreme =
        negative_scale
            ? _mm512_min_ps(_mm512_min_ps(ext[0], ext[1]), _mm512_min_ps(ext[2], ext[3]))
            : _mm512_max_ps(_mm512_max_ps(ext[0], ext[1]), _mm512_max_ps(ext[2], ext[3]));
    const __m512 block_max = _mm512_mul_ps(extreme, c2);
    if (blk == 0) {
      m = block_max;
    } else if (const __mmask16 grow =
                   _mm512_cmp_ps_mask(block_max, _mm512_add_ps(m, slack), _CMP_GT_OQ);
               grow != 0) {
      const __m512 moved = _mm512_mask_mov_ps(m, grow, block_max);
      const __m512 alpha =
          _mm512_mask_mov_ps(_mm512_set1_ps(1.0f), grow, exp2_16(_mm512_sub_ps(m, moved)));
      l0 = _mm512_mul_ps(l0, alpha);
      l1 = _mm512_mul_ps(l1, alpha);
      for (int64_t i = 0; i < 16 * o_tiles; ++i)
        _mm512_store_ps(o[i], _mm512_mul_ps(_mm512_load_ps(o[i]), alpha));
      m = moved;
    }
    // The weights 2^(s c2 - m), summed unrounded, stored rounded as pair rows of B tiles. s c2
    // is rounded before m comes off (not one fused step), so the score m came from weighs 2^0
    // (the polynomial's 0.99993) however large it is. While every score so far is -inf, m is
    // too and the weights are taken against 0 instead (each 2^-inf: 0), not -inf - -inf.
    const __m512 base = _mm512_mask_mov_ps(
        m,
        _mm512_cmp_ps_mask(m, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), _CMP_EQ_OQ),
        _mm512_setzero_ps());
    for (int64_t j = 0; j < 32 * pair_tiles; j += 2) {
      const __m512 p0 = j < nk
                            ? exp2_16(_mm512_sub_ps(_mm512_mul_ps(_mm512_load_ps(s[j]), c2), base))
                            : _mm512_setzero_ps();
      const __m512 p1 =
          j + 1 < nk ? exp2_16(_mm512_sub_ps(_mm512_mul_ps(_mm512_load_ps(s[j + 1]), c2), base))
                     : _mm512_setzero_ps();
      l0 = _mm512_add_ps(l0, p0);
      l1 = _mm512_add_ps(l1, p1);
      _mm512_store_si512(reinterpret_cast<__m512i*>(pt[j / 32][j % 32 / 2]), bf16_pairs(p0, p1));
    }
  };
  // O^T += V^T P^T for block blk, two 16-dim tiles at a time.
  const auto accumulate = [&](int64_t blk) {
    const int64_t k0 = blk * kAttnKeyBlock, pair_tiles = div_up(keys_in(blk), 32);
    for (int64_t u = 0; u < pair_tiles; ++u) load_b(static_cast<int>(u), pt[u], kTileBytes);
    for (int64_t h = 0; h < o_tiles; h += 2) {
      const bool two = h + 1 < o_tiles;
      const uint16_t* v_tile = values_t + (h * pack.blocks + k0 / 32) * AttentionPack::kTile;
      amx::load<kC0>(o[16 * h], kTileBytes);
      if (two) amx::load<kC1>(o[16 * h + 16], kTileBytes);
      for (int64_t u = 0; u < pair_tiles; ++u) {
        amx::load<kA0>(v_tile + u * AttentionPack::kTile, kTileBytes);
        dot_b<kC0, kA0>(static_cast<int>(u));
        if (two) {
          amx::load<kA1>(v_tile + (pack.blocks + u) * AttentionPack::kTile, kTileBytes);
          dot_b<kC1, kA1>(static_cast<int>(u));
        }
      }
      amx::store<kC0>(o[16 * h], kTileBytes);
      if (two) amx::store<kC1>(o[16 * h + 16], kTileBytes);
    }
  };
  // Block by block, each unit reading what the other stored (Note [Sequence attention tiles]).
  for (int64_t blk = 0; blk < blocks; ++blk) {
    scores(blk);
    weights(blk);
    accumulate(blk);
  }
  // out = O / l: dims 2r and 2r + 1 of the sixteen queries as one row of bf16 pairs, then each
  // query's pairs written to its own row.
  const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_add_ps(l0, l1));
  alignas(64) uint32_t pairs[kAttnTileMaxHeadDim / 2][16];
  for (int64_t r = 0; r < div_up(d, 2); ++r)
    _mm512_store_si512(reinterpret_cast<__m512i*>(pairs[r]),
                       bf16_pairs(_mm512_mul_ps(_mm512_load_ps(o[2 * r]), inv),
                                  _mm512_mul_ps(_mm512_load_ps(o[2 * r + 1]), inv)));
  for (int64_t n = 0; n < nq; ++n) {
    uint16_t* out = head_row(a->out, a->out_ld, it.b, it.q0 + n, it.h);
    for (int64_t r = 0; r < d / 2; ++r) std::memcpy(out + 2 * r, &pairs[r][n], 4);
    if (d % 2 != 0) out[d - 1] = static_cast<uint16_t>(pairs[d / 2][n]);
  }
}

}  // namespace

void attention_amx(const frt_sequence_attention_args* a, const AttentionPack& pack, int64_t i0,
                   int64_t i1) {
  if (i0 >= i1) return;
  const amx::TileConfig c = config();
  amx::configure(c);
  for (int64_t i = i0; i < i1; ++i) item_on_tiles(a, pack, attention_item(a, i));
  amx::release();
}

}  // namespace frt::kern
