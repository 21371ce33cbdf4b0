// The per-row form (Note [W8A8 rows] in ref/w8a8_rows_ref.cpp) on AMX-INT8 tiles (Note [AMX rows]).
// The same integers as the zmm tile (tdpbusd and vpdpbusd are both u8 x s8 products summed in
// wrapping 32-bit arithmetic) and the zmm tile's epilogue, so the same fp32 bits.
#include <frt_kern/amx_tiles.h>
#include <frt_kern/util.h>

#include <algorithm>
#include <cstring>

#include "gemm_tiles.h"
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
// delivers. So the inputs go in chunks of at most 512 (8 steps): the fewest such chunks, each of
// the same number of steps but the first, which takes what is left (1152 inputs: 6 + 6 + 6 steps
// rather than 2 + 8 + 8, -5 to -12% time; the C tiles' traffic is the same three chunks, so the
// likely cause is a panel pair's chunk of 12 KiB rather than 16 beside the int32 block in L1). A
// panel pair's chunk (at most 16 KiB) stays in L1 while every 32-row chunk of the block (at most
// kGemmAmxBlockRows rows, whose quantized bytes the op code keeps within L2) passes under it, and
// only the A tiles stream from L2. The C tiles of each row chunk go to an int32 block between
// chunks (4 KiB out and in per 512 inputs). Even so four tile loads per four tdpbusd hold the loop
// to ~70% of the tile unit (a probe with every operand in L1 reads 71%; with one of the two
// operands held in its tiles, 86%), and with 2x2 C tiles in the eight registers no order loads
// fewer.
//
// The rest is kept off the tiles' path, each measured on the Xeon (bench/results/amx/):
//   - the finish: after the last chunk a row group's sums are final, and they are finished (the
//     zmm tile's epilogue, straight into y) a few rows after each step of the next group, so the
//     vector work runs while the tiles compute. A short chunk goes first, so the last chunk is
//     whole and the finish spreads over all its steps. (-1 to -10% time at 512-2048 rows;
//     finishing after the whole block left the tiles idle for a fifth of it. Finishing a pair's
//     block over every step of the next pair instead measured no better.)
//   - the next chunk's panel bytes are prefetched toward L2 a few lines per step (NextChunk):
//     the first row group of a chunk otherwise waits on memory for its B tiles (-1 to -10%).

constexpr int kC = 0, kA = 4, kB = 6;  // tile registers: C[a][b] = kC + 2a + b, A[a], B[b]
constexpr int64_t kChunkSteps = 8;     // the most 64-input steps per chunk of inputs
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

// Steps [s0, s1) of rows r.. (16 * NA of them) against NB panels, added to their sums in acc;
// `between()` runs after each step's products are issued (vector work that overlaps them).
template <int NA, int NB, class Between>
void chunk_sums(const Panels& pn, int64_t s0, int64_t s1, const QuantRows& q, int64_t r,
                int32_t* acc, Between&& between) {
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
    between();
  }
  store_sums<NA, NB>(acc);
}

// The zmm tile's epilogue (w8a8_rows_zmm.cpp) for finished rows of acc, a few at a time: the
// rows [next, end) of the row group handed over last, output row r0 + i for acc row i.
class Finisher {
 public:
  Finisher(const frt_packed_weight* w, int64_t p, int64_t np, const QuantRows& q, int64_t r0,
           const int32_t* acc, const float* bias, void* y, int32_t y_dtype, int64_t ldy)
      : q_(q),
        r0_(r0),
        acc_(acc),
        np_(np),
        y_(y),
        y_dtype_(y_dtype),
        ldy_(ldy),
        e_{RowsEpilogue(w, p, bias), RowsEpilogue(w, p + np - 1, bias)} {
    for (int64_t b = 0; b < np; ++b) {
      c0_[b] = (p + b) * FRT_PANEL;
      cols_[b] = std::min<int64_t>(FRT_PANEL, w->n - c0_[b]);
    }
  }
  // Acc rows [begin, end) are summed; `per_call` of them go out at each call of some().
  void hand_over(int64_t begin, int64_t end, int64_t per_call) {
    rows(end_);  // whatever is left of the group before
    next_ = begin, end_ = end, per_call_ = per_call;
  }
  void some() { rows(std::min(end_, next_ + per_call_)); }
  void all() { rows(end_); }

 private:
  void rows(int64_t until) {
    for (; next_ < until; ++next_) {
      const int64_t r = r0_ + next_;
      for (int64_t b = 0; b < np_; ++b) {
        __m512 f =
            e_[b].row(_mm512_load_si512(acc_ + next_ * 32 + 16 * b), q_.zero[r], q_.scale[r]);
        gemm_store16_y(f, r, c0_[b], cols_[b], y_, y_dtype_, ldy_);
      }
    }
  }
  const QuantRows& q_;
  int64_t r0_;
  const int32_t* acc_;
  int64_t np_;
  void* y_;
  int32_t y_dtype_;
  int64_t ldy_;
  RowsEpilogue e_[2];
  int64_t c0_[2] = {}, cols_[2] = {};
  int64_t next_ = 0, end_ = 0, per_call_ = 0;
};

// A chunk's panel bytes toward L2, a few lines after each step of the chunk before, so the first
// row group of a chunk does not wait on memory for them: its tile loads take 16 lines at a time,
// which the hardware prefetchers do not run ahead of.
class NextChunk {
 public:
  NextChunk() = default;
  NextChunk(const int8_t* a, const int8_t* b, int64_t bytes, int64_t calls)
      : from_{reinterpret_cast<const char*>(a), reinterpret_cast<const char*>(b)},
        lines_(bytes / 64),
        per_call_(div_up(lines_, std::max<int64_t>(calls, 1))) {}
  void some() {
    for (int64_t end = std::min(lines_, next_ + per_call_); next_ < end; ++next_) {
      _mm_prefetch(from_[0] + 64 * next_, _MM_HINT_T1);
      _mm_prefetch(from_[1] + 64 * next_, _MM_HINT_T1);
    }
  }

 private:
  const char* from_[2] = {};
  int64_t lines_ = 0, per_call_ = 0, next_ = 0;
};

// The steps of a pair's chunks (Note [AMX rows]): the fewest chunks of at most kChunkSteps, each
// of chunk_steps steps but the first, which is shorter when they do not divide the steps, so the
// last chunk is whole (the finish of its row groups spreads over its steps; the sums are exact
// integers in any order).
int64_t chunk_steps(int64_t steps) { return div_up(steps, div_up(steps, kChunkSteps)); }
int64_t first_chunk_steps(int64_t steps) {
  const int64_t c = chunk_steps(steps);
  return steps - c * (div_up(steps, c) - 1);
}

// What the chunk after the one ending at step s1 reads, spread over `calls` calls of some(): the
// pair's next chunk; after the pair's last, the next pair's first (the callers go on to it: their
// panels in pairs, in order); nothing after the last panel.
NextChunk next_chunk(const frt_packed_weight* w, const Panels& pn, int64_t p, int64_t s1,
                     int64_t calls) {
  const int64_t kq = div_up(w->k, 4), panels = div_up(w->n, FRT_PANEL);
  if (s1 < pn.full)
    return NextChunk(pn.panel[0] + s1 * 1024, pn.panel[1] + s1 * 1024,
                     std::min(chunk_steps(div_up(kq, 16)), pn.full - s1) * 1024, calls);
  if (s1 < div_up(kq, 16) || p + 2 >= panels) return {};  // the tail step: in its copy already
  const auto* qdata = static_cast<const int8_t*>(w->qdata);
  return NextChunk(qdata + (p + 2) * kq * 64, qdata + std::min(p + 3, panels - 1) * kq * 64,
                   std::min(first_chunk_steps(div_up(kq, 16)), pn.full) * 1024, calls);
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
  Finisher finish(w, p, np, q, r0, acc, bias, y, y_dtype, ldy);
  amx::configure(tile_config());
  for (int64_t s0 = 0, s1 = first_chunk_steps(steps); s0 < steps;
       s0 = s1, s1 = std::min(steps, s1 + chunk_steps(steps))) {
    const bool last = s1 == steps;
    NextChunk next = next_chunk(w, pn, p, s1, div_up(rows, 32) * (s1 - s0));
    for (int64_t r = r0; r < r0 + rows; r += 32) {
      int32_t* c = acc + (r - r0) * 32;
      const bool pair = np == 2, two = r0 + rows - r >= 32;  // else one panel, one A tile
      auto between = [&] {
        if (last) finish.some();
        next.some();
      };
      if (two && pair)
        chunk_sums<2, 2>(pn, s0, s1, q, r, c, between);
      else if (two)
        chunk_sums<2, 1>(pn, s0, s1, q, r, c, between);
      else if (pair)
        chunk_sums<1, 2>(pn, s0, s1, q, r, c, between);
      else
        chunk_sums<1, 1>(pn, s0, s1, q, r, c, between);
      // The group's sums are final after the last chunk: finished while the next group's
      // products run, a share after each of its steps.
      if (last) finish.hand_over(r - r0, std::min(r0 + rows, r + 32) - r0, div_up(32, s1 - s0));
    }
  }
  amx::release();
  finish.all();
}

}  // namespace frt::kern
