// Packers: the f16 scale round trip, and weights adopted as a checkpoint quantised them.
#include <flashrt/errors.h>
#include <flashrt/pack.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

namespace frt {
namespace {

uint16_t half_bits(float f) {  // exact halves only (the test values are chosen to be)
  for (uint32_t h = 0; h < 0x10000u; ++h)
    if (frt_f16_to_f32(static_cast<uint16_t>(h)) == f) return static_cast<uint16_t>(h);
  ADD_FAILURE() << f << " is not a half";
  return 0;
}

TEST(Pack, HalfToSingleIsExactIncludingSubnormalsAndSpecials) {
  EXPECT_EQ(frt_f16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(frt_f16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(frt_f16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(frt_f16_to_f32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(frt_f16_to_f32(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_TRUE(std::isinf(frt_f16_to_f32(0x7c00)));
  EXPECT_TRUE(std::isnan(frt_f16_to_f32(0x7e00)));
  EXPECT_TRUE(std::signbit(frt_f16_to_f32(0x8000)));
}

// GGUF Q4_1-style parts: nibbles, a half scale and a half min per 32; the pack must compute with
// exactly d*q + m (product then sum, as the checkpoint's own dequantiser does).
TEST(Pack, AdoptedInt4PartsDequantiseToExactlyScaleTimesQPlusMin) {
  const int64_t n = 19, k = 64, groups = k / 32;
  std::mt19937 rng(7);
  std::vector<int8_t> q(n * k);
  for (auto& v : q) v = static_cast<int8_t>(rng() % 16);
  std::vector<uint16_t> d(n * groups), m(n * groups);
  std::vector<float> df(n * groups), mf(n * groups);
  for (int64_t i = 0; i < n * groups; ++i) {
    df[i] = std::ldexp(static_cast<float>(1 + rng() % 1000), -14);
    mf[i] = -std::ldexp(static_cast<float>(rng() % 1000), -12);
    d[i] = half_bits(df[i]);
    m[i] = half_bits(mf[i]);
  }
  QuantizedParts parts{
      WeightFormat::int4_group, 32, n, k, q.data(), DType::f16, d.data(), m.data()};
  const PackedLinear p = PackedLinear::from_quantized(parts);
  EXPECT_EQ(p.form(), "int4 g32 asymmetric f16 scales");
  const std::vector<float> w = p.dequantize();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const float prod = static_cast<float>(q[r * k + i]) * df[r * groups + i / 32];
      ASSERT_EQ(w[r * k + i], prod + mf[r * groups + i / 32]) << r << "," << i;
    }
  std::vector<float> host(w);
  const PackStats s = p.compare(TensorView::matrix(host.data(), DType::f32, n, k, k));
  EXPECT_EQ(s.max_abs_err, 0.0);
}

TEST(Pack, AdoptedPartsOutOfRangeOrIncompleteAreRefusedByName) {
  std::vector<int8_t> q(16 * 32, 3);
  std::vector<float> s(16, 0.5f);
  QuantizedParts parts{
      WeightFormat::int4_group, 32, 16, 32, q.data(), DType::f32, s.data(), nullptr};
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);  // int4 without mins
  std::vector<float> mins(16, -4.0f);
  parts.mins = mins.data();
  q[40] = 16;
  try {
    PackedLinear::from_quantized(parts);
    FAIL() << "a nibble of 16 was adopted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("value 16 at [1, 8]"), std::string::npos) << e.what();
  }
  q[40] = 3;
  s[5] = std::nanf("");
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);
  parts.group = 48;
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);
  // The GEMM's layouts are packed from host weights, never adopted as a checkpoint's parts.
  parts.group = 32;
  s[5] = 0.5f;
  for (WeightFormat gemm : {WeightFormat::int8_gemm, WeightFormat::int4_gemm}) {
    parts.format = gemm;
    try {
      PackedLinear::from_quantized(parts);
      FAIL() << "adopted as " << name_of(gemm);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("not " + std::string(name_of(gemm))), std::string::npos)
          << e.what();
    }
  }
}

TEST(Pack, HalfScalesAreRoundedBeforeTheWeightsAreQuantisedAgainstThem) {
  const int64_t n = 5, k = 128;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w(n * k);
  for (float& v : w) v = dist(rng);
  const TensorView v = TensorView::matrix(w.data(), DType::f32, n, k, k);
  const PackedLinear h = PackedLinear::int8(v, 32, DType::f16);
  const PackedLinear f = PackedLinear::int8(v, 32, DType::f32);
  EXPECT_EQ(h.form(), "int8 g32 f16 scales");
  EXPECT_LT(h.nbytes(), f.nbytes());
  // Both are int8 at 1/127 of the group's range: f16 scales cost at most a hair more error.
  EXPECT_LT(h.stats().rel_err, 1.05 * f.stats().rel_err + 1e-6);
  EXPECT_LT(h.stats().rel_err, 0.01);
  const PackedLinear c = PackedLinear::int8(v);
  EXPECT_LT(f.stats().rel_err, c.stats().rel_err);  // group scales beat one per channel
  EXPECT_THROW(PackedLinear::int8(v, 0, DType::f16), InvalidArgument);
}

}  // namespace
}  // namespace frt
