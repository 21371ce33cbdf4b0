// Calibrated int4 rounding (Note [Calibrated rounding] in calibrated.cpp): each output channel's
// groups rounded with error feedback under its input's second moments.
#pragma once

#include <flashrt/calibration.h>
#include <flashrt/types.h>

#include <cstdint>
#include <vector>

#include "quant/int4_grid.h"

namespace frt::detail {

// What every channel of a pack shares for one span of inputs: the span's second moments with
// damping (kDamp of the mean diagonal), the order the inputs are rounded in (act-order), and the
// upper Cholesky factor U of the inverse of the moments taken in that order, their off-diagonal
// shrunk (kKeepOffDiagonal; H^-1 = U^T U), whose rows carry a rounding error forward.
struct SpanSolve {
  int64_t n = 0;
  std::vector<float> damped;   // [n][n], in input order
  std::vector<int32_t> order;  // [n]: the input rounded p-th, by descending diagonal
  std::vector<float> u;        // [n][n], upper triangular, rows and columns in `order`
  std::vector<double> diag;    // the damped diagonal in input order: the grid search's importance
};

// One SpanSolve per span of `m`. Throws InvalidArgument when the moments hold no rows.
std::vector<SpanSolve> span_solves(const InputMoments& m);

// Rounds the s.n weights of one channel's span: every group's grid searched first (weighted by
// the diagonal) on the weights as given, then the inputs in s.order, each error fed forward
// through U. Writes s.n levels (input order) and a grid per group; false when a group has no
// grid finite as stored.
bool round_span(const float* v, const SpanSolve& s, int group, bool symmetric, DType dt,
                uint8_t* levels, Int4Grid* grids);

// out[i] = x_i^T H x_i for the m rows x_i of x ([m][s.n]), H the damped moments.
void quadratic_forms(const float* x, int64_t m, const SpanSolve& s, double* out);

}  // namespace frt::detail
