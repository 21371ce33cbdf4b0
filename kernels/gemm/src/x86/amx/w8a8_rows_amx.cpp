// The per-row form (Note [W8A8 rows] in ref/w8a8_rows_ref.cpp) on AMX-INT8 tiles (Note [AMX rows]).
// The same integers as the zmm tile (tdpbusd and vpdpbusd are both u8 x s8 products summed in
// wrapping 32-bit arithmetic) and the zmm tile's epilogue, so the same fp32 bits.
#include <frt_kern/util.h>

#include <algorithm>
#include <cstring>

#include "gemm_tiles.h"
#include "x86/amx/amx_tiles.h"
#include "x86/avx512/gemm_zmm.h"

namespace frt::kern {
namespace {

// Note [AMX rows]: an int8_gemm panel is already a column of B tiles. Its quads of 16 columns x
// 4 inputs (64 bytes) are tdpbusd's B rows, so the 16 quads of one 64-input step are one 1 KiB
// tile at stride 64, read in place. An A tile is 16 quantized rows x 64 bytes at stride lda (lda
// is a multiple of 64; past the row's quads its bytes meet the zero rows of the B tail copy). Two A
// tiles and two B tiles make four 16x16 int32 C tiles: all eight tile registers, one tile load per
// tdpbusd. Rows up to kGemmAmxTiledMaxLda bytes wide are quantized into tile order instead
// (QuantRows::tiled): each 16-row group's bytes as one contiguous 1 KiB tile per step, which the
// tile loads and the prefetchers stream (16 rows lda apart are 16 lines in as many pages). A
// panel's last step, when its quads do not fill a tile, is read from a zero-padded copy (past the
// panel lie the next panel's bytes).
//
// The bytes decide the speed: a tdpbusd takes 16 cycles and its two loads 2 KiB, more than L2
// delivers. So the inputs go in chunks of 512 (8 steps): a panel pair's chunk (16 KiB) stays in
// L1 while every 32-row chunk of the block (at most kGemmAmxBlockRows rows, whose quantized bytes
// the op code keeps within L2) passes under it, and only the A tiles stream from L2. The C tiles
// of each row chunk go to an int32 block between chunks (4 KiB out and in per 512 inputs), and
// after the last chunk they are finished as the zmm tile finishes its accumulators, straight
// into y.
constexpr int kC = 0, kA = 4, kB = 6;  // tile registers: C[a][b] = kC + 2a + b, A[a], B[b]
constexpr int64_t kChunkSteps = 8;     // 64-input steps per chunk of inputs
constexpr int64_t kAccLd = 32 * 4;     // bytes per row of the int32 block (two panels)

amx::TileConfig tile_config() {
  amx::TileConfig c;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  return c;
}

// B tile b of step s: in place, or the zero-padded copy of the panel's last, partial step.
struct Panels {
  const int8_t* panel[2];
  const int8_t* tail[2];
  int64_t full;  // steps whose 16 quads are all in the panel
  const int8_t* step(int b, int64_t s) const { return s < full ? panel[b] + s * 1024 : tail[b]; }
};

template <int A, int B>
void accumulate() {
  amx::dpbusd<kC + 2 * A + B, kA + A, kB + B>();
}

// The C tiles of a 16 * NA rows x 16 * NB columns chunk: zeroed or loaded from acc, then moved
// in or out at acc (stride kAccLd; tile a b at row 16a, column 16b).
template <int NA, int NB>
void load_sums(const int32_t* acc, bool first) {
  if (first) {
    amx::zero<kC + 0>();
    if constexpr (NB == 2) amx::zero<kC + 1>();
    if constexpr (NA == 2) amx::zero<kC + 2>();
    if constexpr (NA == 2 && NB == 2) amx::zero<kC + 3>();
    return;
  }
  amx::load<kC + 0>(acc, kAccLd);
  if constexpr (NB == 2) amx::load<kC + 1>(acc + 16, kAccLd);
  if constexpr (NA == 2) amx::load<kC + 2>(acc + 16 * 32, kAccLd);
  if constexpr (NA == 2 && NB == 2) amx::load<kC + 3>(acc + 16 * 32 + 16, kAccLd);
}
template <int NA, int NB>
void store_sums(int32_t* acc) {
  amx::store<kC + 0>(acc, kAccLd);
  if constexpr (NB == 2) amx::store<kC + 1>(acc + 16, kAccLd);
  if constexpr (NA == 2) amx::store<kC + 2>(acc + 16 * 32, kAccLd);
  if constexpr (NA == 2 && NB == 2) amx::store<kC + 3>(acc + 16 * 32 + 16, kAccLd);
}

// Steps [s0, s1) of rows r.. (16 * NA of them) against NB panels, added to their sums in acc.
template <int NA, int NB>
void chunk_sums(const Panels& pn, int64_t s0, int64_t s1, const QuantRows& q, int64_t r,
                int32_t* acc) {
  load_sums<NA, NB>(acc, s0 == 0);
  // Row-major rows: a step is 64 bytes on, rows lda apart; tile order: a step is a whole tile.
  const bool tiled = r < q.tiled;
  const int64_t step = tiled ? 1024 : 64, stride = tiled ? 64 : q.lda;
  const uint8_t* a = q.u + r * q.lda;  // a 16-row group's bytes start where its first row would
  for (int64_t s = s0; s < s1; ++s) {
    amx::load<kB + 0>(pn.step(0, s), 64);
    if constexpr (NB == 2) amx::load<kB + 1>(pn.step(1, s), 64);
    amx::load<kA + 0>(a + s * step, stride);
    accumulate<0, 0>();
    if constexpr (NB == 2) accumulate<0, 1>();
    if constexpr (NA == 2) {
      amx::load<kA + 1>(a + 16 * q.lda + s * step, stride);
      accumulate<1, 0>();
      if constexpr (NB == 2) accumulate<1, 1>();
    }
  }
  store_sums<NA, NB>(acc);
}

// Sixteen results of row r, columns c0 .. c0 + cols (cols <= 16), into y in its dtype: bf16 by
// f32_to_bf16's rounding (nearest even; a NaN keeps its sign and top bits, made quiet).
void store16(__m512 f, int64_t r, int64_t c0, int64_t cols, void* y, int32_t y_dtype, int64_t ldy) {
  const __mmask16 m = gemm_lanes(cols);
  if (y_dtype == FRT_F32) {
    _mm512_mask_storeu_ps(static_cast<float*>(y) + r * ldy + c0, m, f);
    return;
  }
  const __m512i bits = _mm512_castps_si512(f);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), odd)), 16);
  const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(0x40));
  const __m256i h = _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
  _mm256_mask_storeu_epi16(static_cast<uint16_t*>(y) + r * ldy + c0, m, h);
}

// The zmm tile's epilogue (w8a8_rows_zmm.cpp) over `rows` rows of acc (rows r.. of the output)
// for panel p, column block b of acc.
void finish_panel(const frt_packed_weight* w, int64_t p, const int32_t* acc, int64_t b,
                  int64_t rows, const QuantRows& q, int64_t r, const float* bias, void* y,
                  int32_t y_dtype, int64_t ldy) {
  const RowsEpilogue e(w, p, bias);
  const int64_t c0 = p * FRT_PANEL, cols = std::min<int64_t>(FRT_PANEL, w->n - c0);
  for (int64_t i = 0; i < rows; ++i)
    store16(e.row(_mm512_loadu_si512(acc + i * 32 + 16 * b), q.zero[r + i], q.scale[r + i]), r + i,
            c0, cols, y, y_dtype, ldy);
}

}  // namespace

void w8a8_rows_amx(const frt_packed_weight* w, int64_t p, int64_t np, const QuantRows& q,
                   int64_t r0, int64_t rows, const float* bias, void* y, int32_t y_dtype,
                   int64_t ldy) {
  const int64_t kq = div_up(w->k, 4), steps = div_up(kq, 16);
  Panels pn;
  pn.full = kq / 16;
  alignas(64) int8_t tail_bytes[2][1024] = {};
  for (int64_t b = 0; b < 2; ++b) {
    pn.panel[b] = static_cast<const int8_t*>(w->qdata) + (p + std::min(b, np - 1)) * kq * 64;
    pn.tail[b] = tail_bytes[b];
    if (b < np) std::memcpy(tail_bytes[b], pn.panel[b] + pn.full * 1024, (kq - pn.full * 16) * 64);
  }
  alignas(64) int32_t acc[kGemmAmxBlockRows * 32];
  amx::configure(tile_config());
  for (int64_t s0 = 0; s0 < steps; s0 += kChunkSteps) {
    const int64_t s1 = std::min(steps, s0 + kChunkSteps);
    for (int64_t r = r0; r < r0 + rows; r += 32) {
      int32_t* c = acc + (r - r0) * 32;
      const bool pair = np == 2, two = r0 + rows - r >= 32;  // else one panel, one A tile
      if (two && pair)
        chunk_sums<2, 2>(pn, s0, s1, q, r, c);
      else if (two)
        chunk_sums<2, 1>(pn, s0, s1, q, r, c);
      else if (pair)
        chunk_sums<1, 2>(pn, s0, s1, q, r, c);
      else
        chunk_sums<1, 1>(pn, s0, s1, q, r, c);
    }
  }
  amx::release();
  for (int64_t b = 0; b < np; ++b)
    finish_panel(w, p + b, acc, b, rows, q, r0, bias, y, y_dtype, ldy);
}

}  // namespace frt::kern
