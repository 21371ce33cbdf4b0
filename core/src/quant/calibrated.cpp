// Note [Calibrated rounding]: a projection's output error from rounding its weights is
// e^T H e per output channel, H the second moments of its input (E[x x^T] over calibration
// rows), where the plain packs minimise the weight-space |e|^2. A calibrated pack rounds each
// output channel as GPTQ does (optimal-brain-surgeon updates, column by column):
//   - inputs are taken in order within a span (InputMoments: the whole input up to the
//     scheme's cap, else the widest block that divides it; the moments between spans are not
//     kept, and each span is rounded on its own);
//   - at the first input of each group of 32 the group's grid is searched as the plain pack
//     searches it (Note [int4 grids]) on the weights as the earlier errors left them, each
//     input's squared error weighted by its mean square (the diagonal of H): an input that
//     carries large activations is rounded more closely;
//   - each input is rounded to the nearest level of its group's grid, and its error divided by
//     U_ii is taken off every later input of the span, weighted by U's row i (U the upper
//     Cholesky factor of the damped H^-1): inputs that move together in the activations absorb
//     each other's error.
// Damping adds 10% of the mean diagonal (kDamp), so the solve is defined where an input never
// moved, and the rounding does not fit the calibration rows' noise (an all-zero span takes H = I:
// plain rounding). The levels and grids are the plain form's: every kernel reads a calibrated pack
// unchanged. A group that lies on a grid after the feedback before it comes back exactly: a
// dequantised Q4_1 checkpoint under the offset form is reproduced, as the plain search reproduces
// it.
#include "quant/calibrated.h"

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/errors.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "quant/f16.h"

// The two loops that carry the cost, compiled for each x86 tier and picked at load.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define FRT_TIERED __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define FRT_TIERED
#endif

namespace frt::detail {
namespace {

// 10% of the mean diagonal: on SmolLM2 (1024-4096 calibration rows, scored on other text) the
// output error on held-out rows was lowest at 0.1-0.3; GPTQ's 1% fits the calibration rows and
// left a down projection worse than plain rounding on rows it had not seen.
constexpr double kDamp = 0.1;

// acc[0..count) += a * x[0..count): the axpy the factorisations below are made of.
FRT_TIERED void axpy(double* acc, const double* x, double a, int64_t count) {
  for (int64_t j = 0; j < count; ++j) acc[j] += a * x[j];
}

// The upper R with H = R R^T (a Cholesky factor taken from the last input back), in place of
// the row-major [n][n] `a`; false when H is not positive definite. Panels of 16 columns are
// factored first, then each row of what is left is updated once per panel (an axpy per panel
// column along the row, the row in cache), not once per column.
bool reverse_cholesky(std::vector<double>& a, int64_t n) {
  constexpr int64_t kPanelCols = 16;
  std::vector<double> cols(static_cast<size_t>(kPanelCols * n));
  for (int64_t k1 = n - 1; k1 >= 0; k1 -= kPanelCols) {
    const int64_t k0 = std::max<int64_t>(0, k1 - kPanelCols + 1);
    for (int64_t k = k1; k >= k0; --k) {
      const double d = a[k * n + k];
      if (!(d > 0)) return false;
      const double r = std::sqrt(d);
      double* c = cols.data() + (k1 - k) * n;
      for (int64_t i = 0; i < k; ++i) a[i * n + k] = c[i] = a[i * n + k] / r;
      a[k * n + k] = r;
      for (int64_t i = 0; i < k; ++i)  // the panel's columns left of k, rows up to each
        for (int64_t j = std::max(k0, i); j < k; ++j) a[i * n + j] -= c[i] * c[j];
    }
    for (int64_t i = 0; i < k0; ++i)  // the upper triangle left of the panel
      for (int64_t p = 0; p <= k1 - k0; ++p) {
        const double* c = cols.data() + p * n;
        axpy(a.data() + i * n + i, c + i, -c[i], k0 - i);
      }
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < i; ++j) a[i * n + j] = 0;  // below the diagonal
  return true;
}

// The inverse of an upper triangular R (U R = I): upper triangular, eight rows of U at a time
// so each row of R is read once for all eight (the rows' sums in cache, R streamed n / 8 times).
std::vector<double> upper_inverse(const std::vector<double>& r, int64_t n) {
  constexpr int64_t kRows = 8;
  std::vector<double> u(static_cast<size_t>(n * n), 0.0);
  std::vector<double> acc(static_cast<size_t>(kRows * n));
  for (int64_t i0 = 0; i0 < n; i0 += kRows) {
    const int64_t rows = std::min(kRows, n - i0);
    std::fill(acc.begin(), acc.end(), 0.0);
    for (int64_t k = i0; k < n; ++k) {
      for (int64_t t = 0; t < rows && i0 + t <= k; ++t) {
        const int64_t i = i0 + t;
        double* sum = acc.data() + t * n;
        const double v = k == i ? 1.0 / r[i * n + i] : -sum[k] / r[k * n + k];
        u[i * n + k] = v;
        axpy(sum + k + 1, r.data() + k * n + k + 1, v, n - k - 1);
      }
    }
  }
  return u;
}

FRT_TIERED void feed_forward(float* w, const float* u_row, float err, int64_t count) {
  for (int64_t j = 0; j < count; ++j) w[j] -= err * u_row[j];
}

// out[r] += x_r^T H x_r for the 16 rows of x ([16][n], rows past the tile zero), H [n][n]
// symmetric, n a multiple of 16: x H in 16 x 16 register tiles, H streamed once.
FRT_TIERED void quadratic_tile(const float* x, int64_t n, const float* h, double* out) {
  typedef float v16 __attribute__((vector_size(64)));  // see moment_tile (calibration.cpp)
  for (int64_t c0 = 0; c0 < n; c0 += 16) {
    v16 acc[16] = {};
    for (int64_t a = 0; a < n; ++a) {
      v16 hr;
      std::memcpy(&hr, h + a * n + c0, sizeof hr);
      for (int r = 0; r < 16; ++r) acc[r] += x[r * n + a] * hr;
    }
    for (int r = 0; r < 16; ++r) {
      float dot = 0;
      for (int j = 0; j < 16; ++j) dot += x[r * n + c0 + j] * acc[r][j];
      out[r] += dot;
    }
  }
}

}  // namespace

std::vector<SpanSolve> span_solves(const InputMoments& m) {
  if (m.rows() == 0) throw InvalidArgument("calibration: the input moments hold no rows");
  const int64_t n = m.span();
  std::vector<SpanSolve> out(static_cast<size_t>(m.width() / n));
  for (size_t b = 0; b < out.size(); ++b) {
    SpanSolve& s = out[b];
    s.n = n;
    std::vector<double> h = m.span_mean(static_cast<int64_t>(b));
    double mean_diag = 0;
    for (int64_t i = 0; i < n; ++i) mean_diag += h[i * n + i];
    mean_diag /= static_cast<double>(n);
    // Rows past fp32's range summed to infinity: no rounding can be chosen against them.
    if (!std::isfinite(mean_diag) ||
        !std::all_of(h.begin(), h.end(), [](double v) { return std::isfinite(v); }))
      throw InvalidArgument("calibration: span " + std::to_string(b) +
                            " of the input moments is not finite (activations past fp32's range)");
    if (!(mean_diag > 0))
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < n; ++j) h[i * n + j] = i == j ? 1.0 : 0.0;
    else
      for (int64_t i = 0; i < n; ++i) h[i * n + i] += kDamp * mean_diag;
    // GPTQ's factor U (upper, H^-1 = U^T U) is R^-1 for H = R R^T with R upper: then
    // U^T U = (R R^T)^-1, and the factor with a positive diagonal is unique.
    std::vector<double> r = h;
    double boost = kDamp * std::max(mean_diag, 1e-30);
    for (int tries = 0; !reverse_cholesky(r, n); ++tries) {  // rounding left it indefinite
      if (tries == 8)
        throw InvalidArgument("calibration: span " + std::to_string(b) +
                              " of the input moments is not positive definite after damping");
      r = h;
      for (int64_t i = 0; i < n; ++i) r[i * n + i] += boost;
      boost *= 10;
    }
    const std::vector<double> inv_r = upper_inverse(r, n);
    s.u.assign(static_cast<size_t>(n * n), 0.0f);
    s.damped.resize(static_cast<size_t>(n * n));
    s.diag.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        s.u[i * n + j] = static_cast<float>(inv_r[i * n + j]);
        s.damped[i * n + j] = static_cast<float>(h[i * n + j]);
      }
      s.diag[i] = h[i * n + i];
    }
  }
  return out;
}

namespace {

// GPTQ's loss of rounding one group on `grid` (the sum of err_i^2, err_i = (w_i - q_i) / U_ii:
// the rise of e^T H e with every later input compensating), the feedback kept within the
// group: what a grid costs before the later groups are rounded.
float group_loss(const float* w, Int4Grid grid, const SpanSolve& s, int64_t i0, int group) {
  const int64_t n = s.n;
  float v[128];
  std::copy(w, w + group, v);
  const float inv = grid.scale != 0 ? 1.0f / grid.scale : 0.0f;
  float loss = 0;
  for (int i = 0; i < group; ++i) {
    const float level = std::clamp(std::nearbyint((v[i] - grid.min) * inv), 0.0f, 15.0f);
    const float err = (v[i] - (level * grid.scale + grid.min)) / s.u[(i0 + i) * n + i0 + i];
    loss += err * err;
    const float* u = s.u.data() + (i0 + i) * n + i0;
    for (int j = i + 1; j < group; ++j) v[j] -= err * u[j];
  }
  return loss;
}

// The grids a group's GPTQ loss is compared over: the weighted search's, and the range's
// grid narrowed or widened (symmetric: the largest magnitude at level 0 or just inside it;
// offset: either end pulled in), as stored.
int candidate_grids(const float* w, int group, bool symmetric, DType dt, Int4Grid searched,
                    Int4Grid* out) {
  int count = 0;
  out[count++] = searched;
  float lo = w[0], hi = w[0], extreme = w[0];
  for (int i = 1; i < group; ++i) {
    lo = std::min(lo, w[i]), hi = std::max(hi, w[i]);
    if (std::fabs(w[i]) > std::fabs(extreme)) extreme = w[i];
  }
  const auto stored = [&](Int4Grid g) {
    g.scale = dt == DType::f16 ? frt_f16_to_f32(f32_to_f16(g.scale)) : g.scale;
    g.min = symmetric ? -8.0f * g.scale
                      : (dt == DType::f16 ? frt_f16_to_f32(f32_to_f16(g.min)) : g.min);
    if (std::isfinite(g.scale) && std::isfinite(g.min)) out[count++] = g;
  };
  if (symmetric) {
    for (int f = 0; f <= 8; ++f) stored({-extreme * (0.70f + 0.05f * f) / 8.0f, 0});
  } else {
    const float range = hi - lo;
    for (float a : {0.0f, 0.06f})
      for (float b : {0.0f, 0.06f}) stored({range * (1.0f - a - b) / 15.0f, lo + a * range});
  }
  return count;
}

}  // namespace

bool round_span(const float* v, const SpanSolve& s, int group, bool symmetric, DType dt,
                uint8_t* levels, Int4Grid* grids) {
  const int64_t n = s.n;
  std::vector<float> w(v, v + n);
  Int4Search search(group, symmetric, dt);
  Int4Grid grid, candidates[32];
  for (int64_t i = 0; i < n; ++i) {
    if (i % group == 0) {
      const Int4Grid searched = search.run(w.data() + i, s.diag.data() + i);
      if (!search.found()) return false;
      // The grid of least GPTQ loss: the search scores rounding errors alone, the loss counts
      // what the later inputs of the group can take back.
      const int count = candidate_grids(w.data() + i, group, symmetric, dt, searched, candidates);
      grid = candidates[0];
      float best = group_loss(w.data() + i, grid, s, i, group);
      for (int c = 1; c < count; ++c) {
        const float loss = group_loss(w.data() + i, candidates[c], s, i, group);
        if (loss < best) best = loss, grid = candidates[c];
      }
      grids[i / group] = grid;
    }
    const float inv = grid.scale != 0 ? 1.0f / grid.scale : 0.0f;
    const float level = std::clamp(std::nearbyint((w[i] - grid.min) * inv), 0.0f, 15.0f);
    levels[i] = static_cast<uint8_t>(level);
    const float err = (w[i] - (level * grid.scale + grid.min)) / s.u[i * n + i];
    feed_forward(w.data() + i + 1, s.u.data() + i * n + i + 1, err, n - i - 1);
  }
  return true;
}

void quadratic_forms(const float* x, int64_t m, const SpanSolve& s, double* out) {
  const int64_t n = s.n;
  std::vector<float> tile(static_cast<size_t>(16 * n));
  double q[16];
  for (int64_t r0 = 0; r0 < m; r0 += 16) {
    const int64_t rows = std::min<int64_t>(16, m - r0);
    std::fill(tile.begin(), tile.end(), 0.0f);
    std::copy(x + r0 * n, x + (r0 + rows) * n, tile.begin());
    std::fill(q, q + 16, 0.0);
    quadratic_tile(tile.data(), n, s.damped.data(), q);
    std::copy(q, q + rows, out + r0);
  }
}

}  // namespace frt::detail

namespace frt {

std::shared_ptr<const std::vector<detail::SpanSolve>> InputMoments::solves() const {
  std::lock_guard lock(mu_);
  if (!solves_)
    solves_ = std::make_shared<const std::vector<detail::SpanSolve>>(detail::span_solves(*this));
  return solves_;
}

}  // namespace frt
