#include <flashrt/errors.h>
#include <flashrt/gates.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace frt {
namespace {

TensorView vec(std::vector<float>& v, int64_t rows, int64_t cols) {
  return TensorView::matrix(v.data(), DType::f32, rows, cols, cols);
}

TEST(Gates, ValueMetricsAndBands) {
  std::vector<float> a = {1, 2, 3, 4}, b = {1, 2, 3, 4.01f};
  const ValueMetrics m = value_metrics(vec(a, 1, 4), vec(b, 1, 4));
  EXPECT_GT(m.cosine, 0.9999);
  EXPECT_NEAR(m.max_abs, 0.01, 1e-6);
  EXPECT_STREQ(band_name(value_band(0.9995)), "pass");
  EXPECT_STREQ(band_name(value_band(0.996)), "warn");
  EXPECT_STREQ(band_name(value_band(0.99)), "low");
  std::vector<float> nan = {1, NAN, 3, 4};
  EXPECT_TRUE(std::isnan(value_metrics(vec(nan, 1, 4), vec(a, 1, 4)).cosine));
  EXPECT_STREQ(band_name(value_band(NAN)), "low");
}

TEST(Gates, DistributionMetricsCountTop1PerPosition) {
  std::vector<float> got = {0, 1, 0, /**/ 5, 0, 0, /**/ 0, 0, 1};
  std::vector<float> want = {0, 2, 0, /**/ 0, 5, 0, /**/ 0, 0, 3};
  const DistributionMetrics m = distribution_metrics(vec(got, 3, 3), vec(want, 3, 3));
  EXPECT_EQ(m.positions, 3);
  EXPECT_NEAR(m.top1_agreement, 2.0 / 3, 1e-12);
  EXPECT_STREQ(band_name(distribution_band(0.9)), "warn");
}

TEST(Gates, ShapeAndLayoutMismatchesAreErrors) {
  std::vector<float> a(6), b(4);
  EXPECT_THROW(value_metrics(vec(a, 2, 3), vec(b, 2, 2)), InvalidArgument);
  TensorView t = vec(a, 2, 3);
  t.strides = {1, 2, 0, 0};
  EXPECT_THROW(value_metrics(t, vec(a, 2, 3)), InvalidArgument);
}

TEST(Gates, LatencyVerdictUsesTheMedianRoundRatio) {
  const LatencyVerdict v = latency_verdict({10, 10, 10, 10, 10}, {9, 9.9, 10.5, 9.5, 9.7}, 1.02);
  EXPECT_NEAR(v.median_ratio, 10 / 9.7, 1e-12);
  EXPECT_TRUE(v.activates);
  EXPECT_FALSE(latency_verdict({10}, {9.9}, 1.02).activates);
  EXPECT_THROW(latency_verdict({1, 2}, {1}, 1.02), InvalidArgument);
}

TEST(Gates, FloorsAndCeilings) {
  const std::map<std::string, double> m = {{"cosine", 0.998}, {"max_abs", 0.2}};
  EXPECT_EQ(floors_shortfall(m, {{"cosine", 0.99}, {"max_abs", 0.5}}), "");
  EXPECT_NE(floors_shortfall(m, {{"cosine", 0.999}}).find("cosine 0.998 < floor 0.999"),
            std::string::npos);
  EXPECT_NE(floors_shortfall(m, {{"max_abs", 0.1}}).find("> ceiling"), std::string::npos);
  EXPECT_THROW(floors_shortfall(m, {{"top1_agreement", 0.9}}), InvalidArgument);
}

}  // namespace
}  // namespace frt
