// The int4 packers' grid search (Note [int4 grids] in int4_grid.cpp): per group of weights, the
// scale and min of the 16-level grid with the least squared error as stored.
#pragma once

#include <flashrt/types.h>

#include <cmath>
#include <cstdint>

namespace frt::detail {

struct Int4Grid {
  float scale = 0, min = 0;
};

// One search per row (it keeps scratch for a group of up to 128); run() once per group.
class Int4Search {
 public:
  Int4Search(int n, bool symmetric, DType dt) : n_(n), symmetric_(symmetric), dt_(dt) {}

  // The best grid for the n values at v (kept by pointer until the next run()). With
  // `importance` (n weights >= 0, kept by pointer too), the squared errors are weighted by it:
  // a calibrated pack's diagonal of its input moments (Note [Calibrated rounding]).
  Int4Grid run(const float* v, const double* importance = nullptr);
  // False when no grid was finite as stored (f16 scales past 65504).
  bool found() const { return best_err_ < INFINITY; }
  // The levels (0..15) of the best grid, one per value.
  const uint8_t* levels() const { return best_q_; }

 private:
  // The first guess first (ties keep it), then narrower and wider steps.
  static constexpr float kSteps[] = {0.0f, -1.0f, -0.75f, -0.5f, -0.25f, 0.25f, 0.5f, 0.75f, 1.0f};

  Int4Grid grid_of(float scale) const { return {scale, -8.0f * scale}; }
  double weight(int i) const { return imp_ != nullptr ? imp_[i] : 1.0; }
  void consider(Int4Grid grid);
  bool score(Int4Grid grid);
  void refit();
  float as_stored(float v) const;

  int n_;
  bool symmetric_;
  DType dt_;
  const float* v_ = nullptr;
  const double* imp_ = nullptr;
  double best_err_ = INFINITY;
  Int4Grid best_;
  uint8_t q_[128] = {}, best_q_[128] = {};
};

}  // namespace frt::detail
