// flashrt/gemm (the w8a8 linear for many rows) in every variant this CPU runs: against a float64
// reference computed from the format's and the row quantization's definitions (frt_kernel_abi.h,
// FRT_W_INT8_GEMM), odd widths and panel tails included; against the unquantized product (the
// error the form costs); variants and thread counts bitwise; refusals with their reasons.
#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/cpu_features.h>
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/pack.h>
#include <gtest/gtest.h>

#include <algorithm>
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

const frt_kernel_table* open_gemm(const std::string& isa, std::string* skip) {
  return ktest::open_variant("gemm", isa, skip);
}

// The row quantization by its definition (frt_kernel_abi.h): fp32 arithmetic, then dequantized
// values (u - z) * s in float64.
std::vector<double> quantized_row(const float* x, int64_t k) {
  float lo = 0, hi = 0;
  for (int64_t i = 0; i < k; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
  float s = (hi - lo) / 127.0f;
  if (!(s > 0)) s = 1.0f;
  const float inv = 1.0f / s;
  const float z = std::clamp(std::nearbyint(-lo * inv), 0.0f, 127.0f);
  std::vector<double> out(k);
  for (int64_t i = 0; i < k; ++i) {
    const float u = std::clamp(std::nearbyint(x[i] * inv) + z, 0.0f, 127.0f);
    out[i] = (static_cast<double>(u) - z) * s;
  }
  return out;
}

// The decode form's block quantization by its definition (Note [W8A8 blocks]): per 32 inputs
// d = amax / 127, a = nearbyint(x * (127 / amax)); dequantized values a * d in float64.
std::vector<double> quantized_blocks(const float* x, int64_t k) {
  std::vector<double> out(k);
  for (int64_t b = 0; b < k; b += 32) {
    const int64_t e = std::min(k, b + 32);
    float amax = 0;
    for (int64_t i = b; i < e; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float inv = amax > 0 ? 127.0f / amax : 0.0f, d = amax / 127.0f;
    for (int64_t i = b; i < e; ++i)
      out[i] = static_cast<double>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f)) * d;
  }
  return out;
}

// W[c][i] = q * scale[c] read from the int8_gemm layout itself.
std::vector<double> dequant_gemm(const frt_packed_weight& w) {
  const int64_t kq = (w.k + 3) / 4;
  std::vector<double> out(w.n * w.k);
  for (int64_t c = 0; c < w.n; ++c) {
    const int64_t p = c / FRT_PANEL, j = c % FRT_PANEL;
    double sum = 0;
    for (int64_t i = 0; i < w.k; ++i) {
      const int8_t q =
          static_cast<const int8_t*>(w.qdata)[((p * kq + i / 4) * FRT_PANEL + j) * 4 + i % 4];
      sum += q;
      out[c * w.k + i] = static_cast<double>(q) * static_cast<const float*>(w.scales)[c];
    }
    EXPECT_EQ(sum, static_cast<double>(static_cast<const float*>(w.mins)[c]))
        << "column sum of channel " << c;
  }
  return out;
}

struct Case {
  int64_t m, k, n;
};
// Odd and tail widths (k not a multiple of 4, n not of FRT_PANEL), row tails (m % 4), one row.
const std::vector<Case> kCases = {{1, 4, 1},      {3, 5, 17},    {5, 7, 33},     {4, 3, 16},
                                  {17, 129, 100}, {64, 256, 48}, {33, 1152, 40}, {9, 4608, 20}};

class GemmKernel : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmKernel, MatchesFloat64ReferenceEveryShapeDtypeAndBias) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const Case& c : kCases)
    for (DType xd : {DType::f32, DType::bf16})
      for (DType yd : {DType::f32, DType::bf16})
        for (bool with_bias : {false, true}) {
          std::vector<float> w = random_weight(c.n, c.k, rng);
          const PackedLinear packed =
              PackedLinear::int8_gemm(TensorView::matrix(w.data(), DType::f32, c.n, c.k, c.k));
          ASSERT_EQ(packed.format(), WeightFormat::int8_gemm);
          const std::vector<double> wd = dequant_gemm(packed.view());
          std::vector<float> bias(c.n);
          for (float& b : bias) b = std::normal_distribution<float>(0, 1)(rng);
          Rows x(xd, c.m, c.k, c.k + 3, rng, with_bias ? 0.5f : -0.25f);  // skewed rows: z != 64
          Out y(yd, c.m, c.n);
          run_linear(*t, pool, packed, with_bias ? bias.data() : nullptr, x.view(), y.view());
          double dot = 0, g2 = 0, e2 = 0;
          for (int64_t r = 0; r < c.m; ++r) {
            const std::vector<double> xq = quantized_row(x.row(r), c.k);
            for (int64_t col = 0; col < c.n; ++col) {
              double want = with_bias ? bias[col] : 0.0, mag = std::fabs(want), exact = want;
              for (int64_t i = 0; i < c.k; ++i) {
                want += xq[i] * wd[col * c.k + i];
                mag += std::fabs(xq[i] * wd[col * c.k + i]);
                exact += x.value[r * c.k + i] * w[col * c.k + i];
              }
              const double got = y.at(r, col);
              const double tol = 2e-6 * mag + (yd == DType::bf16 ? std::fabs(want) / 128 : 0);
              ASSERT_NEAR(got, want, tol + 1e-6)
                  << "m" << c.m << " k" << c.k << " n" << c.n << " x " << name_of(xd) << " y "
                  << name_of(yd) << " [" << r << "," << col << "]";
              dot += got * exact, g2 += got * got, e2 += exact * exact;
            }
            for (int64_t col = c.n; col < y.ld; ++col)
              ASSERT_TRUE(y.gap_untouched(r, col)) << "wrote past the row at " << col;
          }
          if (c.k >= 128) {  // what the form costs against the unquantized product
            EXPECT_GE(dot / std::sqrt(g2 * e2), 0.999) << "m" << c.m << " k" << c.k;
          }
        }
}

TEST_P(GemmKernel, OneAndTwoThreadsAndTheGenericVariantAgreeBitwise) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::string none;
  const frt_kernel_table* generic = open_gemm("generic", &none);
  ASSERT_NE(generic, nullptr);
  ThreadPool pool(2);
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> w = random_weight(200, 301, rng);
  const PackedLinear packed =
      PackedLinear::int8_gemm(TensorView::matrix(w.data(), DType::f32, 200, 301, 301));
  std::vector<float> bias(200, 0.25f);
  Rows x(DType::f32, 37, 301, 301 + 3, rng, 0.1f);
  Out a(DType::f32, 37, 200), b(DType::f32, 37, 200), g(DType::f32, 37, 200);
  run_linear(*t, pool, packed, bias.data(), x.view(), a.view(), 1);
  run_linear(*t, pool, packed, bias.data(), x.view(), b.view(), 2);
  run_linear(*generic, pool, packed, bias.data(), x.view(), g.view(), 2);
  EXPECT_EQ(0, std::memcmp(a.f32.data(), b.f32.data(), a.f32.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.f32.data(), g.f32.data(), a.f32.size() * 4));
}

// Many rows (the amx build's tiles take rows past 16 in blocks of about 1 MiB of quantized rows,
// sixteen at a time, panels in pairs; the rest on the 4-row tiles): several row blocks, a
// 16-row chunk, a row tail and an odd panel count per thread, bf16 in and out, rows with a NaN
// and an infinity (their outputs NaN, and only theirs), a row of zeros whose outputs are the
// bias, some of it denormal (bf16 keeps those: the amx build's vcvtneps2bf16 would flush them;
// the first and third shapes put that row on the tiles), on 1 and 2 threads, bitwise against the
// generic variant.
TEST_P(GemmKernel, ManyRowsAgreeBitwiseWithTheGenericVariant) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::string none;
  const frt_kernel_table* generic = open_gemm("generic", &none);
  ASSERT_NE(generic, nullptr);
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // k = 4001: 1001 quads, a partial last step (the B tail copy) under two A tiles in tile order;
  // the second shape's rows are too wide for tile order (kGemmAmxTiledMaxLda): row-major tiles;
  // the third splits its rows into blocks of unequal size on one thread (Note [AMX row split])
  // and shares the panels on two, once in bf16 and once in f32.
  struct Many {
    Case c;
    DType dt;
  };
  for (const auto& [c, dt] :
       {Many{{16 * 37 + 7, 4001, 5 * 16 + 3}, DType::bf16}, Many{{40, 16389, 21}, DType::bf16},
        Many{{16 * 20 + 5, 1000, 70}, DType::bf16}, Many{{16 * 20 + 5, 1000, 70}, DType::f32}}) {
    SCOPED_TRACE("m" + std::to_string(c.m) + " k" + std::to_string(c.k) + " " + name_of(dt));
    std::vector<float> w = random_weight(c.n, c.k, rng);
    const PackedLinear packed =
        PackedLinear::int8_gemm(TensorView::matrix(w.data(), DType::f32, c.n, c.k, c.k));
    std::vector<float> bias(c.n);
    for (float& b : bias) b = std::normal_distribution<float>(0, 1)(rng);
    const float denormal[] = {1e-39f, -2.5e-39f, 4e-40f};
    for (int i = 0; i < 3; ++i) bias[3 + i] = denormal[i];
    Rows x(dt, c.m, c.k, c.k + 5, rng, 0.3f);
    x.set(20, 7, std::numeric_limits<float>::quiet_NaN());
    x.set(33, c.k - 1, std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < c.k; ++i) x.set(36, i, 0.0f);
    Out a(dt, c.m, c.n), b(dt, c.m, c.n), g(dt, c.m, c.n);
    run_linear(*t, pool, packed, bias.data(), x.view(), a.view(), 1);
    run_linear(*t, pool, packed, bias.data(), x.view(), b.view(), 2);
    run_linear(*generic, pool, packed, bias.data(), x.view(), g.view(), 2);
    EXPECT_TRUE(a.same_bits(b));
    EXPECT_TRUE(a.same_bits(g));
    for (int64_t r : {int64_t{19}, int64_t{20}, int64_t{33}})
      for (int64_t col = 0; col < c.n; ++col)
        EXPECT_EQ(std::isnan(a.at(r, col)), r != 19) << "row " << r << " column " << col;
    for (int i = 0; i < 3; ++i) {
      Out want(dt, 1, 1);
      EXPECT_EQ(a.at(36, 3 + i), want.set(0, 0, denormal[i])) << "column " << 3 + i;
      EXPECT_NE(a.at(36, 3 + i), 0.0) << "column " << 3 + i;
    }
  }
}

TEST_P(GemmKernel, ConstantAndZeroRowsAreExactAndNonFiniteRowsStayNonFinite) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> w = random_weight(24, 64, rng);
  const PackedLinear packed =
      PackedLinear::int8_gemm(TensorView::matrix(w.data(), DType::f32, 24, 64, 64));
  Rows x(DType::f32, 2, 64, 64 + 3, rng, 0.0f);
  for (int64_t i = 0; i < 64; ++i) x.f32[i] = 0.0f;  // row 0: zeros
  x.f32[x.ld + 3] = std::numeric_limits<float>::infinity();
  Out y(DType::f32, 2, 24);
  run_linear(*t, pool, packed, nullptr, x.view(), y.view());
  for (int64_t c = 0; c < 24; ++c) EXPECT_EQ(y.at(0, c), 0.0);
  // A row holding inf has no finite scale: every output of it is NaN, never a finite guess.
  for (int64_t c = 0; c < 24; ++c) EXPECT_TRUE(std::isnan(y.at(1, c))) << c;
  x.f32[x.ld + 3] = std::nanf("");
  run_linear(*t, pool, packed, nullptr, x.view(), y.view());
  for (int64_t c = 0; c < 24; ++c) EXPECT_TRUE(std::isnan(y.at(1, c))) << c;
}

TEST_P(GemmKernel, RefusesFormsOutsideItsContract) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(1);
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> w = random_weight(32, 64, rng);
  const TensorView wv = TensorView::matrix(w.data(), DType::f32, 32, 64, 64);
  Rows x(DType::f32, 8, 64, 64 + 3, rng, 0.0f);
  Out y(DType::f32, 8, 32);
  // The decode linear's layout is not this op's.
  const PackedLinear int8 = PackedLinear::int8(wv);
  const std::string why = linear_refusal(*t, int8, x.view(), y.view());
  EXPECT_NE(why.find("takes int8_gemm"), std::string::npos) << why;
  EXPECT_THROW(run_linear(*t, pool, int8, nullptr, x.view(), y.view()), Refused);
  // A width the input does not have.
  const PackedLinear packed = PackedLinear::int8_gemm(wv);
  Rows narrow(DType::f32, 8, 63, 63 + 3, rng, 0.0f);
  EXPECT_NE(linear_refusal(*t, packed, narrow.view(), y.view()).find("width 63"),
            std::string::npos);
  // Plan time: the form, the widths and the dtypes.
  frt_op_desc d{};
  d.op = FRT_OP_LINEAR;
  d.wformat = FRT_W_INT8_GEMM;
  d.n = 32;
  d.k = 64;
  d.rows_max = int64_t{1} << 62;
  EXPECT_EQ(form_refusal(*t, d), "");
  d.k = 200000;
  EXPECT_NE(form_refusal(*t, d).find("outside"), std::string::npos);
  d.k = 64;
  d.wformat = FRT_W_INT8_CHANNEL;
  EXPECT_NE(form_refusal(*t, d).find("takes int8_gemm"), std::string::npos);
  d.wformat = FRT_W_INT8_GEMM;
  d.op = FRT_OP_GATED_FFN;
  EXPECT_NE(form_refusal(*t, d).find("provides no"), std::string::npos);
}

// The decode forms' common check: the variant on 2 and 1 threads and the generic variant write
// the same bits, and each output is within `tol` (relative to the sum of |terms|) of the float64
// product of the block-quantized activations (quantized_blocks) and the weights `wd`.
void expect_blocks_bitwise_and_near(const frt_kernel_table& t, const frt_kernel_table& generic,
                                    ThreadPool& pool, const PackedLinear& packed,
                                    const std::vector<double>& wd, const float* bias, Rows& x,
                                    const Case& c, double tol) {
  Out y(DType::f32, c.m, c.n), y1(DType::f32, c.m, c.n), g(DType::f32, c.m, c.n);
  run_linear(t, pool, packed, bias, x.view(), y.view());
  run_linear(t, pool, packed, bias, x.view(), y1.view(), 1);
  run_linear(generic, pool, packed, bias, x.view(), g.view(), 2);
  ASSERT_EQ(0, std::memcmp(y.f32.data(), y1.f32.data(), y.f32.size() * 4));
  ASSERT_EQ(0, std::memcmp(y.f32.data(), g.f32.data(), y.f32.size() * 4));
  for (int64_t r = 0; r < c.m; ++r) {
    const std::vector<double> xq = quantized_blocks(x.row(r), c.k);
    for (int64_t col = 0; col < c.n; ++col) {
      double want = bias != nullptr ? bias[col] : 0.0, mag = std::fabs(want);
      for (int64_t i = 0; i < c.k; ++i) {
        want += xq[i] * wd[col * c.k + i];
        mag += std::fabs(xq[i] * wd[col * c.k + i]);
      }
      ASSERT_NEAR(y.at(r, col), want, tol * mag + 1e-6)
          << "m" << c.m << " k" << c.k << " n" << c.n << " [" << r << "," << col << "]";
      ASSERT_TRUE(y.gap_untouched(r, c.n)) << "wrote past n";
    }
  }
}

// The decode form: activations per block of 32 (the pack's group), against float64 for every
// shape (partial last blocks included), dtype and bias, and bitwise across threads and variants.
TEST_P(GemmKernel, ActivationBlocksMatchFloat64AndAgreeBitwise) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::string none;
  const frt_kernel_table* generic = open_gemm("generic", &none);
  ASSERT_NE(generic, nullptr);
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const Case& c : kCases)
    for (DType xd : {DType::f32, DType::bf16})
      for (bool with_bias : {false, true}) {
        std::vector<float> w = random_weight(c.n, c.k, rng);
        const PackedLinear packed = PackedLinear::int8_gemm(
            TensorView::matrix(w.data(), DType::f32, c.n, c.k, c.k), /*act_block=*/32);
        ASSERT_EQ(packed.view().group, 32);
        const std::vector<double> wd = dequant_gemm(packed.view());
        std::vector<float> bias(c.n);
        for (float& b : bias) b = std::normal_distribution<float>(0, 1)(rng);
        Rows x(xd, c.m, c.k, c.k + 3, rng, 0.0f);
        x.set(0, 0, 40.0f);  // an outlier: only its own block's scale may feel it
        expect_blocks_bitwise_and_near(*t, *generic, pool, packed, wd,
                                       with_bias ? bias.data() : nullptr, x, c, 2e-6);
      }
}

TEST_P(GemmKernel, ActivationBlocksNonFiniteRowsComeOutNaNAndOnlyThatRow) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> w = random_weight(24, 100, rng);
  const PackedLinear packed =
      PackedLinear::int8_gemm(TensorView::matrix(w.data(), DType::f32, 24, 100, 100), 32);
  Rows x(DType::f32, 3, 100, 100 + 3, rng, 0.0f);
  for (int64_t i = 0; i < 100; ++i) x.f32[i] = 0.0f;          // row 0: zeros
  x.f32[x.ld + 99] = std::numeric_limits<float>::infinity();  // in the partial last block
  Out y(DType::f32, 3, 24);
  run_linear(*t, pool, packed, nullptr, x.view(), y.view());
  for (int64_t c = 0; c < 24; ++c) {
    EXPECT_EQ(y.at(0, c), 0.0);
    EXPECT_TRUE(std::isnan(y.at(1, c))) << c;
    EXPECT_TRUE(std::isfinite(y.at(2, c))) << c;
  }
  EXPECT_THROW(PackedLinear::int8_gemm(TensorView::matrix(w.data(), DType::f32, 24, 100, 100), 16),
               InvalidArgument);
  // Plan time: blocks other than 32 are refused, and the ffn op takes only per-row activations.
  frt_op_desc d{};
  d.op = FRT_OP_LINEAR;
  d.wformat = FRT_W_INT8_GEMM;
  d.n = 24;
  d.k = 100;
  d.rows_max = 16;
  d.group = 32;
  EXPECT_EQ(form_refusal(*t, d), "");
  d.group = 64;
  EXPECT_NE(form_refusal(*t, d).find("activation blocks of 64"), std::string::npos);
  d.group = 32;
  d.op = FRT_OP_FFN;
  d.inner = 24;
  d.n = 100;
  d.act = FRT_ACT_GELU;
  EXPECT_NE(form_refusal(*t, d).find("per row only"), std::string::npos) << form_refusal(*t, d);
}

// W[c][i] read from the int4_gemm layout by its definition (frt_kernel_abi.h, FRT_W_INT4_GEMM).
std::vector<double> dequant_int4_gemm(const frt_packed_weight& w) {
  std::vector<double> out(w.n * w.k);
  const auto* q = static_cast<const uint8_t*>(w.qdata);
  const auto* sc = static_cast<const uint16_t*>(w.scales);
  const auto* mn = static_cast<const uint16_t*>(w.mins);
  for (int64_t c = 0; c < w.n; ++c) {
    const int64_t p = c / FRT_PANEL, j = c % FRT_PANEL;
    for (int64_t i = 0; i < w.k; ++i) {
      const uint8_t byte = q[((p * (w.k / 8) + i / 8) * FRT_PANEL + j) * 4 + i % 4];
      const int nib = i % 8 < 4 ? (byte & 0x0f) : (byte >> 4);
      const int64_t at = (p * (w.k / 32) + i / 32) * FRT_PANEL + j;
      const double s = frt_f16_to_f32(sc[at]);
      out[c * w.k + i] = mn == nullptr ? (nib - 8) * s : nib * s + frt_f16_to_f32(mn[at]);
    }
  }
  return out;
}

// The int4 decode form (Note [W4A8]): nibbles in groups of 32 against activation blocks of 32,
// symmetric and with mins, against float64 for every shape, dtype and bias; the same values
// PackedLinear::int4 holds; bitwise across threads and variants.
TEST_P(GemmKernel, Int4BlocksMatchFloat64AndAgreeBitwise) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::string none;
  const frt_kernel_table* generic = open_gemm("generic", &none);
  ASSERT_NE(generic, nullptr);
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<Case> cases = {{1, 32, 1},     {3, 64, 17},   {5, 96, 33},   {4, 32, 16},
                                   {17, 128, 100}, {16, 256, 48}, {6, 1024, 40}, {9, 4608, 20}};
  for (const Case& c : cases)
    for (bool symmetric : {true, false})
      for (DType xd : {DType::f32, DType::bf16})
        for (bool with_bias : {false, true}) {
          std::vector<float> w = random_weight(c.n, c.k, rng);
          const TensorView wv = TensorView::matrix(w.data(), DType::f32, c.n, c.k, c.k);
          const PackedLinear packed = PackedLinear::int4_gemm(wv, symmetric);
          ASSERT_EQ(packed.format(), WeightFormat::int4_gemm);
          ASSERT_EQ(packed.view().mins == nullptr, symmetric);
          const std::vector<double> wd = dequant_int4_gemm(packed.view());
          const std::vector<float> same =
              PackedLinear::int4(wv, 32, symmetric, DType::f16).dequantize();
          ASSERT_EQ(packed.dequantize(), same);
          for (size_t i = 0; i < same.size(); ++i) ASSERT_EQ(wd[i], same[i]) << i;
          std::vector<float> bias(c.n);
          for (float& b : bias) b = std::normal_distribution<float>(0, 1)(rng);
          Rows x(xd, c.m, c.k, c.k + 3, rng, 0.3f);  // a shift: block sums far from zero
          SCOPED_TRACE(symmetric ? "symmetric" : "with mins");
          expect_blocks_bitwise_and_near(*t, *generic, pool, packed, wd,
                                         with_bias ? bias.data() : nullptr, x, c, 4e-6);
        }
}

// The linear op's call-time answer for weight w over rows x into y: its refusal message, or ""
// when it takes the call.
std::string call_refusal(const frt_kernel_table& t, const frt_packed_weight& w, Rows& x, Out& y) {
  frt_linear_args a{};
  a.x_dtype = a.y_dtype = FRT_F32;
  a.m = x.m;
  a.w = &w;
  a.x = x.f32.data();
  a.ldx = x.ld;
  a.y = y.f32.data();
  a.ldy = y.ld;
  for (int32_t i = 0; i < t.n_ops; ++i) {
    if (t.ops[i].kind != FRT_OP_LINEAR) continue;
    frt_error err{};
    return t.ops[i].supports(&a, &err) == FRT_REASON_OK ? "" : std::string(err.message);
  }
  return "no linear op";
}

TEST_P(GemmKernel, Int4RefusesWidthsTheGroupDoesNotDivideAndNonFiniteRowsStayInTheirRow) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> w = random_weight(24, 100, rng);
  EXPECT_THROW(
      PackedLinear::int4_gemm(TensorView::matrix(w.data(), DType::f32, 24, 100, 100), true),
      InvalidArgument);
  const PackedLinear packed =
      PackedLinear::int4_gemm(TensorView::matrix(w.data(), DType::f32, 24, 96, 96), false);
  Rows x(DType::f32, 3, 96, 96 + 3, rng, 0.0f);
  for (int64_t i = 0; i < 96; ++i) x.f32[i] = 0.0f;            // row 0: zeros
  x.f32[x.ld + 95] = std::numeric_limits<float>::quiet_NaN();  // row 1: one NaN
  Out y(DType::f32, 3, 24);
  run_linear(*t, pool, packed, nullptr, x.view(), y.view());
  for (int64_t c = 0; c < 24; ++c) {
    EXPECT_EQ(y.at(0, c), 0.0);
    EXPECT_TRUE(std::isnan(y.at(1, c))) << c;
    EXPECT_TRUE(std::isfinite(y.at(2, c))) << c;
  }
  // Plan time: groups of 32 that divide k, for the linear only.
  frt_op_desc d{};
  d.op = FRT_OP_LINEAR;
  d.wformat = FRT_W_INT4_GEMM;
  d.n = 24;
  d.k = 96;
  d.rows_max = 16;
  d.group = 32;
  EXPECT_EQ(form_refusal(*t, d), "");
  d.k = 100;
  EXPECT_NE(form_refusal(*t, d).find("groups of 32 and k a multiple of 32"), std::string::npos)
      << form_refusal(*t, d);
  d.k = 96;
  d.group = 64;
  EXPECT_NE(form_refusal(*t, d).find("groups of 32 and k a multiple of 32"), std::string::npos);
  d.group = 0;  // the ffn op refuses the int4 layout itself, not only its blocks
  d.op = FRT_OP_FFN;
  d.inner = 24;
  d.n = 96;
  d.act = FRT_ACT_GELU;
  EXPECT_NE(form_refusal(*t, d).find("takes int8_gemm"), std::string::npos) << form_refusal(*t, d);
  // Call time: a weight claiming f32 scales (the kernel reads f16 only) is refused, not read.
  frt_packed_weight f32_scales = packed.view();
  f32_scales.scale_dtype = FRT_F32;
  const std::string why = call_refusal(*t, f32_scales, x, y);
  EXPECT_NE(why.find("f16 scales"), std::string::npos) << why;
}

// W[c][i] read from the int4_super_gemm layout by its definition (frt_kernel_abi.h,
// FRT_W_INT4_SUPER_GEMM): the GEMM's nibbles, and q * (d * sc) - dmin * m from the super records.
std::vector<double> dequant_int4_super_gemm(const frt_packed_weight& w) {
  std::vector<double> out(w.n * w.k);
  const auto* q = static_cast<const uint8_t*>(w.qdata);
  const auto* records = static_cast<const uint8_t*>(w.scales);
  for (int64_t c = 0; c < w.n; ++c) {
    const int64_t p = c / FRT_PANEL, j = c % FRT_PANEL;
    for (int64_t i = 0; i < w.k; ++i) {
      const uint8_t byte = q[((p * (w.k / 8) + i / 8) * FRT_PANEL + j) * 4 + i % 4];
      const int nib = i % 8 < 4 ? (byte & 0x0f) : (byte >> 4);
      const uint8_t* rec =
          records + (p * (w.k / FRT_SUPER_K) + i / FRT_SUPER_K) * FRT_SUPER4_RECORD;
      const int64_t g = (i % FRT_SUPER_K) / 32;
      uint16_t d, dmin;
      std::memcpy(&d, rec + 2 * j, 2);
      std::memcpy(&dmin, rec + FRT_SUPER4_DMIN_AT + 2 * j, 2);
      out[c * w.k + i] = nib * (frt_f16_to_f32(d) * rec[FRT_SUPER4_SC_AT + g * FRT_PANEL + j]) -
                         frt_f16_to_f32(dmin) * rec[FRT_SUPER4_M_AT + g * FRT_PANEL + j];
    }
  }
  return out;
}

// GGUF Q4_K's values against activation blocks of 32 (the with-mins sum of Note [W4A8], each
// block's scale and min decoded from its super record): the values PackedLinear::int4_super
// holds, against float64 for every shape, dtype and bias; bitwise across threads and variants.
TEST_P(GemmKernel, Int4SuperBlocksMatchFloat64AndAgreeBitwise) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::string none;
  const frt_kernel_table* generic = open_gemm("generic", &none);
  ASSERT_NE(generic, nullptr);
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<Case> cases = {{1, 256, 1},  {3, 512, 17},  {5, 256, 33},
                                   {4, 768, 16}, {16, 256, 48}, {9, 4096, 20}};
  for (const Case& c : cases)
    for (DType xd : {DType::f32, DType::bf16})
      for (bool with_bias : {false, true}) {
        std::vector<float> w = random_weight(c.n, c.k, rng);
        const TensorView wv = TensorView::matrix(w.data(), DType::f32, c.n, c.k, c.k);
        const PackedLinear packed = PackedLinear::int4_super_gemm(wv);
        ASSERT_EQ(packed.format(), WeightFormat::int4_super_gemm);
        ASSERT_EQ(packed.view().mins, nullptr);
        ASSERT_EQ(packed.dequantize(), PackedLinear::int4_super(wv).dequantize());
        ASSERT_EQ(packed.nbytes(), PackedLinear::int4_super(wv).nbytes());  // 4.625 bits a weight
        const std::vector<double> wd = dequant_int4_super_gemm(packed.view());
        const std::vector<float> same = packed.dequantize();
        for (size_t i = 0; i < same.size(); ++i)
          ASSERT_NEAR(wd[i], same[i], 1e-6 * (std::fabs(wd[i]) + 1e-3)) << i;
        std::vector<float> bias(c.n);
        for (float& b : bias) b = std::normal_distribution<float>(0, 1)(rng);
        Rows x(xd, c.m, c.k, c.k + 3, rng, 0.3f);  // a shift: block sums far from zero
        expect_blocks_bitwise_and_near(*t, *generic, pool, packed, wd,
                                       with_bias ? bias.data() : nullptr, x, c, 4e-6);
      }
}

TEST_P(GemmKernel, Int4SuperRefusesPartialSuperBlocksAndStrayMins) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> w = random_weight(24, 512, rng);
  EXPECT_THROW(
      PackedLinear::int4_super_gemm(TensorView::matrix(w.data(), DType::f32, 24, 288, 288)),
      InvalidArgument);
  // Only the int4 packs the GEMM reads re-lay: an int8 pack, or int4 g64, is refused by name.
  const TensorView wv = TensorView::matrix(w.data(), DType::f32, 24, 512, 512);
  EXPECT_THROW(PackedLinear::gemm_layout(PackedLinear::int8(wv)), InvalidArgument);
  EXPECT_THROW(PackedLinear::gemm_layout(PackedLinear::int4(wv, 64, false, DType::f16)),
               InvalidArgument);
  const PackedLinear packed = PackedLinear::int4_super_gemm(wv);
  // Plan time: groups of 32 in whole super-blocks.
  frt_op_desc d{};
  d.op = FRT_OP_LINEAR;
  d.wformat = FRT_W_INT4_SUPER_GEMM;
  d.n = 24;
  d.k = 512;
  d.rows_max = 16;
  d.group = 32;
  EXPECT_EQ(form_refusal(*t, d), "");
  d.k = 288;
  EXPECT_NE(form_refusal(*t, d).find("int4_super_gemm weight 24x288 in groups of 32; takes groups "
                                     "of 32 and k a multiple of 256"),
            std::string::npos)
      << form_refusal(*t, d);
  d.op = FRT_OP_MOE_FFN;
  d.inner = 24;
  d.n = 512;
  d.experts = 4;
  d.top_k = 2;
  d.act = FRT_ACT_SILU;
  EXPECT_NE(form_refusal(*t, d).find("not a multiple of 256"), std::string::npos)
      << form_refusal(*t, d);
  // Call time: a weight claiming mins beside its records is refused, not read.
  frt_packed_weight stray = packed.view();
  stray.mins = packed.view().scales;
  Rows x(DType::f32, 3, 512, 512, rng, 0.0f);
  Out y(DType::f32, 3, 24);
  const std::string why = call_refusal(*t, stray, x, y);
  EXPECT_NE(why.find("with mins"), std::string::npos) << why;
  // Rows of zeros stay exact zeros, a row with an infinity goes NaN alone.
  for (int64_t i = 0; i < 512; ++i) x.f32[i] = 0.0f;
  x.f32[x.ld + 300] = std::numeric_limits<float>::infinity();
  run_linear(*t, pool, packed, nullptr, x.view(), y.view());
  for (int64_t c = 0; c < 24; ++c) {
    EXPECT_EQ(y.at(0, c), 0.0);
    EXPECT_TRUE(std::isnan(y.at(1, c))) << c;
    EXPECT_TRUE(std::isfinite(y.at(2, c))) << c;
  }
}

// W[c][i] read from the int6_super_gemm layout by its definition (frt_kernel_abi.h,
// FRT_W_INT6_SUPER_GEMM): u from the nibble and its plane's two bits, (u - 32) * (d * sc).
std::vector<double> dequant_int6_super_gemm(const frt_packed_weight& w) {
  std::vector<double> out(w.n * w.k);
  const auto* q = static_cast<const uint8_t*>(w.qdata);
  const auto* records = static_cast<const uint8_t*>(w.scales);
  for (int64_t c = 0; c < w.n; ++c) {
    const int64_t p = c / FRT_PANEL, j = c % FRT_PANEL;
    for (int64_t i = 0; i < w.k; ++i) {
      const uint8_t* block = q + (p * (w.k / 32) + i / 32) * FRT_INT6_BLOCK;
      const int64_t t = (i % 32) / 8, l = i % 4;
      const bool second = i % 8 >= 4;
      const int low = (block[64 * t + 4 * j + l] >> (second ? 4 : 0)) & 15;
      const int top = (block[FRT_INT6_PLANES_AT + (second ? 64 : 0) + 4 * j + l] >> (2 * t)) & 3;
      const uint8_t* rec =
          records + (p * (w.k / FRT_SUPER_K) + i / FRT_SUPER_K) * FRT_SUPER8_RECORD;
      uint16_t d;
      std::memcpy(&d, rec + 2 * j, 2);
      const int8_t sc = static_cast<int8_t>(rec[FRT_SUPER8_SC_AT + ((i % 256) / 16) * 16 + j]);
      out[c * w.k + i] = ((low | top << 4) - 32) * (static_cast<double>(frt_f16_to_f32(d)) * sc);
    }
  }
  return out;
}

// GGUF Q6_K's values in six bits against activation blocks of 32 (Note [W6A8]): the values
// PackedLinear::int8_super holds at 6.5625 bits a weight, against float64 for every shape, dtype
// and bias; bitwise across threads and variants.
TEST_P(GemmKernel, Int6SuperBlocksMatchFloat64AndAgreeBitwise) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::string none;
  const frt_kernel_table* generic = open_gemm("generic", &none);
  ASSERT_NE(generic, nullptr);
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<Case> cases = {{1, 256, 1},  {3, 512, 17},  {5, 256, 33},
                                   {4, 768, 16}, {16, 256, 48}, {9, 4096, 20}};
  for (const Case& c : cases)
    for (DType xd : {DType::f32, DType::bf16})
      for (bool with_bias : {false, true}) {
        std::vector<float> w = random_weight(c.n, c.k, rng);
        const TensorView wv = TensorView::matrix(w.data(), DType::f32, c.n, c.k, c.k);
        const PackedLinear packed = PackedLinear::int6_super_gemm(wv);
        const PackedLinear bytes = PackedLinear::int8_super(wv);
        ASSERT_EQ(packed.format(), WeightFormat::int6_super_gemm);
        ASSERT_EQ(packed.view().mins, nullptr);
        ASSERT_EQ(packed.dequantize(), bytes.dequantize());
        // Six bits a value where int8_super holds eight, the same records.
        const int64_t panels = (c.n + 15) / 16;
        ASSERT_EQ(bytes.nbytes() - packed.nbytes(), panels * c.k * 16 / 4);
        const std::vector<double> wd = dequant_int6_super_gemm(packed.view());
        const std::vector<float> same = packed.dequantize();
        for (size_t i = 0; i < same.size(); ++i) ASSERT_EQ(wd[i], same[i]) << i;
        std::vector<float> bias(c.n);
        for (float& b : bias) b = std::normal_distribution<float>(0, 1)(rng);
        Rows x(xd, c.m, c.k, c.k + 3, rng, 0.3f);  // a shift: group sums far from zero
        expect_blocks_bitwise_and_near(*t, *generic, pool, packed, wd,
                                       with_bias ? bias.data() : nullptr, x, c, 4e-6);
      }
}

TEST_P(GemmKernel, Int6SuperRefusesPartialSuperBlocksOtherGroupsAndStrayMins) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  std::mt19937_64 rng(fresh_seed());
  std::vector<float> w = random_weight(24, 512, rng);
  EXPECT_THROW(
      PackedLinear::int6_super_gemm(TensorView::matrix(w.data(), DType::f32, 24, 288, 288)),
      InvalidArgument);
  const TensorView wv = TensorView::matrix(w.data(), DType::f32, 24, 512, 512);
  const PackedLinear packed = PackedLinear::int6_super_gemm(wv);
  EXPECT_EQ(PackedLinear::gemm_layout(PackedLinear::int8_super(wv)).dequantize(),
            packed.dequantize());
  frt_op_desc d{};
  d.op = FRT_OP_LINEAR;
  d.wformat = FRT_W_INT6_SUPER_GEMM;
  d.n = 24;
  d.k = 512;
  d.rows_max = 16;
  d.group = 16;
  EXPECT_EQ(form_refusal(*t, d), "");
  d.group = 32;  // Q6_K's groups are 16
  EXPECT_NE(form_refusal(*t, d).find("int6_super_gemm weight 24x512 in groups of 32; takes groups "
                                     "of 16 and k a multiple of 256"),
            std::string::npos)
      << form_refusal(*t, d);
  d.group = 16;
  d.k = 288;
  EXPECT_NE(form_refusal(*t, d).find("k a multiple of 256"), std::string::npos);
  // Call time: a weight claiming mins beside its records is refused, not read.
  frt_packed_weight stray = packed.view();
  stray.mins = packed.view().scales;
  Rows x(DType::f32, 3, 512, 512, rng, 0.0f);
  Out y(DType::f32, 3, 24);
  const std::string why = call_refusal(*t, stray, x, y);
  EXPECT_NE(why.find("int6_super_gemm weight with mins"), std::string::npos) << why;
  for (int64_t i = 0; i < 512; ++i) x.f32[i] = 0.0f;
  x.f32[x.ld + 300] = std::numeric_limits<float>::quiet_NaN();
  run_linear(*t, pool, packed, nullptr, x.view(), y.view());
  for (int64_t c = 0; c < 24; ++c) {
    EXPECT_EQ(y.at(0, c), 0.0);
    EXPECT_TRUE(std::isnan(y.at(1, c))) << c;
    EXPECT_TRUE(std::isfinite(y.at(2, c))) << c;
  }
}

// GGUF Q5 parts with random values (u in 0..31, f16 scales and mins, or Q5_K's 6-bit codes under
// f16 d and dmin) adopted as int5_gemm (symmetric: Q5_0, W = (u - 16) * d; with mins: Q5_1,
// W = u * d + m) or int5_super_gemm (Q5_K, W = u * d * sc - dmin * m); `want` gets W by those
// definitions in float64.
PackedLinear int5_pack(WeightFormat f, bool symmetric, int64_t n, int64_t k, std::mt19937_64& rng,
                       std::vector<double>& want) {
  std::vector<int8_t> q(n * k);
  for (int8_t& v : q) v = static_cast<int8_t>(rng() % 32);
  const bool super = f == WeightFormat::int5_super_gemm;
  std::vector<uint16_t> scales(n * k / 32), mins(n * k / 32), d(n * k / 256), dmin(n * k / 256);
  std::vector<uint8_t> sc(n * k / 32), m(n * k / 32);
  for (size_t g = 0; g < scales.size(); ++g) {
    scales[g] = static_cast<uint16_t>(0x2000 + rng() % 0x800);           // 2^-7 .. 2^-6
    mins[g] = static_cast<uint16_t>(0x8000 | (0x2400 + rng() % 0x800));  // -(2^-6 .. 2^-5)
    sc[g] = static_cast<uint8_t>(rng() % 64);
    m[g] = static_cast<uint8_t>(rng() % 64);
  }
  for (size_t b = 0; b < d.size(); ++b) {
    d[b] = static_cast<uint16_t>(0x1400 + rng() % 0x400);
    dmin[b] = static_cast<uint16_t>(0x1000 + rng() % 0x400);
  }
  QuantizedParts parts;
  parts.format = f;
  parts.group = 32;
  parts.n = n;
  parts.k = k;
  parts.q = q.data();
  parts.scale_dtype = DType::f16;
  if (super) {
    parts.scales = sc.data();
    parts.mins = m.data();
    parts.super_scales = d.data();
    parts.super_mins = dmin.data();
  } else {
    parts.scales = scales.data();
    parts.mins = symmetric ? nullptr : mins.data();
  }
  want.assign(n * k, 0.0);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t g = r * (k / 32) + i / 32, b = r * (k / 256) + i / 256;
      const double u = q[r * k + i];
      if (super)
        want[r * k + i] = u * (static_cast<double>(frt_f16_to_f32(d[b])) * sc[g]) -
                          static_cast<double>(frt_f16_to_f32(dmin[b])) * m[g];
      else if (symmetric)
        want[r * k + i] = (u - 16) * frt_f16_to_f32(scales[g]);
      else
        want[r * k + i] = u * frt_f16_to_f32(scales[g]) + frt_f16_to_f32(mins[g]);
    }
  return PackedLinear::from_quantized(parts);
}

// GGUF Q5_0, Q5_1 and Q5_K values (the w4a8 tiles with a plane of fifth bits, Note [W4A8]):
// the pack holds the checkpoint's values (its dequantized rows against their definitions) at
// 5.5, 6 and 5.625 bits a weight; against float64 for every shape, dtype and bias; bitwise across
// threads and variants.
TEST_P(GemmKernel, Int5BlocksMatchFloat64AndAgreeBitwise) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::string none;
  const frt_kernel_table* generic = open_gemm("generic", &none);
  ASSERT_NE(generic, nullptr);
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const std::vector<Case> cases = {{1, 256, 1},  {3, 512, 17},  {5, 256, 33},
                                   {4, 768, 16}, {16, 256, 48}, {9, 4096, 20}};
  struct Form {
    WeightFormat f;
    bool symmetric;
    double bits;
  };
  for (const Form form :
       {Form{WeightFormat::int5_gemm, true, 5.5}, Form{WeightFormat::int5_gemm, false, 6.0},
        Form{WeightFormat::int5_super_gemm, false, 5.625}})
    for (const Case& c : cases)
      for (DType xd : {DType::f32, DType::bf16}) {
        std::vector<double> want;
        const PackedLinear packed = int5_pack(form.f, form.symmetric, c.n, c.k, rng, want);
        ASSERT_EQ(packed.format(), form.f);
        ASSERT_EQ(packed.symmetric(), form.symmetric);
        const int64_t panels = (c.n + 15) / 16;
        ASSERT_EQ(packed.nbytes() * 8, static_cast<int64_t>(form.bits * panels * 16 * c.k));
        const std::vector<float> got = packed.dequantize();
        for (size_t i = 0; i < got.size(); ++i)
          ASSERT_NEAR(got[i], want[i], 1e-6 * (std::fabs(want[i]) + 1e-3)) << i;
        std::vector<float> bias(c.n);
        for (float& b : bias) b = std::normal_distribution<float>(0, 1)(rng);
        Rows x(xd, c.m, c.k, c.k + 3, rng, 0.3f);
        SCOPED_TRACE(packed.form());
        expect_blocks_bitwise_and_near(*t, *generic, pool, packed, want, bias.data(), x, c, 4e-6);
      }
}

// Many rows in every block layout (the amx build's tiles take rows past 16 in the block forms too,
// Note [AMX blocks]: 16-row groups in passes of rows, the threads sharing the panels, panels in
// pairs and one alone; int6_super_gemm stays on the 4-row tiles): a partial last activation block
// and quad (int8, k = 1001), rows too wide for tile order (k = 16417, read at stride lda), a row
// tail, bf16 in and out, rows with a NaN and an infinity (their outputs NaN, and only theirs), on
// 1 and 2 threads, bitwise against the generic variant.
TEST_P(GemmKernel, BlockFormsManyRowsAgreeBitwiseWithTheGenericVariant) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::string none;
  const frt_kernel_table* generic = open_gemm("generic", &none);
  ASSERT_NE(generic, nullptr);
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct Layout {
    const char* name;
    int64_t k;
    DType dt;
    int64_t m = 16 * 21 + 5, n = 5 * 16 + 3;
  };
  for (const auto& [name, k, dt, m, n] :
       {Layout{"int8 blocks", 1001, DType::bf16}, Layout{"int8 blocks", 1001, DType::f32},
        Layout{"int8 blocks", 16417, DType::bf16, 16 * 2 + 8, 21},
        Layout{"int4 symmetric", 1024, DType::bf16}, Layout{"int4 with mins", 1024, DType::f32},
        Layout{"int4_super", 512, DType::bf16}, Layout{"int5 symmetric", 256, DType::bf16},
        Layout{"int5 with mins", 256, DType::f32}, Layout{"int5_super", 256, DType::bf16},
        Layout{"int6_super", 512, DType::bf16}}) {
    SCOPED_TRACE(std::string(name) + " k" + std::to_string(k) + " " + name_of(dt));
    const std::string form = name;
    std::vector<float> w = random_weight(n, k, rng);
    const TensorView wv = TensorView::matrix(w.data(), DType::f32, n, k, k);
    std::vector<double> unused;
    const PackedLinear packed =
        form == "int8 blocks"      ? PackedLinear::int8_gemm(wv, /*act_block=*/32)
        : form == "int4 symmetric" ? PackedLinear::int4_gemm(wv, true)
        : form == "int4 with mins" ? PackedLinear::int4_gemm(wv, false)
        : form == "int4_super"     ? PackedLinear::int4_super_gemm(wv)
        : form == "int5 symmetric" ? int5_pack(WeightFormat::int5_gemm, true, n, k, rng, unused)
        : form == "int5 with mins" ? int5_pack(WeightFormat::int5_gemm, false, n, k, rng, unused)
        : form == "int5_super" ? int5_pack(WeightFormat::int5_super_gemm, false, n, k, rng, unused)
                               : PackedLinear::int6_super_gemm(wv);
    std::vector<float> bias(n);
    for (float& b : bias) b = std::normal_distribution<float>(0, 1)(rng);
    Rows x(dt, m, k, k + 5, rng, 0.3f);
    x.set(20, 7, std::numeric_limits<float>::quiet_NaN());
    x.set(33, k - 1, std::numeric_limits<float>::infinity());
    Out a(dt, m, n), b(dt, m, n), g(dt, m, n);
    run_linear(*t, pool, packed, bias.data(), x.view(), a.view(), 1);
    run_linear(*t, pool, packed, bias.data(), x.view(), b.view(), 2);
    run_linear(*generic, pool, packed, bias.data(), x.view(), g.view(), 2);
    EXPECT_TRUE(a.same_bits(b));
    EXPECT_TRUE(a.same_bits(g));
    for (int64_t r : {int64_t{19}, int64_t{20}, int64_t{33}})
      for (int64_t col = 0; col < n; ++col)
        EXPECT_EQ(std::isnan(a.at(r, col)), r != 19) << "row " << r << " column " << col;
  }
}

TEST_P(GemmKernel, Int5RefusesValuesOutOfRangeWidthsAndGroupsOutsideItsForm) {
  std::string skip;
  const frt_kernel_table* t = open_gemm(GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::mt19937_64 rng(fresh_seed());
  std::vector<double> want;
  const PackedLinear packed = int5_pack(WeightFormat::int5_gemm, true, 24, 96, rng, want);
  EXPECT_EQ(packed.form(), "int5 g32 symmetric f16 scales, activations int8 per 32");
  std::vector<int8_t> q(24 * 96, 32);  // one past 5 bits
  std::vector<uint16_t> scales(24 * 3, 0x2000);
  QuantizedParts parts;
  parts.format = WeightFormat::int5_gemm;
  parts.group = 32;
  parts.n = 24;
  parts.k = 96;
  parts.q = q.data();
  parts.scale_dtype = DType::f16;
  parts.scales = scales.data();
  try {
    PackedLinear::from_quantized(parts);
    FAIL() << "adopted a value of 32";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("outside int5's 0..31"), std::string::npos) << e.what();
  }
  parts.group = 16;
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);
  parts.format = WeightFormat::int5_super_gemm;  // no codes or super scales
  parts.group = 32;
  EXPECT_THROW(PackedLinear::from_quantized(parts), InvalidArgument);
  frt_op_desc d{};
  d.op = FRT_OP_LINEAR;
  d.wformat = FRT_W_INT5_GEMM;
  d.n = 24;
  d.k = 96;
  d.rows_max = 16;
  d.group = 32;
  EXPECT_EQ(form_refusal(*t, d), "");
  d.wformat = FRT_W_INT5_SUPER_GEMM;
  EXPECT_NE(form_refusal(*t, d).find("int5_super_gemm weight 24x96 in groups of 32; takes groups "
                                     "of 32 and k a multiple of 256"),
            std::string::npos)
      << form_refusal(*t, d);
}

INSTANTIATE_TEST_SUITE_P(Variants, GemmKernel, ::testing::ValuesIn(kAmxIsas));

}  // namespace
}  // namespace frt
