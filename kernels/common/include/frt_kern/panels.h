// The per-ISA hot loop: one weight panel (FRT_PANEL output channels) against m activation rows.
// Every variant fills one PanelTable (kPanels) once, at compile time; op code calls through it,
// so a variant without a fast path falls back through the table to the scalar reference.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>
#include <type_traits>

namespace frt::kern {

// out[r][j] = sum_i x[r][i] * W[p*FRT_PANEL + j][i] for r < m, j < FRT_PANEL (padding columns
// come out as 0). x is fp32 with row stride ldx. For int4, xsum[r][g] is the sum of x[r] over
// group g (row stride k / group), which the kernels use to apply the min once per group.
struct PanelTable {
  void (*int8)(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
               float* out);
  void (*int8g)(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                float* out);
  // int8_super: the int8 group panel with each group's scale decoded from its super record.
  void (*int8s)(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                float* out);
  void (*int4)(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
               const float* xsum, int64_t m, float* out);
  // int4_super: the int4 panel with each group's scale and min decoded from its super record.
  void (*int4s)(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                const float* xsum, int64_t m, float* out);
  // sum_i x[i] w[i] over n elements, w fp32 or bf16 (the host's own weight rows).
  float (*dot_f32)(const float* x, const float* w, int64_t n);
  float (*dot_bf16)(const float* x, const uint16_t* w, int64_t n);
  // out[i] = act(g[i] + bias[i]) * mul[i] for i < n (act an frt_act; bias, mul may be null):
  // the feed-forwards' epilogue. See Note [Vector activations] in activate_avx2.cpp.
  void (*activate)(int32_t act, const float* g, const float* bias, const float* mul, float* out,
                   int64_t n);
  // The tile path (the amx variant's; null elsewhere, Note [Tile panels] in panels_amx.cpp): from
  // tile_from(w) rows (0: never) up to FRT_MAX_ROWS, prepare_rows() splits the rows into nparts
  // bf16 parts (split_rows) and the panel runs on them (tiles).
  int64_t (*tile_from)(const frt_packed_weight* w);
  void (*split_rows)(const float* x, int64_t ldx, int64_t k, int64_t r0, int64_t r1, int32_t nparts,
                     uint16_t* parts);
  void (*tiles)(const frt_packed_weight* w, int64_t p, const uint16_t* parts, int32_t nparts,
                const float* xsum, int64_t m, float* out);
};

extern const PanelTable kPanels;

// Rows [0, m) in blocks: block(MR, r) runs rows [r, r + MR) with MR = 4, 3 or 2 a compile-time
// constant (std::integral_constant); one(r) runs the single row left over. The per-ISA panels
// re-read the panel from L1/L2 for each block, so DRAM sees every weight byte once per call.
template <typename Block, typename One>
void in_fours(int64_t m, Block block, One one) {
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) block(std::integral_constant<int, 4>{}, r);
  switch (m - r) {
    case 3:
      block(std::integral_constant<int, 3>{}, r);
      break;
    case 2:
      block(std::integral_constant<int, 2>{}, r);
      break;
    case 1:
      one(r);
      break;
    default:
      break;
  }
}

// The same with blocks of 8 rows first, for the AVX-512 panels: 32 registers hold eight rows'
// two accumulators each beside the widened weights, so a 16-row call widens each weight twice,
// not four times. A row's sums are the same in any block (its own accumulators).
template <typename Block, typename One>
void in_eights(int64_t m, Block block, One one) {
  int64_t r = 0;
  for (; r + 8 <= m; r += 8) block(std::integral_constant<int, 8>{}, r);
  in_fours(
      m - r, [&](auto mr, int64_t i) { block(mr, r + i); }, [&](int64_t i) { one(r + i); });
}

void int8_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                    float* out);
void int8g_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                     float* out);
void int8s_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                     float* out);
void int4_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                    const float* xsum, int64_t m, float* out);
void int4s_panel_ref(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                     const float* xsum, int64_t m, float* out);
float dot_f32_ref(const float* x, const float* w, int64_t n);
float dot_bf16_ref(const float* x, const uint16_t* w, int64_t n);
void activate_ref(int32_t act, const float* g, const float* bias, const float* mul, float* out,
                  int64_t n);
void activate_avx2(int32_t act, const float* g, const float* bias, const float* mul, float* out,
                   int64_t n);
float dot_f32_avx2(const float* x, const float* w, int64_t n);
float dot_bf16_avx2(const float* x, const uint16_t* w, int64_t n);
void int8_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                     float* out);
void int8g_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                      float* out);
void int8s_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx, int64_t m,
                      float* out);
void int4_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                     const float* xsum, int64_t m, float* out);
void int4s_panel_avx2(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                      const float* xsum, int64_t m, float* out);
float dot_f32_avx512(const float* x, const float* w, int64_t n);
float dot_bf16_avx512(const float* x, const uint16_t* w, int64_t n);
void int8_panel_avx512(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                       int64_t m, float* out);
void int8g_panel_avx512(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                        int64_t m, float* out);
void int8s_panel_avx512(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                        int64_t m, float* out);
void int4_panel_avx512(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                       const float* xsum, int64_t m, float* out);
void int4s_panel_avx512(const frt_packed_weight* w, int64_t p, const float* x, int64_t ldx,
                        const float* xsum, int64_t m, float* out);
int64_t tile_from_amx(const frt_packed_weight* w);
void split_rows_amx(const float* x, int64_t ldx, int64_t k, int64_t r0, int64_t r1, int32_t nparts,
                    uint16_t* parts);
void tiles_amx(const frt_packed_weight* w, int64_t p, const uint16_t* parts, int32_t nparts,
               const float* xsum, int64_t m, float* out);

}  // namespace frt::kern
