// The AMX tile instructions the amx builds use (AMX-INT8 in flashrt/gemm, AMX-BF16 in the
// weight-only panels), as templates on the tile register: the compiler's intrinsics in the
// shipped build (FRT_AMX), their documented semantics in plain C++ in the test-only emulated one
// (FRT_AMX_EMULATED; Note [Emulated AMX tiles]).
#pragma once

#include <cmath>
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
// tdpbssd and tdpbsud the same with A signed and B signed or unsigned; tdpbf16ps runs, per
// C[m][n], two fp32 FMA chains from zero over k (A[m][2k] * B[k][2n], A[m][2k+1] * B[k][2n+1]),
// adds their sum to C, denormal inputs read as zero and denormal results flushed (the SDM's
// pseudocode; the bf16 path's tests hold it and the hardware to float64, not to each other);
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
template <int C, int A, int B>
void dpbf16ps() {
  const TileConfig& c = tiles.config;
  const auto flush = [](float f) { return std::fpclassify(f) == FP_SUBNORMAL ? 0.0f * f : f; };
  const auto value = [&](const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    const uint32_t bits = uint32_t{h} << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return flush(f);
  };
  for (int m = 0; m < c.rows[C]; ++m)
    for (int n = 0; n < c.colsb[C] / 4; ++n) {
      float pair[2] = {0.0f, 0.0f};
      for (int k = 0; k < c.colsb[A] / 4; ++k)
        for (int i = 0; i < 2; ++i)
          pair[i] = flush(std::fma(value(tiles.data[A][m] + 4 * k + 2 * i),
                                   value(tiles.data[B][k] + 4 * n + 2 * i), pair[i]));
      float acc;
      std::memcpy(&acc, tiles.data[C][m] + 4 * n, 4);
      acc = flush(acc + flush(pair[0] + pair[1]));
      std::memcpy(tiles.data[C][m] + 4 * n, &acc, 4);
    }
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

// GCC 12's ldtilecfg declares only the operand's first 8 bytes read: the same memory clobber
// keeps the stores of the rows and bytes per row the configuration holds.
inline void configure(const TileConfig& c) {
  __asm__ volatile("" : : "r"(&c) : "memory");
  _tile_loadconfig(&c);
}
inline void release() { _tile_release(); }
template <int T>
void zero() {
#define FRT_AMX_ZERO(t) _tile_zero(t)
  FRT_AMX_EACH_TILE(FRT_AMX_ZERO);
#undef FRT_AMX_ZERO
}
// GCC's tileloadd names no memory operand and no clobber, so the compiler may sink, or drop as
// dead, the stores that fill a buffer the tile load reads (the weight-only panels' widened B
// tiles, written just before): an empty asm with a memory clobber orders them first.
template <int T>
void load(const void* src, int64_t stride) {
  __asm__ volatile("" : : "r"(src) : "memory");
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
// The bf16 products the weight-only panels use (Note [Tile panels] in panels_amx.cpp): C tiles
// 0..2, A tiles 3..5, B tiles 6 and 7; and the sequence attention's, below.
#define FRT_AMX_BF16(c, a, b) \
  if constexpr (C == c && A == a && B == b) _tile_dpbf16ps(c, a, b)
template <int C, int A, int B>
void dpbf16ps() {
  static_assert((C >= 0 && C <= 2 && A >= 3 && A <= 5 && (B == 6 || B == 7)) ||
                    ((C == 0 || C == 1) && (A == 6 || A == 7) && B >= 2 && B <= 5),
                "a register triple neither the bf16 panels nor the sequence attention use");
  FRT_AMX_BF16(0, 3, 6);
  FRT_AMX_BF16(0, 4, 6);
  FRT_AMX_BF16(0, 5, 6);
  FRT_AMX_BF16(1, 3, 6);
  FRT_AMX_BF16(1, 4, 6);
  FRT_AMX_BF16(1, 5, 6);
  FRT_AMX_BF16(2, 3, 6);
  FRT_AMX_BF16(2, 4, 6);
  FRT_AMX_BF16(2, 5, 6);
  FRT_AMX_BF16(0, 3, 7);
  FRT_AMX_BF16(0, 4, 7);
  FRT_AMX_BF16(0, 5, 7);
  FRT_AMX_BF16(1, 3, 7);
  FRT_AMX_BF16(1, 4, 7);
  FRT_AMX_BF16(1, 5, 7);
  FRT_AMX_BF16(2, 3, 7);
  FRT_AMX_BF16(2, 4, 7);
  FRT_AMX_BF16(2, 5, 7);
  // The sequence attention's (Note [Sequence attention tiles] in flashrt/gemm's
  // attention_amx.cpp): C 0..1, A 6..7, B 2..5.
  FRT_AMX_BF16(0, 6, 2);
  FRT_AMX_BF16(0, 6, 3);
  FRT_AMX_BF16(0, 6, 4);
  FRT_AMX_BF16(0, 6, 5);
  FRT_AMX_BF16(0, 7, 2);
  FRT_AMX_BF16(0, 7, 3);
  FRT_AMX_BF16(0, 7, 4);
  FRT_AMX_BF16(0, 7, 5);
  FRT_AMX_BF16(1, 6, 2);
  FRT_AMX_BF16(1, 6, 3);
  FRT_AMX_BF16(1, 6, 4);
  FRT_AMX_BF16(1, 6, 5);
  FRT_AMX_BF16(1, 7, 2);
  FRT_AMX_BF16(1, 7, 3);
  FRT_AMX_BF16(1, 7, 4);
  FRT_AMX_BF16(1, 7, 5);
}
#undef FRT_AMX_BF16
#endif

}  // namespace frt::kern::amx
