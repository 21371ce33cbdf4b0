#include <frt_kern/panels.h>
#include <frt_kern/rows.h>
#include <frt_kern/util.h>

namespace frt::kern {

int32_t check_weight_form(int32_t wformat, int32_t group, int32_t scale_dtype, int64_t n, int64_t k,
                          const char* what, frt_error* err) {
  if (n <= 0 || k <= 0)
    return fail(err, FRT_REASON_SHAPE, "%s: empty weight %lldx%lld", what,
                static_cast<long long>(n), static_cast<long long>(k));
  if (wformat == FRT_W_INT8_CHANNEL) {
    if (scale_dtype != FRT_F32)
      return fail(err, FRT_REASON_FORMAT, "%s: int8 per-channel scales in %s; supported: f32", what,
                  dtype_name(scale_dtype));
    return ok(err);
  }
  if (wformat == FRT_W_INT4_SUPER || wformat == FRT_W_INT8_SUPER) {
    const bool int4 = wformat == FRT_W_INT4_SUPER;
    const char* bits = int4 ? "int4" : "int8";
    if (group != (int4 ? 32 : 16) || scale_dtype != FRT_F16)
      return fail(err, FRT_REASON_FORMAT,
                  "%s: %s super-blocks take group %d and f16 super scales, not group %d %s", what,
                  bits, int4 ? 32 : 16, group, dtype_name(scale_dtype));
    if (k % FRT_SUPER_K != 0)
      return fail(err, FRT_REASON_SHAPE, "%s: %s super-block width k=%lld is not a multiple of %d",
                  what, bits, static_cast<long long>(k), FRT_SUPER_K);
    return ok(err);
  }
  if (wformat != FRT_W_INT4_GROUP && wformat != FRT_W_INT8_GROUP)
    return fail(err, FRT_REASON_FORMAT, "%s: unknown weight format %d", what, wformat);
  const bool int4 = wformat == FRT_W_INT4_GROUP;
  const char* bits = int4 ? "int4" : "int8";
  // int8 also takes groups of 16: GGUF Q6_K's sub-blocks, laid out exactly.
  if (group != 32 && group != 64 && group != 128 && (int4 || group != 16))
    return fail(err, FRT_REASON_FORMAT, "%s: %s group %d not in {%s32, 64, 128}", what, bits, group,
                int4 ? "" : "16, ");
  if (k % group != 0)
    return fail(err, FRT_REASON_SHAPE, "%s: %s width k=%lld is not a multiple of group %d", what,
                bits, static_cast<long long>(k), group);
  if (scale_dtype != FRT_F32 && scale_dtype != FRT_F16)
    return fail(err, FRT_REASON_FORMAT, "%s: %s group scales in %s; supported: f32, f16", what,
                bits, dtype_name(scale_dtype));
  return ok(err);
}

int32_t check_weight(const frt_packed_weight* w, const char* what, frt_error* err) {
  if (w == nullptr || w->qdata == nullptr || w->scales == nullptr)
    return fail(err, FRT_REASON_FORMAT, "%s: no packed weight", what);
  if (w->format == FRT_W_INT4_GROUP && w->mins == nullptr)
    return fail(err, FRT_REASON_FORMAT, "%s: int4 without mins", what);
  return check_weight_form(w->format, w->group, w->scale_dtype, w->n, w->k, what, err);
}

int32_t check_rows(int64_t m, int32_t x_dtype, int32_t y_dtype, frt_error* err) {
  if (m < 1 || m > FRT_MAX_ROWS)
    return fail(err, FRT_REASON_ROWS_OUT_OF_BAND, "rows M=%lld outside the decode band 1..%d",
                static_cast<long long>(m), FRT_MAX_ROWS);
  if ((x_dtype != FRT_F32 && x_dtype != FRT_BF16) || (y_dtype != FRT_F32 && y_dtype != FRT_BF16))
    return fail(err, FRT_REASON_DTYPE, "activations %s -> %s; supported: f32, bf16",
                dtype_name(x_dtype), dtype_name(y_dtype));
  return ok(err);
}

namespace {

// How many bf16 parts the tile path splits these rows into (0: the call stays on the panels). A
// bf16 row is its own single part; an fp32 one takes three (Note [Tile panels]).
int32_t tile_parts(const frt_packed_weight* w, int32_t x_dtype, int64_t m) {
  if (kPanels.tile_from == nullptr) return 0;
  const int64_t from = kPanels.tile_from(w);
  if (from == 0 || m < from) return 0;
  return x_dtype == FRT_BF16 ? 1 : 3;
}

// Floats of the parts: nparts x (k / 32) tiles of 16 rows x 32 bf16.
int64_t parts_floats(const frt_packed_weight* w, int32_t nparts) {
  return align64(nparts * w->k * 16 * 2) / 4;
}

}  // namespace

int64_t prepared_floats(const frt_packed_weight* w, int32_t x_dtype, int64_t m) {
  int64_t floats = 0;
  if (x_dtype != FRT_F32) floats += align64(m * w->k * 4) / 4;
  if (sums_groups(w->format)) floats += align64(m * (w->k / w->group) * 4) / 4;
  return floats + parts_floats(w, tile_parts(w, x_dtype, m));
}

PreparedRows prepared_view(const frt_packed_weight* w, const void* x, int32_t x_dtype, int64_t ldx,
                           int64_t m, float* space) {
  PreparedRows rows{static_cast<const float*>(x), ldx, nullptr};
  if (x_dtype != FRT_F32) {
    rows.x = space;
    rows.ldx = w->k;
    space += align64(m * w->k * 4) / 4;
  }
  if (sums_groups(w->format)) {
    rows.xsum = space;
    space += align64(m * (w->k / w->group) * 4) / 4;
  }
  rows.nparts = tile_parts(w, x_dtype, m);
  if (rows.nparts > 0) rows.parts = reinterpret_cast<const uint16_t*>(space);
  return rows;
}

void group_sums(const float* x, int64_t k, int64_t group, float* sums) {
  for (int64_t g = 0; g < k / group; ++g) {
    float s = 0.0f;
    for (int64_t i = g * group; i < (g + 1) * group; ++i) s += x[i];
    sums[g] = s;
  }
}

void prepare_rows(const frt_packed_weight* w, const void* x, int32_t x_dtype, int64_t ldx,
                  int64_t m, float* space, int32_t ith, int32_t nth) {
  const PreparedRows rows = prepared_view(w, x, x_dtype, ldx, m, space);
  const int64_t k = w->k;
  for (int64_t r = ith; r < m; r += nth) {
    if (x_dtype == FRT_BF16) {
      const auto* src = static_cast<const uint16_t*>(x) + r * ldx;
      float* dst = const_cast<float*>(rows.x) + r * rows.ldx;
      for (int64_t i = 0; i < k; ++i) dst[i] = bf16_to_f32(src[i]);
    }
    if (rows.xsum != nullptr)
      group_sums(rows.x + r * rows.ldx, k, w->group,
                 const_cast<float*>(rows.xsum) + r * (k / w->group));
    if (rows.parts != nullptr)
      kPanels.split_rows(rows.x, rows.ldx, k, r, r + 1, rows.nparts,
                         const_cast<uint16_t*>(rows.parts));
  }
}

void run_panel(const frt_packed_weight* w, int64_t p, const PreparedRows& rows, int64_t m,
               float* tile) {
  if (rows.parts != nullptr)
    kPanels.tiles(w, p, rows.parts, rows.nparts, rows.xsum, m, tile);
  else if (w->format == FRT_W_INT8_CHANNEL)
    kPanels.int8(w, p, rows.x, rows.ldx, m, tile);
  else if (w->format == FRT_W_INT8_GROUP)
    kPanels.int8g(w, p, rows.x, rows.ldx, m, tile);
  else if (w->format == FRT_W_INT4_SUPER)
    kPanels.int4s(w, p, rows.x, rows.ldx, rows.xsum, m, tile);
  else if (w->format == FRT_W_INT8_SUPER)
    kPanels.int8s(w, p, rows.x, rows.ldx, m, tile);
  else
    kPanels.int4(w, p, rows.x, rows.ldx, rows.xsum, m, tile);
}

void store_tile(const float* tile, int64_t m, int64_t p, int64_t n, const float* bias, void* y,
                int32_t y_dtype, int64_t ldy) {
  const int64_t c0 = p * FRT_PANEL;
  const int64_t width = (n - c0) < FRT_PANEL ? (n - c0) : FRT_PANEL;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < width; ++j) {
      float v = tile[r * FRT_PANEL + j];
      if (bias != nullptr) v += bias[c0 + j];
      if (y_dtype == FRT_F32)
        static_cast<float*>(y)[r * ldy + c0 + j] = v;
      else
        static_cast<uint16_t*>(y)[r * ldy + c0 + j] = f32_to_bf16(v);
    }
  }
}

}  // namespace frt::kern
