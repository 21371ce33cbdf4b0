// flashrt/gemm's sequence attention (FRT_OP_SEQUENCE_ATTENTION): what the op code
// (gemm_attention.cpp) and the amx variant's tiles (x86/amx/attention_amx.cpp) share.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>

namespace frt::kern {

// Queries one work item takes (a tile's sixteen columns), and keys per softmax step (four
// 32-key tiles of probabilities).
inline constexpr int64_t kAttnQueries = 16;
inline constexpr int64_t kAttnKeyBlock = 128;
// Widths the op takes (the portable path's stack rows), and those the tiles take (four 32-wide
// chunks of a query held in tiles).
inline constexpr int64_t kAttnMaxHeadDim = 512;
inline constexpr int64_t kAttnTileMaxHeadDim = 128;
// The softmax's scores ride in base 2: s * scale * log2(e), then 2^(x - max).
inline constexpr float kAttnLog2e = 1.44269504088896341f;
// 2^f on [0, 1): a degree-5 fit of the relative error (under 2e-7 in fp32 evaluation).
inline constexpr float kExp2Poly[6] = {0.9999999403953552f,   0.6931529641151428f,
                                       0.24015453457832336f,  0.05582359433174133f,
                                       0.008992589078843594f, 0.0018762336112558842f};
// Below this a weight would be subnormal: it counts as 2^-126, which weighs nothing.
inline constexpr float kExp2Lo = -126.0f;

// Note [Sequence attention packs]: the tile path reads keys and values from copies the op's first
// phase writes into the workspace, one pair per sequence and KV head, zero-padded so that every
// tile is a whole 16 x 64 bytes, and tile-major, so that every tile load reads 1 KiB in one run
// (row-major copies had it gather 16 rows a key stride or a position stride apart):
//   - keys: for each 16 positions and each 32 dims of a head (head_dim rounded up to 32), a
//     16 x 32 tile of bf16, positions by dims;
//   - values transposed: for each 16 dims (head_dim rounded up to 16) and each 32 positions, a
//     16 x 32 tile, dims by positions, the A operand of O^T = V^T P^T.
struct AttentionPack {
  int64_t k_tiles, chunks;                   // keys: 16-position tiles, 32-dim chunks of each
  int64_t v_tiles, blocks;                   // values: 16-dim tiles, 32-position blocks of each
  int64_t per_head;                          // elements of one sequence and KV head's pair
  uint16_t* base;                            // the workspace (nullptr on the portable path)
  static constexpr int64_t kTile = 16 * 32;  // elements of a tile
  uint16_t* keys(int64_t b, int64_t kvh, int64_t kv_heads) const {
    return base + (b * kv_heads + kvh) * per_head;
  }
  uint16_t* values_t(int64_t b, int64_t kvh, int64_t kv_heads) const {
    return keys(b, kvh, kv_heads) + k_tiles * chunks * kTile;
  }
  // Where key t's dim i, and value t's dim i, go in their packs.
  int64_t key_at(int64_t t, int64_t i) const {
    return ((t / 16 * chunks + i / 32) * 16 + t % 16) * 32 + i % 32;
  }
  int64_t value_at(int64_t t, int64_t i) const {
    return ((i / 16 * blocks + t / 32) * 16 + i % 16) * 32 + t % 32;
  }
};

inline AttentionPack attention_pack(const frt_sequence_attention_args* a) {
  AttentionPack p{};
  p.k_tiles = (a->kv_len + 15) / 16;
  p.chunks = (a->head_dim + 31) / 32;
  p.v_tiles = (a->head_dim + 15) / 16;
  p.blocks = (a->kv_len + 31) / 32;
  p.per_head = (p.k_tiles * p.chunks + p.v_tiles * p.blocks) * AttentionPack::kTile;
  p.base = static_cast<uint16_t*>(a->workspace);
  return p;
}

// A work item: one sequence, one head, the queries from q0.
struct AttentionItem {
  int64_t b, h, q0;
};
// Work item i (of batch * heads * query blocks of kAttnQueries): its sequence, head and first
// query.
inline AttentionItem attention_item(const frt_sequence_attention_args* a, int64_t i) {
  const int64_t blocks = (a->q_len + kAttnQueries - 1) / kAttnQueries;
  return {i / (a->heads * blocks), i / blocks % a->heads, i % blocks * kAttnQueries};
}

// The row of position t, head h of sequence b in a tensor of the op (its ld: sequence, position,
// head strides in elements).
inline const uint16_t* head_row(const void* base, const int64_t ld[3], int64_t b, int64_t t,
                                int64_t h) {
  return static_cast<const uint16_t*>(base) + b * ld[0] + t * ld[1] + h * ld[2];
}
inline uint16_t* head_row(void* base, const int64_t ld[3], int64_t b, int64_t t, int64_t h) {
  return static_cast<uint16_t*>(base) + b * ld[0] + t * ld[1] + h * ld[2];
}

}  // namespace frt::kern
