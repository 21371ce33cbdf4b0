// Every kernel of every variant this CPU runs, against float64 references computed from the
// format's definition (frt_kernel_abi.h) on fresh random inputs, with outputs poisoned first.
#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/cpu_features.h>
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/pack.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace frt {
namespace {

using namespace ktest;  // the kernel tests' shared helpers (kernel_test_util.h)

const std::vector<Format> kFormats = {
    {"int8", WeightFormat::int8_channel, 0, true, DType::f32},
    {"int8_g32", WeightFormat::int8_group, 32, true, DType::f32},
    {"int8_g64_f16", WeightFormat::int8_group, 64, true, DType::f16},
    {"int8_g128_f16", WeightFormat::int8_group, 128, true, DType::f16},
    {"int4_g32_sym", WeightFormat::int4_group, 32, true, DType::f32},
    {"int4_g32_asym_f16", WeightFormat::int4_group, 32, false, DType::f16},
    {"int4_g64_asym", WeightFormat::int4_group, 64, false, DType::f32},
    {"int4_g128_sym_f16", WeightFormat::int4_group, 128, true, DType::f16},
    {"int4_g128_asym", WeightFormat::int4_group, 128, false, DType::f32},
    {"int8_g16", WeightFormat::int8_group, 16, true, DType::f32},
    {"int4_super", WeightFormat::int4_super, 32, false, DType::f16},
    {"int8_super", WeightFormat::int8_super, 16, true, DType::f16}};

// |got - want| within fp32 accumulation error over sum |x w| (plus bf16 output rounding).
void expect_close(double got, double want, double magnitude, DType out, const std::string& where) {
  const double tol = 2e-5 * magnitude + (out == DType::bf16 ? std::fabs(want) / 128.0 : 0) + 1e-6;
  ASSERT_TRUE(std::isfinite(got)) << where << ": unwritten or non-finite";
  ASSERT_NEAR(got, want, tol) << where;
}

struct LinearCase {
  int64_t m, k, n;
};
const std::vector<LinearCase> kLinearCases = {
    {1, 128, 1},  {1, 256, 17}, {2, 128, 33},  {3, 384, 100}, {4, 256, 48},
    {5, 128, 31}, {7, 512, 64}, {8, 1024, 96}, {16, 128, 50}, {1, 2048, 160}};

class LinearKernel : public ::testing::TestWithParam<std::string> {};

TEST_P(LinearKernel, MatchesFloat64ReferenceEveryFormatShapeAndDtype) {
  std::string skip;
  const frt_kernel_table* t = open_variant("linear", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const Format& f : kFormats)
    for (const LinearCase& c : kLinearCases)
      for (DType xd : {DType::f32, DType::bf16}) {
        if (!takes(f, c.k)) continue;
        for (DType yd : {DType::f32, DType::bf16})
          for (bool with_bias : {false, true}) {
            std::vector<float> w = random_weight(c.n, c.k, rng);
            const PackedLinear packed = pack(f, w, c.n, c.k);
            const std::vector<double> wd = dequant64(packed.view());
            std::vector<float> bias(c.n);
            for (float& b : bias) b = std::normal_distribution<float>(0, 1)(rng);
            Rows x(xd, c.m, c.k, c.k + 5, rng);  // strided rows
            Out y(yd, c.m, c.n);
            run_linear(*t, pool, packed, with_bias ? bias.data() : nullptr, x.view(), y.view());
            for (int64_t r = 0; r < c.m; ++r) {
              for (int64_t col = 0; col < c.n; ++col) {
                double want = with_bias ? bias[col] : 0.0, mag = std::fabs(want);
                for (int64_t i = 0; i < c.k; ++i) {
                  want += x.value[r * c.k + i] * wd[col * c.k + i];
                  mag += std::fabs(x.value[r * c.k + i] * wd[col * c.k + i]);
                }
                expect_close(y.at(r, col), want, mag, yd,
                             std::string(f.name) + " m" + std::to_string(c.m) + " k" +
                                 std::to_string(c.k) + " n" + std::to_string(c.n) + " x " +
                                 dtype_name(xd) + " y " + dtype_name(yd) + " [" +
                                 std::to_string(r) + "," + std::to_string(col) + "]");
              }
              for (int64_t col = c.n; col < y.ld; ++col)
                ASSERT_TRUE(y.gap_untouched(r, col)) << "wrote past the row at " << col;
            }
          }
      }
}

TEST_P(LinearKernel, OneThreadAndTwoThreadsAgreeBitwise) {
  std::string skip;
  const frt_kernel_table* t = open_variant("linear", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  std::mt19937_64 rng(fresh_seed());
  for (const Format& f : kFormats)
    for (int64_t rows : {3, 16}) {  // 16: the amx variants' tiles (Note [Tile panels])
      std::vector<float> w = random_weight(200, 256, rng);
      const PackedLinear packed = pack(f, w, 200, 256);
      Rows x(DType::f32, rows, 256, 256, rng);
      Out a(DType::f32, rows, 200), b(DType::f32, rows, 200);
      run_linear(*t, pool, packed, nullptr, x.view(), a.view(), 1);
      run_linear(*t, pool, packed, nullptr, x.view(), b.view(), 2);
      EXPECT_EQ(0, std::memcmp(a.f32.data(), b.f32.data(), a.f32.size() * 4))
          << f.name << " " << rows << " rows";
    }
}

// A row's sums are its own (Note [Accumulator chains]): in a call of 16 rows (the AVX-512 panels
// take blocks of eight) each row comes out with the bits it has in calls of 2 or 4 rows, and in
// calls of 5..15 (blocks of eight and four, then the rest). A row left over alone (the last of
// an odd count: the AVX2 int4 panels pair rows) runs the single row's chains instead. On the amx
// variants the int8 and int4 forms (but int8 groups of 16 and int8 super-blocks) go to the tiles
// from 9 rows, per channel from 5 (Note [Tile panels]), whose row sums are their own too but in
// another order: there calls of 9..15 rows match the call of 16, and calls of 2 the FMA blocks'
// call of 4.
TEST_P(LinearKernel, ARowHasTheSameBitsInACallOf16AsInSmallerCalls) {
  std::string skip;
  const frt_kernel_table* t = open_variant("linear", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t n = 48, k = 256;
  for (const Format& f : kFormats) {
    const bool tiles =
        GetParam().starts_with("amx") &&
        (f.format == WeightFormat::int8_channel || f.format == WeightFormat::int4_super ||
         ((f.format == WeightFormat::int8_group || f.format == WeightFormat::int4_group) &&
          f.group >= 32));
    std::vector<float> w = random_weight(n, k, rng);
    const PackedLinear packed = pack(f, w, n, k);
    Rows all(DType::f32, 16, k, k, rng);
    Out y16(DType::f32, 16, n);
    run_linear(*t, pool, packed, nullptr, all.view(), y16.view());
    // A call of `rows` rows from row r0 of `all`.
    const auto call = [&](int64_t r0, int64_t rows) {
      Rows part(DType::f32, rows, k, k, rng);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t i = 0; i < k; ++i)
          part.set(r, i, static_cast<float>(all.value[(r0 + r) * k + i]));
      Out y(DType::f32, rows, n);
      run_linear(*t, pool, packed, nullptr, part.view(), y.view());
      return y;
    };
    // Each row of that call but an odd call's last against `ref`, a call from row ref_r0.
    const auto expect_rows = [&](int64_t r0, int64_t rows, const Out& ref, int64_t ref_r0) {
      const Out y = call(r0, rows);
      for (int64_t r = 0; r < rows - rows % 2; ++r)
        ASSERT_EQ(0, std::memcmp(&y.f32[r * y.ld], &ref.f32[(r0 - ref_r0 + r) * ref.ld], n * 4))
            << f.name << " row " << r0 + r << " in a call of " << rows << " from row " << r0;
    };
    for (int64_t r0 = 0; r0 + 4 <= 16; r0 += 4) {
      if (tiles) {
        const Out y4 = call(r0, 4);
        for (int64_t r = r0; r < r0 + 4; r += 2) expect_rows(r, 2, y4, r0);
      } else {
        expect_rows(r0, 4, y16, 0);
        for (int64_t r = r0; r < r0 + 4; r += 2) expect_rows(r, 2, y16, 0);
      }
    }
    // On the tiles from tile_from_amx's start; the group forms' calls of 5..8 rows below it are the
    // FMA blocks', against their call of 8.
    const int64_t from = !tiles ? 5 : f.format == WeightFormat::int8_channel ? 5 : 9;
    for (int64_t rows = from; rows < 16; ++rows) expect_rows(0, rows, y16, 0);
    if (from == 9) {
      const Out y8 = call(0, 8);
      for (int64_t rows = 5; rows < 8; ++rows) expect_rows(0, rows, y8, 0);
    }
  }
}

// Two packs of the same values, run at rows 1..16 on one thread and on two: the same bits.
void expect_same_bits(const frt_kernel_table& t, ThreadPool& pool, const PackedLinear& a,
                      const PackedLinear& b, std::mt19937_64& rng) {
  EXPECT_EQ(a.dequantize(), b.dequantize());
  for (int64_t m : {1, 2, 3, 4, 5, 16})
    for (int threads : {1, 2}) {
      Rows x(DType::f32, m, a.k(), a.k() + 3, rng);
      Out ya(DType::f32, m, a.n()), yb(DType::f32, m, a.n());
      run_linear(t, pool, a, nullptr, x.view(), ya.view(), threads);
      run_linear(t, pool, b, nullptr, x.view(), yb.view(), threads);
      ASSERT_EQ(0, std::memcmp(ya.f32.data(), yb.f32.data(), ya.f32.size() * 4))
          << a.form() << " m" << m << " threads " << threads;
    }
}

// A Q4_K tensor's values held in super-blocks (int4_super: 6-bit codes under f16 d and dmin) and
// the same values re-expressed as int4 g32 with f32 scale d*sc and min -(dmin*m): every product
// is exact in f32, so both packs must give the same bits, row counts 1..16, any thread count; and
// a Q6_K tensor's (int8_super) against int8 g16 with f32 scales d*sc.
TEST_P(LinearKernel, SuperBlocksComputeTheBitsOfTheirExactReExpression) {
  std::string skip;
  const frt_kernel_table* t = open_variant("linear", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int64_t n = 72, k = 768, groups = k / 32, supers = k / FRT_SUPER_K;
  std::vector<int8_t> q(n * k);
  std::vector<uint8_t> sc(n * groups), mn(n * groups);
  std::vector<uint16_t> d(n * supers), dmin(n * supers);
  std::vector<float> scale(n * groups), min(n * groups);
  for (auto& v : q) v = static_cast<int8_t>(rng() % 16);
  for (int64_t i = 0; i < n * groups; ++i) sc[i] = rng() % 64, mn[i] = rng() % 64;
  for (int64_t i = 0; i < n * supers; ++i) {
    // Normal halves about 1e-3 (the weights' scale); their mantissas random.
    d[i] = static_cast<uint16_t>(0x1000 | (rng() % 0x800));
    dmin[i] = static_cast<uint16_t>(0x0c00 | (rng() % 0x800));
  }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t at = r * groups + g, su = r * supers + g / FRT_SUPER4_GROUPS;
      scale[at] = frt_f16_to_f32(d[su]) * static_cast<float>(sc[at]);
      min[at] = -(frt_f16_to_f32(dmin[su]) * static_cast<float>(mn[at]));
    }
  QuantizedParts super{
      WeightFormat::int4_super, 32, n, k, q.data(), DType::f16, sc.data(), mn.data()};
  super.super_scales = d.data();
  super.super_mins = dmin.data();
  const QuantizedParts group{
      WeightFormat::int4_group, 32, n, k, q.data(), DType::f32, scale.data(), min.data()};
  const PackedLinear a = PackedLinear::from_quantized(super),
                     b = PackedLinear::from_quantized(group);
  EXPECT_EQ(a.form(), kInt4SuperForm);
  EXPECT_EQ(a.nbytes() * 8 * 1000 / (n / FRT_PANEL * FRT_PANEL + FRT_PANEL) / k, 4625)
      << "bits a weight, panels padded";
  expect_same_bits(*t, pool, a, b, rng);

  // Q6_K: int8 values under int8 scale codes per 16 and an f16 d per 256, against int8 g16 with
  // f32 scale d * sc.
  const int64_t groups16 = k / 16;
  std::vector<int8_t> q6(n * k), sc6(n * groups16);
  std::vector<float> scale6(n * groups16);
  for (auto& v : q6) v = static_cast<int8_t>(static_cast<int>(rng() % 64) - 32);
  for (auto& v : sc6) v = static_cast<int8_t>(static_cast<int>(rng() % 256) - 128);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t g = 0; g < groups16; ++g)
      scale6[r * groups16 + g] =
          frt_f16_to_f32(d[r * supers + g / FRT_SUPER8_GROUPS]) * sc6[r * groups16 + g];
  QuantizedParts super8{
      WeightFormat::int8_super, 16, n, k, q6.data(), DType::f16, sc6.data(), nullptr};
  super8.super_scales = d.data();
  const QuantizedParts group16{
      WeightFormat::int8_group, 16, n, k, q6.data(), DType::f32, scale6.data(), nullptr};
  const PackedLinear a8 = PackedLinear::from_quantized(super8),
                     b8 = PackedLinear::from_quantized(group16);
  EXPECT_EQ(a8.form(), kInt8SuperForm);
  EXPECT_EQ(a8.nbytes() * 8 * 10000 / (n / FRT_PANEL * FRT_PANEL + FRT_PANEL) / k, 85625)
      << "bits a weight, panels padded";
  expect_same_bits(*t, pool, a8, b8, rng);
}

// At 2 rows on the FMA panels and at 16 (the amx variants' tiles, Note [Tile panels]): a NaN or
// an infinity stays in its own row.
TEST_P(LinearKernel, NonFiniteInputsPropagateWithoutCrashing) {
  std::string skip;
  const frt_kernel_table* t = open_variant("linear", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> w = random_weight(40, 128, rng);
  for (const PackedLinear& packed :
       {PackedLinear::int8(TensorView::matrix(w.data(), DType::f32, 40, 128, 128)),
        pack(kFormats[2], w, 40, 128), pack(kFormats[5], w, 40, 128)})
    for (int64_t rows : {2, 16}) {
      Rows x(DType::f32, rows, 128, 128, rng);
      x.f32[5] = std::nanf("");
      x.f32[128 + 7] = std::numeric_limits<float>::infinity();
      Out y(DType::f32, rows, 40);
      run_linear(*t, pool, packed, nullptr, x.view(), y.view());
      for (int64_t c = 0; c < 40; ++c) EXPECT_TRUE(std::isnan(y.at(0, c))) << rows << " rows";
      // inf times any weight (0 included: inf * 0 is NaN) leaves no finite output in that row.
      for (int64_t c = 0; c < 40; ++c) EXPECT_FALSE(std::isfinite(y.at(1, c))) << rows << " rows";
      for (int64_t r = 2; r < rows; ++r)
        for (int64_t c = 0; c < 40; ++c) EXPECT_TRUE(std::isfinite(y.at(r, c))) << "row " << r;
    }
}

TEST_P(LinearKernel, RefusesFormsOutsideItsContract) {
  std::string skip;
  const frt_kernel_table* t = open_variant("linear", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(1);
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> w = random_weight(32, 128, rng);
  const PackedLinear packed =
      PackedLinear::int8(TensorView::matrix(w.data(), DType::f32, 32, 128, 128));
  Rows prefill(DType::f32, 17, 128, 128, rng);
  Out y17(DType::f32, 17, 32);
  EXPECT_NE(
      linear_refusal(*t, packed, prefill.view(), y17.view()).find("outside the decode band 1..16"),
      std::string::npos);
  EXPECT_THROW(run_linear(*t, pool, packed, nullptr, prefill.view(), y17.view()), Refused);

  Rows x(DType::f32, 2, 128, 128, rng);
  Out y(DType::f32, 2, 32);
  TensorView transposed = x.view();
  transposed.strides = {1, 128, 0, 0};  // a column-major view: would need a hidden copy
  EXPECT_NE(linear_refusal(*t, packed, transposed, y.view()).find("not contiguous"),
            std::string::npos);
  Rows narrow(DType::f32, 2, 64, 64, rng);
  EXPECT_NE(linear_refusal(*t, packed, narrow.view(), y.view()).find("width 64, expected 128"),
            std::string::npos);
  Out wrong_rows(DType::f32, 3, 32);
  EXPECT_NE(linear_refusal(*t, packed, x.view(), wrong_rows.view()).find("row count"),
            std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(Variants, LinearKernel, ::testing::ValuesIn(kAmxIsas));

double act64(Activation a, double g) {
  if (a == Activation::silu) return g / (1.0 + std::exp(-g));
  if (a == Activation::gelu) return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0)));
  if (a == Activation::gelu_tanh)
    return 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
  ADD_FAILURE() << "no reference for activation " << name_of(a);
  return std::nan("");
}

// The gated op's operands: y = down(act(gate(x)) * up(x)).
FfnOperands gated(const PackedLinear& gate, const PackedLinear& up, const PackedLinear& down,
                  Activation act) {
  FfnOperands f;
  f.gate = &gate;
  f.up = &up;
  f.down = &down;
  f.act = act;
  return f;
}

// The ungated op's operands: y = down(act(up(x) + up_bias)) + down_bias.
FfnOperands ungated(const PackedLinear& up, const PackedLinear& down, const float* up_bias,
                    const float* down_bias, Activation act) {
  FfnOperands f;
  f.up = &up;
  f.down = &down;
  f.up_bias = up_bias;
  f.down_bias = down_bias;
  f.act = act;
  return f;
}

class FfnKernel : public ::testing::TestWithParam<std::string> {};

TEST_P(FfnKernel, MatchesFloat64ReferenceEveryFormatActivationAndDtype) {
  std::string skip;
  const frt_kernel_table* t = open_variant("ffn", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Case {
    int64_t m, hidden, inter;
  };
  for (const Format& f : kFormats)
    for (Case c : {Case{1, 128, 384}, Case{3, 256, 128}, Case{8, 128, 256}, Case{16, 384, 128},
                   Case{2, 256, 512}})
      for (Activation act : {Activation::silu, Activation::gelu_tanh})
        for (DType dt : {DType::f32, DType::bf16}) {
          if (!takes(f, c.hidden) || !takes(f, c.inter)) continue;
          std::vector<float> wg = random_weight(c.inter, c.hidden, rng);
          std::vector<float> wu = random_weight(c.inter, c.hidden, rng);
          std::vector<float> wdn = random_weight(c.hidden, c.inter, rng);
          const PackedLinear g = pack(f, wg, c.inter, c.hidden), u = pack(f, wu, c.inter, c.hidden),
                             d = pack(f, wdn, c.hidden, c.inter);
          const std::vector<double> gd = dequant64(g.view()), ud = dequant64(u.view()),
                                    dd = dequant64(d.view());
          Rows x(dt, c.m, c.hidden, c.hidden, rng);
          Out y(dt, c.m, c.hidden);
          run_ffn(*t, pool, gated(g, u, d, act), x.view(), y.view());
          for (int64_t r = 0; r < c.m; ++r) {
            std::vector<double> h(c.inter), hmag(c.inter);
            for (int64_t j = 0; j < c.inter; ++j) {
              double gv = 0, uv = 0;
              for (int64_t i = 0; i < c.hidden; ++i) {
                gv += x.value[r * c.hidden + i] * gd[j * c.hidden + i];
                uv += x.value[r * c.hidden + i] * ud[j * c.hidden + i];
              }
              h[j] = act64(act, gv) * uv;
            }
            for (int64_t col = 0; col < c.hidden; ++col) {
              double want = 0, mag = 0;
              for (int64_t j = 0; j < c.inter; ++j) {
                want += h[j] * dd[col * c.inter + j];
                mag += std::fabs(h[j] * dd[col * c.inter + j]);
              }
              // h itself carries fp32 rounding from two dot products: allow 1e-4 relative.
              const double got = y.at(r, col);
              ASSERT_TRUE(std::isfinite(got)) << f.name << " unwritten [" << r << "," << col << "]";
              ASSERT_NEAR(got, want,
                          1e-4 * mag + (dt == DType::bf16 ? std::fabs(want) / 128 : 0) + 1e-6)
                  << f.name << " m" << c.m << " [" << r << "," << col << "]";
            }
          }
        }
}

TEST_P(FfnKernel, RefusesMismatchedShapesFormatsAndRows) {
  std::string skip;
  const frt_kernel_table* t = open_variant("ffn", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> a = random_weight(128, 64, rng), b = random_weight(64, 128, rng),
                     c = random_weight(64, 96, rng);
  const PackedLinear gate = pack(kFormats[0], a, 128, 64), down = pack(kFormats[0], b, 64, 128),
                     bad_down = pack(kFormats[0], c, 64, 96),
                     int4_gate = pack(kFormats[4], a, 128, 64);
  Rows x(DType::f32, 2, 64, 64, rng);
  Out y(DType::f32, 2, 64);
  EXPECT_EQ("", ffn_refusal(*t, gated(gate, gate, down, Activation::silu), x.view(), y.view()));
  EXPECT_NE(ffn_refusal(*t, gated(gate, gate, bad_down, Activation::silu), x.view(), y.view())
                .find("do not chain"),
            std::string::npos);
  EXPECT_NE(ffn_refusal(*t, gated(int4_gate, gate, down, Activation::silu), x.view(), y.view())
                .find("one weight format"),
            std::string::npos);
  Rows many(DType::f32, 32, 64, 64, rng);
  Out y32(DType::f32, 32, 64);
  EXPECT_NE(ffn_refusal(*t, gated(gate, gate, down, Activation::silu), many.view(), y32.view())
                .find("decode band"),
            std::string::npos);
  // The gated op is bias-free and computes silu and gelu_tanh only.
  std::vector<float> bias(128, 0.5f);
  FfnOperands biased = gated(gate, gate, down, Activation::silu);
  biased.up_bias = bias.data();
  EXPECT_NE(ffn_refusal(*t, biased, x.view(), y.view()).find("takes no biases"), std::string::npos);
  EXPECT_NE(ffn_refusal(*t, gated(gate, gate, down, Activation::gelu), x.view(), y.view())
                .find("not in {silu, gelu_tanh}"),
            std::string::npos);
  std::string why;
  const frt_kernel_table* linear = open_variant_library(library("linear", GetParam()), &why);
  ASSERT_NE(linear, nullptr) << why;
  EXPECT_NE(ffn_refusal(*linear, gated(gate, gate, down, Activation::silu), x.view(), y.view())
                .find("provides no gated_ffn op"),
            std::string::npos);
  EXPECT_NE(ffn_refusal(*linear, ungated(gate, down, nullptr, nullptr, Activation::gelu), x.view(),
                        y.view())
                .find("provides no ffn op"),
            std::string::npos);
}

// The ungated op: y = down(act(up(x) + up_bias)) + down_bias, biases optional, against float64.
TEST_P(FfnKernel, UngatedMatchesFloat64ReferenceEveryFormatActivationBiasAndDtype) {
  std::string skip;
  const frt_kernel_table* t = open_variant("ffn", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Case {
    int64_t m, hidden, inter;
  };
  // Odd widths (not a multiple of the panel, or of any group) run on int8 only: an int4 pack
  // needs every input width divisible by its group.
  const std::vector<Case> cases = {{1, 128, 384}, {3, 256, 128}, {8, 128, 256}, {16, 384, 128},
                                   {2, 100, 75},  {5, 33, 200},  {16, 17, 9},   {4, 512, 256}};
  int runs = 0;
  for (const Format& f : kFormats)
    for (const Case& c : cases) {
      if (!takes(f, c.hidden) || !takes(f, c.inter)) continue;
      for (Activation act : {Activation::silu, Activation::gelu_tanh, Activation::gelu})
        for (DType dt : {DType::f32, DType::bf16}) {
          // Bit 0: up bias, bit 1: down bias. The six runs of a format and case cycle through
          // all four combinations.
          const int biases = runs % 4;
          const bool with_up_bias = biases & 1, with_down_bias = biases & 2;
          std::vector<float> wu = random_weight(c.inter, c.hidden, rng);
          std::vector<float> wdn = random_weight(c.hidden, c.inter, rng);
          std::vector<float> bu(c.inter), bd(c.hidden);
          for (float& b : bu) b = std::normal_distribution<float>(0, 0.5f)(rng);
          for (float& b : bd) b = std::normal_distribution<float>(0, 0.5f)(rng);
          const PackedLinear u = pack(f, wu, c.inter, c.hidden),
                             d = pack(f, wdn, c.hidden, c.inter);
          const std::vector<double> ud = dequant64(u.view()), dd = dequant64(d.view());
          Rows x(dt, c.m, c.hidden, c.hidden + 3, rng);  // strided rows
          Out y(dt, c.m, c.hidden);
          const FfnOperands ops = ungated(u, d, with_up_bias ? bu.data() : nullptr,
                                          with_down_bias ? bd.data() : nullptr, act);
          ASSERT_EQ(ffn_refusal(*t, ops, x.view(), y.view()), "");
          run_ffn(*t, pool, ops, x.view(), y.view());
          ++runs;
          const std::string where = std::string(f.name) + " m" + std::to_string(c.m) + " hidden" +
                                    std::to_string(c.hidden) + " inter" + std::to_string(c.inter) +
                                    " " + name_of(act) + " " + dtype_name(dt) + " biases " +
                                    std::to_string(biases);
          for (int64_t r = 0; r < c.m; ++r) {
            std::vector<double> h(c.inter);
            for (int64_t j = 0; j < c.inter; ++j) {
              double uv = with_up_bias ? bu[j] : 0.0;
              for (int64_t i = 0; i < c.hidden; ++i)
                uv += x.value[r * c.hidden + i] * ud[j * c.hidden + i];
              h[j] = act64(act, uv);
            }
            for (int64_t col = 0; col < c.hidden; ++col) {
              double want = with_down_bias ? bd[col] : 0.0, mag = std::fabs(want);
              for (int64_t j = 0; j < c.inter; ++j) {
                want += h[j] * dd[col * c.inter + j];
                mag += std::fabs(h[j] * dd[col * c.inter + j]);
              }
              // h carries fp32 rounding from its dot product: allow 1e-4 relative.
              const double got = y.at(r, col);
              ASSERT_TRUE(std::isfinite(got)) << where << " unwritten [" << r << "," << col << "]";
              ASSERT_NEAR(got, want,
                          1e-4 * mag + (dt == DType::bf16 ? std::fabs(want) / 128 : 0) + 1e-6)
                  << where << " [" << r << "," << col << "]";
            }
            for (int64_t col = c.hidden; col < y.ld; ++col)
              ASSERT_TRUE(y.gap_untouched(r, col)) << where << ": wrote past the row at " << col;
          }
        }
    }
  EXPECT_GT(runs, 0);
}

// With identity projections the op's output is act(x + up_bias) + down_bias itself, so the
// activation is checked tightly enough to tell gelu (erf) from its tanh approximation (they
// differ by up to ~5e-4 near |x| = 2.7), which the general reference's tolerance could not.
TEST_P(FfnKernel, UngatedComputesTheNamedActivation) {
  std::string skip;
  const frt_kernel_table* t = open_variant("ffn", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  const int64_t w = 64, m = 2;
  std::vector<float> eye(w * w, 0.0f);
  for (int64_t i = 0; i < w; ++i) eye[i * w + i] = 1.0f;
  const PackedLinear up = PackedLinear::int8(TensorView::matrix(eye.data(), DType::f32, w, w, w));
  const PackedLinear down = PackedLinear::int8(TensorView::matrix(eye.data(), DType::f32, w, w, w));
  std::vector<float> x(m * w), bu(w), bd(w);
  for (int64_t i = 0; i < m * w; ++i) x[i] = -4.0f + 8.0f * static_cast<float>(i) / (m * w - 1);
  for (int64_t i = 0; i < w; ++i) {
    bu[i] = 0.125f * static_cast<float>(i % 5) - 0.25f;
    bd[i] = 0.0625f * static_cast<float>(i % 3);
  }
  const std::vector<Activation> acts = {Activation::silu, Activation::gelu_tanh, Activation::gelu};
  for (Activation act : acts) {
    std::vector<float> y(m * w, std::nanf(""));
    run_ffn(*t, pool, ungated(up, down, bu.data(), bd.data(), act),
            TensorView::matrix(x.data(), DType::f32, m, w, w),
            TensorView::matrix(y.data(), DType::f32, m, w, w));
    for (Activation other : acts) {
      double worst = 0;
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < w; ++c) {
          const double want = act64(other, static_cast<double>(x[r * w + c]) + bu[c]) + bd[c];
          worst = std::max(worst, std::fabs(y[r * w + c] - want));
        }
      if (other == act) {
        EXPECT_LT(worst, 1e-5) << name_of(act);
      } else {
        EXPECT_GT(worst, 1e-4) << name_of(act) << " computed what " << name_of(other) << " does";
      }
    }
  }
}

TEST_P(FfnKernel, UngatedOneThreadAndTwoThreadsAgreeBitwise) {
  std::string skip;
  const frt_kernel_table* t = open_variant("ffn", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  std::mt19937_64 rng(fresh_seed());
  for (const Format& f : kFormats) {
    std::vector<float> wu = random_weight(512, 256, rng), wd = random_weight(256, 512, rng);
    std::vector<float> bu(512, 0.25f), bd(256, -0.5f);
    const PackedLinear u = pack(f, wu, 512, 256), d = pack(f, wd, 256, 512);
    Rows x(DType::f32, 3, 256, 256, rng);
    Out a(DType::f32, 3, 256), b(DType::f32, 3, 256);
    const FfnOperands ops = ungated(u, d, bu.data(), bd.data(), Activation::gelu);
    run_ffn(*t, pool, ops, x.view(), a.view(), 1);
    run_ffn(*t, pool, ops, x.view(), b.view(), 2);
    EXPECT_EQ(0, std::memcmp(a.f32.data(), b.f32.data(), a.f32.size() * 4)) << f.name;
  }
}

TEST_P(FfnKernel, UngatedRefusesMismatchedShapesFormatsRowsAndActivations) {
  std::string skip;
  const frt_kernel_table* t = open_variant("ffn", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(1);
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> a = random_weight(128, 64, rng), b = random_weight(64, 128, rng),
                     c = random_weight(64, 96, rng);
  const PackedLinear up = pack(kFormats[0], a, 128, 64), down = pack(kFormats[0], b, 64, 128),
                     bad_down = pack(kFormats[0], c, 64, 96),
                     int4_up = pack(kFormats[4], a, 128, 64);
  std::vector<float> bu(128, 0.1f), bd(64, 0.1f);
  Rows x(DType::f32, 2, 64, 64, rng);
  Out y(DType::f32, 2, 64);
  EXPECT_EQ("", ffn_refusal(*t, ungated(up, down, bu.data(), bd.data(), Activation::gelu), x.view(),
                            y.view()));
  EXPECT_EQ("", ffn_refusal(*t, ungated(up, down, nullptr, nullptr, Activation::silu), x.view(),
                            y.view()));
  EXPECT_NE(
      ffn_refusal(*t, ungated(up, bad_down, nullptr, nullptr, Activation::gelu), x.view(), y.view())
          .find("do not chain"),
      std::string::npos);
  EXPECT_NE(ffn_refusal(*t, ungated(int4_up, down, nullptr, nullptr, Activation::gelu), x.view(),
                        y.view())
                .find("one weight format"),
            std::string::npos);
  const std::string relu =
      ffn_refusal(*t, ungated(up, down, nullptr, nullptr, Activation::relu), x.view(), y.view());
  EXPECT_NE(relu.find("not in {silu, gelu, gelu_tanh}"), std::string::npos) << relu;
  Rows many(DType::f32, 32, 64, 64, rng);
  Out y32(DType::f32, 32, 64);
  const FfnOperands ops = ungated(up, down, bu.data(), bd.data(), Activation::gelu);
  EXPECT_NE(ffn_refusal(*t, ops, many.view(), y32.view()).find("decode band"), std::string::npos);
  EXPECT_THROW(run_ffn(*t, pool, ops, many.view(), y32.view()), Refused);
  Rows narrow(DType::f32, 2, 32, 32, rng);
  EXPECT_NE(ffn_refusal(*t, ops, narrow.view(), y.view()).find("width 32, expected 64"),
            std::string::npos);
}

// Plan time: supports_op answers for a described form, before any tensor exists.
TEST_P(FfnKernel, FormRefusalAnswersForTheDescribedForm) {
  std::string skip;
  const frt_kernel_table* t = open_variant("ffn", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  frt_op_desc good{};
  good.op = FRT_OP_FFN;
  good.wformat = FRT_W_INT4_GROUP;
  good.group = 32;
  good.act = FRT_ACT_GELU;
  good.x_dtype = FRT_BF16;
  good.y_dtype = FRT_BF16;
  good.has_bias = 1;
  good.rows_max = FRT_MAX_ROWS;
  good.n = 128;
  good.k = 128;
  good.inner = 512;
  EXPECT_EQ(form_refusal(*t, good), "");
  frt_op_desc int8 = good;
  int8.wformat = FRT_W_INT8_CHANNEL;
  int8.group = 0;
  int8.n = int8.k = 100;  // int8 takes any width
  int8.inner = 75;
  EXPECT_EQ(form_refusal(*t, int8), "");
  frt_op_desc gated_desc = good;
  gated_desc.op = FRT_OP_GATED_FFN;
  gated_desc.act = FRT_ACT_SILU;
  gated_desc.has_bias = 0;
  EXPECT_EQ(form_refusal(*t, gated_desc), "");
  // Groups of 16 are an int8 form (GGUF Q6_K's sub-blocks); int4 and other sizes are refused.
  frt_op_desc g16 = good;
  g16.wformat = FRT_W_INT8_GROUP;
  g16.group = 16;
  EXPECT_EQ(form_refusal(*t, g16), "");
  g16.wformat = FRT_W_INT4_GROUP;
  EXPECT_NE(form_refusal(*t, g16).find("int4 group 16 not in {32, 64, 128}"), std::string::npos);
  frt_op_desc g8 = good;
  g8.wformat = FRT_W_INT8_GROUP;
  g8.group = 8;
  EXPECT_NE(form_refusal(*t, g8).find("int8 group 8 not in {16, 32, 64, 128}"), std::string::npos);
  // int4 super-blocks (GGUF Q4_K): group 32, f16 super scales, widths in whole super-blocks.
  frt_op_desc super = good;
  super.wformat = FRT_W_INT4_SUPER;
  super.scale_dtype = FRT_F16;
  super.k = 256;
  super.inner = 512;
  EXPECT_EQ(form_refusal(*t, super), "");
  super.k = 128;
  EXPECT_NE(form_refusal(*t, super).find("int4 super-block width k=128 is not a multiple of 256"),
            std::string::npos)
      << form_refusal(*t, super);
  super.k = 256;
  super.scale_dtype = FRT_F32;
  EXPECT_NE(form_refusal(*t, super).find("group 32 and f16 super scales"), std::string::npos)
      << form_refusal(*t, super);

  // An op kind the package does not own: the message names the package and the op.
  frt_op_desc linear_desc = good;
  linear_desc.op = FRT_OP_LINEAR;
  const std::string not_owned = form_refusal(*t, linear_desc);
  EXPECT_NE(not_owned.find("flashrt/ffn"), std::string::npos) << not_owned;
  EXPECT_NE(not_owned.find("linear"), std::string::npos) << not_owned;
  frt_op_desc rms = good;
  rms.op = FRT_OP_RMSNORM;
  EXPECT_NE(form_refusal(*t, rms).find("rmsnorm"), std::string::npos) << form_refusal(*t, rms);

  frt_op_desc indivisible = good;
  indivisible.k = 100;  // up's input width is not a multiple of group 32
  EXPECT_NE(form_refusal(*t, indivisible).find("k=100 is not a multiple of group 32"),
            std::string::npos)
      << form_refusal(*t, indivisible);
  frt_op_desc inner = good;
  inner.inner = 80;  // down's input width is the intermediate
  EXPECT_NE(form_refusal(*t, inner).find("k=80 is not a multiple of group 32"), std::string::npos)
      << form_refusal(*t, inner);

  frt_op_desc rows = good;
  rows.rows_max = FRT_MAX_ROWS + 1;
  EXPECT_NE(form_refusal(*t, rows).find("outside the decode band 1..16"), std::string::npos)
      << form_refusal(*t, rows);

  frt_op_desc biased_gated = gated_desc;
  biased_gated.has_bias = 1;
  EXPECT_NE(form_refusal(*t, biased_gated).find("takes no biases"), std::string::npos)
      << form_refusal(*t, biased_gated);
  frt_op_desc gelu_gated = gated_desc;
  gelu_gated.act = FRT_ACT_GELU;
  EXPECT_NE(form_refusal(*t, gelu_gated), "");
  frt_op_desc relu = good;
  relu.act = static_cast<int32_t>(Activation::relu);
  EXPECT_NE(form_refusal(*t, relu), "");

  // The linear package owns the linear op only.
  std::string why;
  const frt_kernel_table* linear = open_variant_library(library("linear", GetParam()), &why);
  ASSERT_NE(linear, nullptr) << why;
  frt_op_desc lin = good;
  lin.op = FRT_OP_LINEAR;
  EXPECT_EQ(form_refusal(*linear, lin), "");
  EXPECT_NE(form_refusal(*linear, good).find("provides no ffn op"), std::string::npos)
      << form_refusal(*linear, good);
}

INSTANTIATE_TEST_SUITE_P(Variants, FfnKernel, ::testing::ValuesIn(kAmxIsas));

// The packers' own error is the format's: int8 per channel within half a step of 1/127 of the
// channel's max; int4 within half a step of its group's range.
TEST(Pack, RoundTripErrorIsWithinTheFormatsStep) {
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> w = random_weight(70, 256, rng);
  const TensorView v = TensorView::matrix(w.data(), DType::f32, 70, 256, 256);
  const PackedLinear p8 = PackedLinear::int8(v);
  EXPECT_LT(p8.stats().rel_err, 0.01);
  const std::vector<float> d8 = p8.dequantize();
  for (int64_t c = 0; c < 70; ++c) {
    float amax = 0;
    for (int64_t i = 0; i < 256; ++i) amax = std::max(amax, std::fabs(w[c * 256 + i]));
    for (int64_t i = 0; i < 256; ++i)
      ASSERT_LE(std::fabs(w[c * 256 + i] - d8[c * 256 + i]), amax / 127 * 0.5 + 1e-7);
  }
  for (bool sym : {true, false}) {
    const PackedLinear p4 = PackedLinear::int4(v, 32, sym);
    EXPECT_LT(p4.stats().rel_err, 0.15) << (sym ? "sym" : "asym");
    EXPECT_GT(p4.stats().rel_err, p8.stats().rel_err);
    EXPECT_LE(p4.stats().max_abs_err, 0.05 * 6 / (sym ? 7.0 : 15.0) * 2);
  }
}

TEST(Pack, RefusesBadWeights) {
  std::vector<float> w(64 * 100, 0.5f);
  EXPECT_THROW(PackedLinear::int4(TensorView::matrix(w.data(), DType::f32, 64, 100, 100), 32, true),
               InvalidArgument);
  EXPECT_THROW(PackedLinear::int4(TensorView::matrix(w.data(), DType::f32, 50, 128, 128), 48, true),
               InvalidArgument);
  w[77] = std::nanf("");
  try {
    PackedLinear::int8(TensorView::matrix(w.data(), DType::f32, 64, 100, 100));
    FAIL() << "a NaN weight was packed";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("[0, 77]"), std::string::npos) << e.what();
  }
  EXPECT_THROW(PackedLinear::int8(TensorView{}), InvalidArgument);
}

TEST(Pack, ConstantAndZeroChannelsAreExact) {
  std::vector<float> w(32 * 64, 0.0f);
  for (int64_t i = 0; i < 64; ++i) w[64 + i] = 0.25f;  // channel 1 constant, others zero
  const TensorView v = TensorView::matrix(w.data(), DType::f32, 32, 64, 64);
  for (const PackedLinear& p :
       {PackedLinear::int8(v), PackedLinear::int4(v, 32, true), PackedLinear::int4(v, 64, false)})
    EXPECT_LT(p.stats().max_abs_err, 1e-7) << p.form();
}

TEST(Pack, ReadsStridedBf16Weights) {
  // A transposed bf16 view (strides (1, n)): the packer reads any strides once, at bind time.
  std::mt19937_64 rng(fresh_seed());
  const int64_t n = 48, k = 64;
  std::vector<float> dense = random_weight(n, k, rng);
  std::vector<uint16_t> t(k * n);
  for (int64_t c = 0; c < n; ++c)
    for (int64_t i = 0; i < k; ++i) {
      float v = to_bf16_value(dense[c * k + i]);
      dense[c * k + i] = v;
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      t[i * n + c] = static_cast<uint16_t>(bits >> 16);
    }
  TensorView view;
  view.data = t.data();
  view.dtype = DType::bf16;
  view.rank = 2;
  view.shape = {n, k, 0, 0};
  view.strides = {1, n, 0, 0};
  const PackedLinear a = PackedLinear::int8(view);
  const PackedLinear b = PackedLinear::int8(TensorView::matrix(dense.data(), DType::f32, n, k, k));
  EXPECT_EQ(a.dequantize(), b.dequantize());
}

TEST(Bandwidth, MeasuresAPositiveReadRate) {
  const double gbps = measure_read_bandwidth(64 << 20, 2, 2);
  EXPECT_GT(gbps, 0.5);
  EXPECT_THROW(measure_read_bandwidth(10, 1, 1), InvalidArgument);
}

}  // namespace
}  // namespace frt
