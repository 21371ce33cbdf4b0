// Packers: the f16 scale round trip, weights adopted as a checkpoint quantised them, and packs
// relocated into a caller's region.
#include <flashrt/errors.h>
#include <flashrt/pack.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
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
  // int8_gemm is packed from host weights, never adopted as a checkpoint's parts; int4_gemm
  // takes int4 g32 parts with f16 scales only (these are f32).
  parts.group = 32;
  s[5] = 0.5f;
  parts.format = WeightFormat::int8_gemm;
  try {
    PackedLinear::from_quantized(parts);
    FAIL() << "adopted as int8_gemm";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("not int8_gemm"), std::string::npos) << e.what();
  }
  parts.format = WeightFormat::int4_gemm;
  try {
    PackedLinear::from_quantized(parts);
    FAIL() << "adopted f32 scales as int4_gemm";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("takes group 32 and f16 scales"), std::string::npos)
        << e.what();
  }
}

// A checkpoint's int4 parts laid out for the GEMM (int4_gemm, int4_super_gemm) hold the values
// the weight-only adoption of the same parts does, in the GEMM's form.
TEST(Pack, AdoptedInt4PartsInTheGemmLayoutsHoldTheSameValues) {
  std::mt19937_64 rng(9);
  const int64_t n = 20, k = 512;
  std::vector<int8_t> q(n * k);
  for (int8_t& v : q) v = static_cast<int8_t>(rng() % 16);
  std::vector<uint16_t> scales(n * k / 32), mins(n * k / 32);
  for (size_t i = 0; i < scales.size(); ++i) {
    scales[i] = static_cast<uint16_t>(0x2000 + rng() % 0x800);           // halves near 0.01
    mins[i] = static_cast<uint16_t>(0x8000 | (0x2800 + rng() % 0x800));  // and near -0.03
  }
  QuantizedParts parts;
  parts.format = WeightFormat::int4_group;
  parts.group = 32;
  parts.n = n;
  parts.k = k;
  parts.q = q.data();
  parts.scale_dtype = DType::f16;
  parts.scales = scales.data();
  parts.mins = mins.data();
  const PackedLinear group = PackedLinear::from_quantized(parts);
  parts.format = WeightFormat::int4_gemm;
  const PackedLinear gemm = PackedLinear::from_quantized(parts);
  EXPECT_EQ(gemm.format(), WeightFormat::int4_gemm);
  EXPECT_EQ(gemm.dequantize(), group.dequantize());
  // Q4_K's parts: 6-bit codes under f16 d and dmin.
  std::vector<uint8_t> sc(n * k / 32), mn(n * k / 32);
  for (size_t i = 0; i < sc.size(); ++i) sc[i] = rng() % 64, mn[i] = rng() % 64;
  std::vector<uint16_t> d(n * k / 256), dmin(n * k / 256);
  for (size_t i = 0; i < d.size(); ++i)
    d[i] = static_cast<uint16_t>(0x1400 + rng() % 0x400), dmin[i] = static_cast<uint16_t>(0x1000);
  parts.format = WeightFormat::int4_super;
  parts.scales = sc.data();
  parts.mins = mn.data();
  parts.super_scales = d.data();
  parts.super_mins = dmin.data();
  const PackedLinear super = PackedLinear::from_quantized(parts);
  parts.format = WeightFormat::int4_super_gemm;
  const PackedLinear super_gemm = PackedLinear::from_quantized(parts);
  EXPECT_EQ(super_gemm.format(), WeightFormat::int4_super_gemm);
  EXPECT_EQ(super_gemm.form(), kInt4SuperGemmForm);
  EXPECT_EQ(super_gemm.nbytes(), super.nbytes());
  EXPECT_EQ(super_gemm.dequantize(), super.dequantize());
  parts.super_mins = nullptr;  // incomplete: refused by the form's name before allocating
  try {
    PackedLinear::from_quantized(parts);
    FAIL() << "adopted int4_super_gemm without dmin";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("int4_super_gemm [20, 512] takes group 32"),
              std::string::npos)
        << e.what();
  }
}

// GGUF Q4_K's parts (nibbles, 6-bit scale and min codes per 32, f16 d and dmin per 256) held as
// int4_super: the pack computes with exactly q * (d * sc) - dmin * m, as gguf's dequantiser.
TEST(Pack, AdoptedSuperBlocksDequantiseToExactlyTheirCodedValues) {
  const int64_t n = 21, k = 512, groups = k / 32, supers = k / 256;
  std::mt19937 rng(11);
  std::vector<int8_t> q(n * k);
  for (auto& v : q) v = static_cast<int8_t>(rng() % 16);
  std::vector<uint8_t> sc(n * groups), mn(n * groups);
  for (int64_t i = 0; i < n * groups; ++i) sc[i] = rng() % 64, mn[i] = rng() % 64;
  std::vector<uint16_t> d(n * supers), dmin(n * supers);
  for (int64_t i = 0; i < n * supers; ++i)
    d[i] = half_bits(std::ldexp(static_cast<float>(1 + rng() % 1000), -20)),
    dmin[i] = half_bits(std::ldexp(static_cast<float>(rng() % 1000), -21));
  QuantizedParts parts{
      WeightFormat::int4_super, 32, n, k, q.data(), DType::f16, sc.data(), mn.data()};
  parts.super_scales = d.data();
  parts.super_mins = dmin.data();
  const PackedLinear p = PackedLinear::from_quantized(parts);
  EXPECT_EQ(p.form(), kInt4SuperForm);
  EXPECT_EQ(p.format(), WeightFormat::int4_super);
  const std::vector<float> w = p.dequantize();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t g = r * groups + i / 32, su = r * supers + i / 256;
      const float s = frt_f16_to_f32(d[su]) * static_cast<float>(sc[g]);
      const float o = frt_f16_to_f32(dmin[su]) * static_cast<float>(mn[g]);
      ASSERT_EQ(w[r * k + i], static_cast<float>(q[r * k + i]) * s - o) << r << "," << i;
    }

  // Codes past 6 bits, a width outside whole super-blocks, a missing super scale, an infinite
  // one: each refused by name, nothing packed.
  sc[3] = 64;
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);
  sc[3] = 63;
  parts.k = 384;
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);
  parts.k = k;
  parts.super_mins = nullptr;
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);
  parts.super_mins = dmin.data();
  d[1] = 0x7c00;  // +inf
  try {
    PackedLinear::from_quantized(parts);
    FAIL() << "an infinite super scale was adopted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("super scale of row 0 super-block 1"), std::string::npos)
        << e.what();
  }
}

// GGUF Q6_K's parts (int8 values, int8 scale codes per 16, an f16 d per 256) held as int8_super:
// the pack computes with exactly q * (d * sc); parts of another shape or without d are refused.
TEST(Pack, AdoptedInt8SuperBlocksDequantiseToExactlyTheirCodedValues) {
  const int64_t n = 19, k = 512, groups = k / 16, supers = k / 256;
  std::mt19937 rng(13);
  std::vector<int8_t> q(n * k), sc(n * groups);
  for (auto& v : q) v = static_cast<int8_t>(static_cast<int>(rng() % 64) - 32);
  for (auto& v : sc) v = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
  std::vector<uint16_t> d(n * supers);
  for (auto& v : d) v = half_bits(std::ldexp(static_cast<float>(1 + rng() % 1000), -22));
  QuantizedParts parts{
      WeightFormat::int8_super, 16, n, k, q.data(), DType::f16, sc.data(), nullptr};
  parts.super_scales = d.data();
  const PackedLinear p = PackedLinear::from_quantized(parts);
  EXPECT_EQ(p.form(), kInt8SuperForm);
  const std::vector<float> w = p.dequantize();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const float s =
          frt_f16_to_f32(d[r * supers + i / 256]) * static_cast<float>(sc[r * groups + i / 16]);
      ASSERT_EQ(w[r * k + i], static_cast<float>(q[r * k + i]) * s) << r << "," << i;
    }
  parts.k = 272;
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);
  parts.k = k;
  parts.super_scales = nullptr;
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);
  parts.super_scales = d.data();
  parts.group = 32;
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);
}

// Packing a host weight into super-blocks: its 6-bit coded grids cost little against int4 g32
// with its own f32 grid per group, and a width outside whole super-blocks is refused.
TEST(Pack, Int4SuperBlocksQuantiseCloseToPerGroupGrids) {
  std::mt19937_64 rng(5);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  const int64_t n = 40, k = 512;
  std::vector<float> w(n * k);
  for (float& v : w) v = dist(rng);
  const TensorView v = TensorView::matrix(w.data(), DType::f32, n, k, k);
  const PackedLinear s = PackedLinear::int4_super(v), g = PackedLinear::int4(v, 32, false);
  EXPECT_LT(s.stats().rel_err, 0.15);
  EXPECT_LT(s.stats().rel_err, 1.25 * g.stats().rel_err);
  EXPECT_LT(s.nbytes(), g.nbytes() * 4625 / 6000 + 1);  // 4.625 bits a weight against 6
  std::vector<float> narrow(n * 384, 0.1f);
  EXPECT_THROW(PackedLinear::int4_super(TensorView::matrix(narrow.data(), DType::f32, n, 384, 384)),
               InvalidArgument);
  // int8 in super-blocks (Q6_K's 6-bit values): finer than int4, coarser than int8 g16.
  const PackedLinear s8 = PackedLinear::int8_super(v), g8 = PackedLinear::int8(v, 16);
  EXPECT_LT(s8.stats().rel_err, 0.05);
  EXPECT_LT(s8.stats().rel_err, s.stats().rel_err);
  EXPECT_GT(s8.stats().rel_err, g8.stats().rel_err);
  EXPECT_THROW(PackedLinear::int8_super(TensorView::matrix(narrow.data(), DType::f32, n, 384, 384)),
               InvalidArgument);
}

// The plain grids of earlier packs, for comparison: min-max with 0 in the range (a whole zero
// point) and max|w| / 7 about level 8. Returns the squared error of the whole matrix.
double plain_int4_error(const std::vector<float>& w, int64_t k, bool symmetric) {
  double err = 0;
  for (size_t g = 0; g < w.size(); g += 32) {
    float lo = 0, hi = 0;
    for (size_t i = g; i < g + 32; ++i) lo = std::min(lo, w[i]), hi = std::max(hi, w[i]);
    const float scale = symmetric ? std::max(-lo, hi) / 7.0f : (hi - lo) / 15.0f;
    const float zero = symmetric ? 8.0f : std::nearbyint(-lo / scale);
    for (size_t i = g; i < g + 32; ++i) {
      const float q = std::clamp(std::nearbyint(w[i] / scale) + zero, 0.0f, 15.0f);
      const double d = w[i] - (q - zero) * scale;
      err += d * d;
    }
  }
  (void)k;
  return err;
}

// Note [int4 grids]: the searched grid is never worse than the plain one, and on weights
// of the usual shape (bell-shaped, no zero in many groups' middle) clearly better.
TEST(Pack, Int4GridsSearchedBeatThePlainGridsOnGaussianWeights) {
  const int64_t n = 64, k = 256;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 0.02f);
  std::vector<float> w(n * k);
  for (float& v : w) v = dist(rng);
  const TensorView v = TensorView::matrix(w.data(), DType::f32, n, k, k);
  for (bool symmetric : {true, false}) {
    const PackedLinear p = PackedLinear::int4(v, 32, symmetric, DType::f32);
    const double searched = p.stats().rms_err * p.stats().rms_err * static_cast<double>(n * k);
    const double plain = plain_int4_error(w, k, symmetric);
    EXPECT_LT(searched, 0.9 * plain) << (symmetric ? "symmetric" : "asymmetric");
    // f16 scales round the grid, but the search scores the grid as stored.
    const PackedLinear h = PackedLinear::int4(v, 32, symmetric, DType::f16);
    EXPECT_LT(h.stats().rel_err, 1.01 * p.stats().rel_err + 1e-6);
  }
}

// A matrix that already lies on 16-level grids comes back bit-exactly: Q4_1's (min-max, the
// group's extremes at levels 0 and 15) through the offset form, Q4_0's (the largest magnitude
// at level 0, a negative half scale when it is positive) through the symmetric one.
TEST(Pack, Int4WeightsAlreadyOnAGridComeBackExactly) {
  const int64_t n = 21, k = 96, groups = k / 32;
  std::mt19937 rng(5);
  for (bool symmetric : {false, true}) {
    std::vector<float> w(n * k);
    for (int64_t g = 0; g < n * groups; ++g) {
      const float d = std::ldexp(static_cast<float>(1 + rng() % 1000), -16);
      const float m = -std::ldexp(static_cast<float>(rng() % 1000), -13);
      const float sign = rng() % 2 ? 1.0f : -1.0f;
      for (int i = 0; i < 32; ++i) {
        int q = static_cast<int>(rng() % 16);
        if (i == 3) q = 0;
        if (i == 17) q = symmetric ? 1 + static_cast<int>(rng() % 15) : 15;
        // Symmetric: W = d' (q - 8) with d' = -sign d, so level 0 holds the largest magnitude.
        w[g * 32 + i] =
            symmetric ? (-sign * d) * static_cast<float>(q - 8) : static_cast<float>(q) * d + m;
      }
    }
    const TensorView v = TensorView::matrix(w.data(), DType::f32, n, k, k);
    const PackedLinear p = PackedLinear::int4(v, 32, symmetric, DType::f16);
    EXPECT_EQ(p.stats().max_abs_err, 0.0) << (symmetric ? "symmetric" : "asymmetric");
  }
}

// A group whose scale f16 cannot hold is refused by name, never stored as infinity (which would
// dequantise to NaN); f32 scales hold it.
TEST(Pack, HalfScalesPastTheirRangeAreRefusedNotStoredAsInfinity) {
  const int64_t n = 3, k = 64;
  std::vector<float> w(n * k, 0.25f);
  w[1 * k + 40] = 1e7f;
  const TensorView v = TensorView::matrix(w.data(), DType::f32, n, k, k);
  for (bool symmetric : {true, false}) {
    try {
      PackedLinear::int4(v, 32, symmetric, DType::f16);
      FAIL() << "an int4 scale past 65504 was stored";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("group 1 of row 1 needs a scale past f16's range"),
                std::string::npos)
          << e.what();
    }
    EXPECT_LT(PackedLinear::int4(v, 32, symmetric, DType::f32).stats().rel_err, 0.1);
  }
  EXPECT_THROW(PackedLinear::int8(v, 32, DType::f16), InvalidArgument);
  EXPECT_LT(PackedLinear::int8(v, 32, DType::f32).stats().rel_err, 0.01);
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

namespace frt {
namespace {

// int8 packs in groups of 16 (GGUF Q6_K's sub-blocks); int4 does not, and no form takes 8.
TEST(Pack, GroupsOf16AreInt8OnlyAndOtherSizesAreRefusedByName) {
  std::vector<float> w(16 * 64, 0.25f);
  const TensorView v = TensorView::matrix(w.data(), DType::f32, 16, 64, 64);
  EXPECT_EQ(PackedLinear::int8(v, 16, DType::f32).group(), 16);
  const auto refused = [](auto pack, const std::string& want) {
    try {
      pack();
      ADD_FAILURE() << "not refused: " << want;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused([&] { return PackedLinear::int4(v, 16, true, DType::f32); },
          "int4 group 16 not in {32, 64, 128}");
  refused([&] { return PackedLinear::int8(v, 8, DType::f32); },
          "int8 group 8 not in {16, 32, 64, 128}");
}

// One pack of every form over random weights: 40 x 128 (3 panels, the last partial), the
// super-block forms over the same values as 20 rows of 256 (one super-block, 2 panels).
std::vector<PackedLinear> packs_of_every_form(std::vector<float>& w) {
  const int64_t n = 40, k = 128;
  w.resize(n * k);
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  for (float& v : w) v = dist(rng);
  const TensorView view = TensorView::matrix(w.data(), DType::f32, n, k, k);
  std::vector<PackedLinear> packs;
  packs.push_back(PackedLinear::int8(view));
  packs.push_back(PackedLinear::int8(view, 64, DType::f16));
  packs.push_back(PackedLinear::int4(view, 32, false, DType::f16));
  packs.push_back(PackedLinear::int4(view, 32, true, DType::f32));
  packs.push_back(PackedLinear::int8_gemm(view, 32));
  packs.push_back(PackedLinear::int4_gemm(view, false));
  packs.push_back(PackedLinear::int4_gemm(view, true));
  const TensorView wide = TensorView::matrix(w.data(), DType::f32, 20, 256, 256);
  packs.push_back(PackedLinear::int4_super(wide));
  packs.push_back(PackedLinear::int8_super(wide));
  packs.push_back(PackedLinear::int4_super_gemm(wide));
  packs.push_back(PackedLinear::int6_super_gemm(wide));
  return packs;
}

// relocate() moves every buffer of every form into the caller's region and changes nothing the
// kernels read: the dequantised weight, the byte count and the form stay, the views point into
// the region, and destroying the pack leaves the region to its owner (ASan sees a stray free).
TEST(Pack, RelocatedPacksHoldTheSameValuesInTheCallersRegion) {
  std::vector<float> w;
  std::vector<PackedLinear> packs = packs_of_every_form(w);
  for (PackedLinear& p : packs) {
    const std::vector<float> before = p.dequantize();
    const int64_t nbytes = p.nbytes(), size = p.region_bytes();
    const std::string form = p.form();
    EXPECT_GE(size, nbytes) << form;
    EXPECT_EQ(size % 64, 0) << form;
    void* region = std::aligned_alloc(64, static_cast<size_t>(size));
    std::memset(region, 0, static_cast<size_t>(size));
    {
      PackedLinear moved = std::move(p);
      moved.relocate(region);
      const char* lo = static_cast<const char*>(region);
      for (const void* b : {moved.view().qdata, moved.view().scales, moved.view().mins}) {
        if (b == nullptr) continue;
        EXPECT_GE(static_cast<const char*>(b), lo) << form;
        EXPECT_LT(static_cast<const char*>(b), lo + size) << form;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u) << form;
      }
      EXPECT_EQ(moved.dequantize(), before) << form;
      EXPECT_EQ(moved.nbytes(), nbytes) << form;
      EXPECT_EQ(moved.form(), form);
    }
    std::free(region);  // the pack is gone and did not free it
  }
}

// copy() gives every form a second pack of the same bytes in buffers of its own: the same values,
// byte count and form, no buffer shared, and the copy outlives its original (ASan sees a read of
// freed memory or a double free); a copy of a relocated pack owns its buffers too.
TEST(Pack, CopiesHoldTheSameBytesInBuffersOfTheirOwn) {
  std::vector<float> w;
  std::vector<PackedLinear> packs = packs_of_every_form(w);
  for (PackedLinear& p : packs) {
    const std::string form = p.form();
    const std::vector<float> values = p.dequantize();
    const int64_t nbytes = p.nbytes();
    std::vector<PackedLinear> copies;
    {
      PackedLinear original = std::move(p);
      copies.push_back(original.copy());
      std::vector<char> region(static_cast<size_t>(original.region_bytes()) + 64);
      void* at = region.data() + (64 - reinterpret_cast<uintptr_t>(region.data()) % 64) % 64;
      original.relocate(at);
      copies.push_back(original.copy());
      const frt_packed_weight& o = original.view();
      for (const PackedLinear& c : copies) {
        for (const void* b : {c.view().qdata, c.view().scales, c.view().mins}) {
          if (b == nullptr) continue;
          for (const void* ob : {o.qdata, o.scales, o.mins}) EXPECT_NE(b, ob) << form;
        }
        EXPECT_EQ(c.view().mins == nullptr, o.mins == nullptr) << form;
      }
    }  // the original and its region are gone
    for (const PackedLinear& c : copies) {
      EXPECT_EQ(c.dequantize(), values) << form;
      EXPECT_EQ(c.nbytes(), nbytes) << form;
      EXPECT_EQ(c.form(), form);
    }
  }
}

}  // namespace
}  // namespace frt
