// Pieces the weight ops share around the panels: checking a packed weight, bringing activation rows
// to fp32 with their int4 group sums, and writing a finished panel tile to the output.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>

namespace frt::kern {

// Whether panels of this format take the rows' group sums (their mins or offsets enter once per
// group through them).
inline bool sums_groups(int32_t format) {
  return format == FRT_W_INT4_GROUP || format == FRT_W_INT4_SUPER;
}

// FRT_REASON_OK or the reason (message names the form and the shape).
int32_t check_weight(const frt_packed_weight* w, const char* what, frt_error* err);
int32_t check_rows(int64_t m, int32_t x_dtype, int32_t y_dtype, frt_error* err);
// The same checks on a form described at plan time (no data yet): format, group, widths.
int32_t check_weight_form(int32_t wformat, int32_t group, int32_t scale_dtype, int64_t n, int64_t k,
                          const char* what, frt_error* err);

// Floats of workspace the row preparation of `w` needs for m rows (x copy when not fp32, plus
// group sums for int4).
int64_t prepared_floats(const frt_packed_weight* w, int32_t x_dtype, int64_t m);

struct PreparedRows {
  const float* x;  // fp32 rows (the caller's own when they already are fp32)
  int64_t ldx;
  const float* xsum;  // int4 group sums, [m][k / group]; nullptr for int8
  // The rows' bf16 parts in tile order when the tile path takes this call (Note [Tile panels]
  // in kernels/common/src/x86/amx/panels_amx.cpp), else nullptr.
  const uint16_t* parts = nullptr;
  int32_t nparts = 0;
};

// The layout prepare_rows() fills; cheap, so every thread can compute it.
PreparedRows prepared_view(const frt_packed_weight* w, const void* x, int32_t x_dtype, int64_t ldx,
                           int64_t m, float* space);
// sums[g] = the sum of x over inputs [g * group, (g + 1) * group), g < k / group: an int4 panel's
// per-group row sums, in the order prepare_rows() adds them (ops that gather rows themselves call
// this, so their sums are prepare_rows()'s bit for bit).
void group_sums(const float* x, int64_t k, int64_t group, float* sums);
// Thread ith of nth fills its rows of the prepared view.
void prepare_rows(const frt_packed_weight* w, const void* x, int32_t x_dtype, int64_t ldx,
                  int64_t m, float* space, int32_t ith, int32_t nth);

// Runs panel p of w over the prepared rows into tile[m][FRT_PANEL].
void run_panel(const frt_packed_weight* w, int64_t p, const PreparedRows& rows, int64_t m,
               float* tile);

// Adds bias and writes the valid columns of tile (panel p) to y in y_dtype.
void store_tile(const float* tile, int64_t m, int64_t p, int64_t n, const float* bias, void* y,
                int32_t y_dtype, int64_t ldy);

}  // namespace frt::kern
