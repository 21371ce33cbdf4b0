// Calibration statistics: what a calibrated pack is chosen against (Note [Calibrated rounding]
// in core/src/quant/calibrated.cpp). The door hands each projection's input rows as they pass
// (the observed forward, or a calibration set); the core keeps the sums.
#pragma once

#include <flashrt/tensor.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace frt {
namespace detail {
struct SpanSolve;  // core/src/quant/calibrated.h
}

// The statistics a scheme may ask for (schemes.yaml, `calibration.statistics`).
enum class Statistic : int32_t {
  // E[x_a x_b] of a projection's input over the calibration rows, for inputs a and b in the same
  // span (InputMoments): the second-moment matrix, or its block diagonal for a wide input. Its
  // diagonal is each input channel's mean square.
  input_moments = 0,
};
const char* name_of(Statistic s);

// The second moments of one projection's input within spans of `span` inputs (span = width
// keeps them all), summed over every row added.
class InputMoments {
 public:
  // Throws InvalidArgument for a width <= 0, or a span that is not a positive multiple of 16
  // dividing the width.
  InputMoments(int64_t width, int64_t span);

  // The span a pack of `group`s keeps for an input of `width` (a multiple of group): the whole
  // width up to `cap`, else the widest multiple of the group of at most `cap` that divides it
  // (the group at least). Throws InvalidArgument when the group does not divide the width.
  static int64_t span_for(int64_t width, int group, int64_t cap);

  // Adds the rows of x [rows, width] (f32 or bf16, any row stride, unit column stride). Throws
  // InvalidArgument for another width or rank, a column stride other than 1, or a non-finite
  // element (nothing is added then).
  void add(const TensorView& x);

  int64_t width() const { return width_; }
  int64_t span() const { return span_; }
  int64_t rows() const { return rows_; }
  // The mean E[x_a x_b] over the rows added, of span b: [span][span], row-major. Zeros before
  // any row.
  std::vector<double> span_mean(int64_t b) const;
  // Each input channel's mean square (the diagonal).
  std::vector<double> mean_square() const;
  // The factorisations a calibrated pack rounds with (calibrated.cpp), made once for every
  // pack that reads this input (q, k and v share one) and dropped by add(). Throws
  // InvalidArgument when no row was added.
  std::shared_ptr<const std::vector<detail::SpanSolve>> solves() const;

 private:
  mutable std::mutex mu_;
  mutable std::shared_ptr<const std::vector<detail::SpanSolve>> solves_;
  int64_t width_;
  int64_t span_;
  int64_t rows_ = 0;
  std::vector<double> sums_;  // [width / span][span][span]; the upper triangle is summed
};

}  // namespace frt
