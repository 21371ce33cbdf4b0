// Note [int4 grids]: a group of int4 weights is 16 levels, W = q * scale + min (q in 0..15; the
// symmetric form ties min to -8 * scale). A grid is chosen per group by search: a first guess
// from the range (min-max for the offset form; for the symmetric form, the largest magnitude at
// level 0, i.e. -8 steps, Q4_0's choice, a negative scale when that value is positive), steps
// a little narrower and wider than it, and the plain grids of earlier packs (the range with 0 in
// it; max|w| / 7). Each is scored as stored (f16 scales round first), then refitted by least
// squares to the levels it assigned and scored again; the least squared error wins, earlier
// candidates on ties. So a group is never worse than under the plain grids, and a group that
// already lies on a 16-level grid (a dequantised Q4_1 checkpoint's, min-max) comes back exactly.
#include "quant/int4_grid.h"

#include <flashrt/abi/frt_kernel_abi.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/f16.h"

namespace frt::detail {

Int4Grid Int4Search::run(const float* v, const double* importance) {
  v_ = v;
  imp_ = importance;
  best_err_ = INFINITY;
  float lo = v[0], hi = v[0], extreme = v[0];
  for (int i = 1; i < n_; ++i) {
    lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
    if (std::fabs(v[i]) > std::fabs(extreme)) extreme = v[i];
  }
  if (symmetric_) {
    for (const float t : kSteps) consider(grid_of(-extreme / (8.0f + t)));
    consider(grid_of(std::fabs(extreme) / 7.0f));
  } else {
    for (const float t : kSteps) consider({(hi - lo) / (15.0f + t), lo});
    const float lo0 = std::min(lo, 0.0f), hi0 = std::max(hi, 0.0f);
    const float step = as_stored((hi0 - lo0) / 15.0f);  // its zero point from the stored step
    consider({step, step > 0 ? -std::clamp(std::nearbyint(-lo0 / step), 0.0f, 15.0f) * step : 0});
  }
  return best_;
}

void Int4Search::consider(Int4Grid grid) {
  if (score(grid)) refit();
}

// Scores a grid as stored; keeps it and its levels when strictly better. False (and no levels
// assigned) when the grid is not finite as stored.
bool Int4Search::score(Int4Grid grid) {
  grid.scale = as_stored(grid.scale);
  grid.min = symmetric_ ? -8.0f * grid.scale : as_stored(grid.min);
  if (!std::isfinite(grid.scale) || !std::isfinite(grid.min)) return false;
  const float inv = grid.scale != 0 ? 1.0f / grid.scale : 0.0f;
  double err = 0;
  for (int i = 0; i < n_; ++i) {
    const float level = std::clamp(std::nearbyint((v_[i] - grid.min) * inv), 0.0f, 15.0f);
    q_[i] = static_cast<uint8_t>(level);
    const double d = static_cast<double>(v_[i]) - (level * grid.scale + grid.min);
    err += weight(i) * d * d;
  }
  if (err < best_err_) best_err_ = err, best_ = grid, std::memcpy(best_q_, q_, sizeof q_);
  return true;
}

// The (weighted) least-squares grid for the levels the last score assigned.
void Int4Search::refit() {
  double sw = 0, sq = 0, sqq = 0, sv = 0, sqv = 0;
  for (int i = 0; i < n_; ++i) {
    const double l = symmetric_ ? q_[i] - 8.0 : q_[i], wt = weight(i);
    sw += wt, sq += wt * l, sqq += wt * l * l, sv += wt * v_[i], sqv += wt * l * v_[i];
  }
  if (symmetric_) {
    if (sqq > 0) score(grid_of(static_cast<float>(sqv / sqq)));
    return;
  }
  const double det = sw * sqq - sq * sq;
  if (det <= 0) return;
  const double scale = (sw * sqv - sq * sv) / det;
  score({static_cast<float>(scale), static_cast<float>((sv - scale * sq) / sw)});
}

float Int4Search::as_stored(float v) const {
  return dt_ == DType::f16 ? frt_f16_to_f32(f32_to_f16(v)) : v;
}

}  // namespace frt::detail
