// The AMX-INT8 tile instructions the amx build uses, as templates on the tile register: the
// compiler's intrinsics in the shipped build (FRT_AMX), their documented semantics in plain C++
// in the test-only emulated one (FRT_AMX_EMULATED; Note [Emulated AMX tiles]).
#pragma once

#include <cstdint>
#include <cstring>

#if !defined(FRT_AMX_EMULATED)
#include <immintrin.h>
#endif

namespace frt::kern::amx {

// The 64-byte operand of ldtilecfg, palette 1 (Intel SDM, "TILECFG"): per tile register its
// rows and its bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64);

// Note [Emulated AMX tiles]: the emulated build keeps eight tiles of 16 rows x 64 bytes per
// thread and follows the SDM's pseudocode: ldtilecfg zeroes every tile; tileloadd fills a tile's
// configured rows and bytes and zeroes the rest; tdpbusd adds to C[m][n], over the k of
// A's bytes / 4, the four products of unsigned A[m][4k+i] and signed B[k][4n+i], in 32-bit
// arithmetic that wraps (as vpdpbusd's does, so the two paths' sums agree bit for bit), and
// tdpbssd and tdpbsud the same with A signed and B signed or unsigned;
// tilestored writes the configured rows and bytes. It is never shipped: the kernel tests run the
// amx sources through it on every CPU, bitwise against the generic variant.
#if defined(FRT_AMX_EMULATED)
struct EmulatedTiles {
  TileConfig config;
  uint8_t data[8][16][64];
};
inline thread_local EmulatedTiles tiles;

inline void configure(const TileConfig& c) {
  tiles.config = c;
  std::memset(tiles.data, 0, sizeof tiles.data);
}
inline void release() { std::memset(tiles.data, 0, sizeof tiles.data); }
template <int T>
void zero() {
  std::memset(tiles.data[T], 0, sizeof tiles.data[T]);
}
template <int T>
void load(const void* src, int64_t stride) {
  std::memset(tiles.data[T], 0, sizeof tiles.data[T]);
  for (int r = 0; r < tiles.config.rows[T]; ++r)
    std::memcpy(tiles.data[T][r], static_cast<const uint8_t*>(src) + r * stride,
                tiles.config.colsb[T]);
}
template <int T>
void store(void* dst, int64_t stride) {
  for (int r = 0; r < tiles.config.rows[T]; ++r)
    std::memcpy(static_cast<uint8_t*>(dst) + r * stride, tiles.data[T][r], tiles.config.colsb[T]);
}
// C[m][n] += the products of A's and B's bytes, each read signed or unsigned as the
// instruction's letters say (tdpb<A><B>d: s signed, u unsigned).
template <int C, int A, int B, bool ASigned, bool BSigned>
void dot_bytes() {
  const TileConfig& c = tiles.config;
  const auto byte = [](uint8_t v, bool is_signed) {
    return is_signed ? int32_t{static_cast<int8_t>(v)} : int32_t{v};
  };
  for (int m = 0; m < c.rows[C]; ++m)
    for (int n = 0; n < c.colsb[C] / 4; ++n) {
      uint32_t acc;
      std::memcpy(&acc, tiles.data[C][m] + 4 * n, 4);
      for (int k = 0; k < c.colsb[A] / 4; ++k)
        for (int i = 0; i < 4; ++i)
          acc += static_cast<uint32_t>(byte(tiles.data[A][m][4 * k + i], ASigned) *
                                       byte(tiles.data[B][k][4 * n + i], BSigned));
      std::memcpy(tiles.data[C][m] + 4 * n, &acc, 4);
    }
}
template <int C, int A, int B>
void dpbusd() {
  dot_bytes<C, A, B, false, true>();
}
template <int C, int A, int B>
void dpbssd() {
  dot_bytes<C, A, B, true, true>();
}
template <int C, int A, int B>
void dpbsud() {
  dot_bytes<C, A, B, true, false>();
}
#else
// GCC's tile intrinsics paste the register number into their assembly text, so each needs a
// literal: every tile register is spelled out once here.
#define FRT_AMX_EACH_TILE(op)  \
  if constexpr (T == 0) op(0); \
  if constexpr (T == 1) op(1); \
  if constexpr (T == 2) op(2); \
  if constexpr (T == 3) op(3); \
  if constexpr (T == 4) op(4); \
  if constexpr (T == 5) op(5); \
  if constexpr (T == 6) op(6); \
  if constexpr (T == 7) op(7)

inline void configure(const TileConfig& c) { _tile_loadconfig(&c); }
inline void release() { _tile_release(); }
template <int T>
void zero() {
#define FRT_AMX_ZERO(t) _tile_zero(t)
  FRT_AMX_EACH_TILE(FRT_AMX_ZERO);
#undef FRT_AMX_ZERO
}
template <int T>
void load(const void* src, int64_t stride) {
#define FRT_AMX_LOAD(t) _tile_loadd(t, src, stride)
  FRT_AMX_EACH_TILE(FRT_AMX_LOAD);
#undef FRT_AMX_LOAD
}
template <int T>
void store(void* dst, int64_t stride) {
#define FRT_AMX_STORE(t) _tile_stored(t, dst, stride)
  FRT_AMX_EACH_TILE(FRT_AMX_STORE);
#undef FRT_AMX_STORE
}
#undef FRT_AMX_EACH_TILE
// The four products the 2 x 2 blocking uses (C = 2a + b from A = 4 + a and B = 6 + b): u8 x s8
// (the per-row form), s8 x s8 (the int8 block form) and s8 x u8 (the nibble forms).
#define FRT_AMX_EACH_PRODUCT(op)                                                             \
  static_assert(A == 4 + C / 2 && B == 6 + C % 2, "a register triple the tiles do not use"); \
  if constexpr (C == 0) op(0, 4, 6);                                                         \
  if constexpr (C == 1) op(1, 4, 7);                                                         \
  if constexpr (C == 2) op(2, 5, 6);                                                         \
  if constexpr (C == 3) op(3, 5, 7)
template <int C, int A, int B>
void dpbusd() {
  FRT_AMX_EACH_PRODUCT(_tile_dpbusd);
}
template <int C, int A, int B>
void dpbssd() {
  FRT_AMX_EACH_PRODUCT(_tile_dpbssd);
}
template <int C, int A, int B>
void dpbsud() {
  FRT_AMX_EACH_PRODUCT(_tile_dpbsud);
}
#undef FRT_AMX_EACH_PRODUCT
#endif

}  // namespace frt::kern::amx
