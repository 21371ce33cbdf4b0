// Calibrated int4 (Note [Calibrated rounding]): the moments the door hands, and packs rounded
// against them that reproduce a projection's outputs on its input rows better than the plain
// rounding of the same form, in the same layout.
#include <flashrt/calibration.h>
#include <flashrt/errors.h>
#include <flashrt/pack.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace frt {
namespace {

// Activation rows with the structure real hosts show: correlated channels (a shared low-rank
// part) and a few outlier channels 20x larger than the rest.
std::vector<float> activations(int64_t rows, int64_t k, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> basis(4 * k);
  for (float& b : basis) b = g(rng);
  std::vector<float> x(rows * k);
  for (int64_t r = 0; r < rows; ++r) {
    float c[4] = {g(rng), g(rng), g(rng), g(rng)};
    for (int64_t i = 0; i < k; ++i) {
      float v = 0.3f * g(rng);
      for (int j = 0; j < 4; ++j) v += c[j] * basis[j * k + i];
      if (i % 37 == 5) v *= 20.0f;  // outlier channels
      x[r * k + i] = v;
    }
  }
  return x;
}

std::vector<float> gaussian(int64_t n, uint32_t seed, float sd) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, sd);
  std::vector<float> w(n);
  for (float& v : w) v = g(rng);
  return w;
}

// ||X (W - Q)^T||_F / ||X W^T||_F over the rows: the output error the calibration is about.
double output_error(const std::vector<float>& x, int64_t rows, const std::vector<float>& w,
                    const std::vector<float>& q, int64_t n, int64_t k) {
  double err = 0, ref = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t o = 0; o < n; ++o) {
      double y = 0, e = 0;
      for (int64_t i = 0; i < k; ++i) {
        y += static_cast<double>(x[r * k + i]) * w[o * k + i];
        e += static_cast<double>(x[r * k + i]) * (w[o * k + i] - q[o * k + i]);
      }
      err += e * e, ref += y * y;
    }
  return std::sqrt(err / ref);
}

TEST(Calibration, MomentsAreTheMeanOuterProductsWithinEachSpan) {
  const int64_t rows = 37, k = 64;
  std::vector<float> x = activations(rows, k, 1);
  InputMoments m(k, 32);
  m.add(TensorView::matrix(x.data(), DType::f32, 20, k, k));
  m.add(TensorView::matrix(x.data() + 20 * k, DType::f32, rows - 20, k, k));
  EXPECT_EQ(m.rows(), rows);
  for (int64_t b = 0; b < 2; ++b) {
    const std::vector<double> h = m.span_mean(b);
    for (int a = 0; a < 32; ++a)
      for (int c = 0; c < 32; ++c) {
        double want = 0;
        for (int64_t r = 0; r < rows; ++r)
          want += static_cast<double>(x[r * k + b * 32 + a]) * x[r * k + b * 32 + c];
        want /= rows;
        ASSERT_NEAR(h[a * 32 + c], want, 1e-4 * (std::fabs(want) + 1)) << b << " " << a << " " << c;
      }
  }
  EXPECT_EQ(InputMoments::span_for(1536, 32, 2048), 1536);
  EXPECT_EQ(InputMoments::span_for(3072, 32, 2048), 1536);
  EXPECT_EQ(InputMoments::span_for(14336, 32, 2048), 2048);
  EXPECT_THROW(InputMoments::span_for(100, 32, 2048), InvalidArgument);
}

TEST(Calibration, BadRowsAreRefusedAndLeaveTheSumsAsTheyWere) {
  const int64_t k = 32;
  std::vector<float> x = activations(4, k, 2);
  InputMoments m(k, k);
  m.add(TensorView::matrix(x.data(), DType::f32, 4, k, k));
  const std::vector<double> before = m.span_mean(0);
  std::vector<float> bad = x;
  bad[k + 3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THROW(m.add(TensorView::matrix(bad.data(), DType::f32, 4, k, k)), InvalidArgument);
  EXPECT_THROW(m.add(TensorView::matrix(x.data(), DType::f32, 2, 16, 16)), InvalidArgument);
  EXPECT_EQ(m.rows(), 4);
  EXPECT_EQ(m.span_mean(0), before);
  EXPECT_THROW(InputMoments(48, 32), InvalidArgument);  // the span does not divide the width
  EXPECT_THROW(InputMoments(64, 24), InvalidArgument);  // not a multiple of 16
}

// The claim the schemes rest on: on the rows it was calibrated with (and on rows of the same
// distribution it was not), a calibrated pack's outputs are closer to the host's than the plain
// pack's of the same form, symmetric and offset grids alike, f32 and f16 scales.
TEST(Calibration, CalibratedPacksReproduceOutputsBetterThanPlainRounding) {
  const int64_t n = 48, k = 128, rows = 512;
  const std::vector<float> x = activations(rows, k, 3);
  const std::vector<float> held_out = activations(rows, k, 3 + 100);
  const std::vector<float> w = gaussian(n * k, 4, 0.05f);
  InputMoments m(k, k);
  m.add(TensorView::matrix(const_cast<float*>(x.data()), DType::f32, rows, k, k));
  const TensorView v = TensorView::matrix(const_cast<float*>(w.data()), DType::f32, n, k, k);
  for (bool symmetric : {true, false}) {
    const DType dt = symmetric ? DType::f32 : DType::f16;
    const PackedLinear plain = PackedLinear::int4(v, 32, symmetric, dt);
    const PackedLinear cal = PackedLinear::int4(v, 32, symmetric, dt, &m);
    // The same layout (every kernel reads it unchanged); the form says it was calibrated.
    EXPECT_EQ(cal.format(), plain.format());
    EXPECT_EQ(cal.nbytes(), plain.nbytes());
    EXPECT_EQ(cal.form(), plain.form() + ", calibrated");
    const double e_plain = output_error(x, rows, w, plain.dequantize(), n, k);
    const double e_cal = output_error(x, rows, w, cal.dequantize(), n, k);
    EXPECT_LT(e_cal, 0.8 * e_plain) << (symmetric ? "symmetric" : "offset");
    // Held-out rows: the other half of the activations' generator (the same structure).
    const double h_plain = output_error(held_out, rows, w, plain.dequantize(), n, k);
    const double h_cal = output_error(held_out, rows, w, cal.dequantize(), n, k);
    EXPECT_LT(h_cal, h_plain) << (symmetric ? "symmetric" : "offset");
    // The report: the output-space errors under the moments, beside the weight-space ones.
    EXPECT_EQ(cal.stats().calibration_rows, rows);
    EXPECT_GT(cal.stats().out_rel_err, 0.0);
    EXPECT_LT(cal.stats().out_rel_err, cal.stats().out_rel_err_plain);
    EXPECT_EQ(plain.stats().out_rel_err, -1.0);
    // The gemm layout takes the same values.
    if (!symmetric) continue;
    const PackedLinear g = PackedLinear::int4_gemm(v, true, &m);
    const PackedLinear f16 = PackedLinear::int4(v, 32, true, DType::f16, &m);
    EXPECT_EQ(g.dequantize(), f16.dequantize());
  }
}

// A matrix already on Q4_1 grids comes back exactly under the calibrated offset form: no group
// has an error to feed forward.
TEST(Calibration, WeightsOnAGridComeBackExactlyUnderTheCalibratedOffsetForm) {
  const int64_t n = 16, k = 96, rows = 300;
  std::mt19937 rng(6);
  std::vector<float> w(n * k);
  for (int64_t g = 0; g < n * k / 32; ++g) {
    const float d = std::ldexp(static_cast<float>(1 + rng() % 1000), -16);
    const float mn = -std::ldexp(static_cast<float>(rng() % 1000), -13);
    for (int i = 0; i < 32; ++i) {
      int q = static_cast<int>(rng() % 16);
      if (i == 3) q = 0;
      if (i == 17) q = 15;
      w[g * 32 + i] = static_cast<float>(q) * d + mn;
    }
  }
  const std::vector<float> x = activations(rows, k, 7);
  InputMoments m(k, k);
  m.add(TensorView::matrix(const_cast<float*>(x.data()), DType::f32, rows, k, k));
  const PackedLinear p = PackedLinear::int4(TensorView::matrix(w.data(), DType::f32, n, k, k), 32,
                                            false, DType::f16, &m);
  EXPECT_EQ(p.stats().max_abs_err, 0.0);
}

// Act-order: the inputs are rounded by descending mean square, not by position, so moving a
// whole group of inputs elsewhere in the span (the same columns of the weights and of the
// activations) moves its levels and leaves every level the same. In input order the group
// rounded last can take no one else's error, and where it sits changes the rounding.
TEST(Calibration, RoundingFollowsTheMomentsNotThePositions) {
  const int64_t n = 32, k = 128, rows = 512;
  const std::vector<float> x = activations(rows, k, 12);
  const std::vector<float> w = gaussian(n * k, 13, 0.05f);
  // The first and the last group of 32 inputs exchanged.
  const auto swapped = [&](const std::vector<float>& a, int64_t count) {
    std::vector<float> b = a;
    for (int64_t r = 0; r < count; ++r)
      for (int64_t i = 0; i < 32; ++i) std::swap(b[r * k + i], b[r * k + k - 32 + i]);
    return b;
  };
  const std::vector<float> x2 = swapped(x, rows), w2 = swapped(w, n);
  for (bool symmetric : {true, false}) {
    std::vector<float> q[2];
    for (int t = 0; t < 2; ++t) {
      const std::vector<float>& xs = t == 0 ? x : x2;
      const std::vector<float>& ws = t == 0 ? w : w2;
      InputMoments m(k, k);
      m.add(TensorView::matrix(const_cast<float*>(xs.data()), DType::f32, rows, k, k));
      q[t] =
          PackedLinear::int4(TensorView::matrix(const_cast<float*>(ws.data()), DType::f32, n, k, k),
                             32, symmetric, DType::f16, &m)
              .dequantize();
    }
    EXPECT_EQ(swapped(q[1], n), q[0]) << (symmetric ? "symmetric" : "offset");
  }
}

TEST(Calibration, MomentsOfAnotherWidthOrNoRowsAreRefused) {
  const int64_t n = 8, k = 64;
  std::vector<float> w = gaussian(n * k, 8, 0.1f);
  const TensorView v = TensorView::matrix(w.data(), DType::f32, n, k, k);
  InputMoments other(32, 32), empty(k, k);
  std::vector<float> x = activations(4, 32, 9);
  other.add(TensorView::matrix(x.data(), DType::f32, 4, 32, 32));
  EXPECT_THROW(PackedLinear::int4(v, 32, true, DType::f32, &other), InvalidArgument);
  EXPECT_THROW(PackedLinear::int4(v, 32, true, DType::f32, &empty), InvalidArgument);
  // A span that is not a multiple of the group (the width matches).
  InputMoments odd(k, 16);
  std::vector<float> rows = activations(4, k, 11);
  odd.add(TensorView::matrix(rows.data(), DType::f32, 4, k, k));
  try {
    PackedLinear::int4(v, 32, true, DType::f32, &odd);
    ADD_FAILURE() << "a span of 16 taken for groups of 32";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("in spans of 16"), std::string::npos) << e.what();
  }
}

// An input that never moved: any rounding costs nothing on these rows, the solve is the
// identity (no error fed forward) and every input weighs the same in the grid search, so the
// calibrated pack is the plain pack.
TEST(Calibration, AnInputThatNeverMovedRoundsAsThePlainPack) {
  const int64_t n = 8, k = 64;
  std::vector<float> w = gaussian(n * k, 10, 0.1f);
  const TensorView v = TensorView::matrix(w.data(), DType::f32, n, k, k);
  std::vector<float> zeros(16 * k, 0.0f);
  InputMoments m(k, k);
  m.add(TensorView::matrix(zeros.data(), DType::f32, 16, k, k));
  const PackedLinear cal = PackedLinear::int4(v, 32, true, DType::f32, &m);
  const PackedLinear plain = PackedLinear::int4(v, 32, true, DType::f32);
  EXPECT_EQ(cal.dequantize(), plain.dequantize());
  EXPECT_EQ(cal.stats().out_rel_err, cal.stats().out_rel_err);  // defined (not NaN)
}

}  // namespace
}  // namespace frt
