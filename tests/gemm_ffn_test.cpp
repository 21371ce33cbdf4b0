// flashrt/gemm's feed-forward (FRT_OP_FFN over FRT_W_INT8_GEMM) in every variant this CPU runs:
// against a float64 reference built from the definitions (row quantization of x, int8 weights,
// bias, the exact activation, the hidden rows requantized the same way, down with its bias), odd
// widths, row tails and blocks, bf16 in and out; against the unquantized float64 feed-forward (the
// cost of the form); variants and thread counts bitwise; NaN rows; refusals with their reasons.
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
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace frt {
namespace {

using namespace ktest;  // the kernel tests' shared helpers (kernel_test_util.h)

// The row quantization by its definition (frt_kernel_abi.h, FRT_W_INT8_GEMM), the arithmetic in
// T (float: the kernel's own steps, exact for x; double: for the hidden rows, whose fp32 values
// the reference cannot reproduce): the dequantized values (u - z) * s, and s.
template <typename T>
std::vector<double> quantized_row(const std::vector<double>& row, double* scale) {
  T lo = 0, hi = 0;
  for (double v : row) lo = std::min(lo, static_cast<T>(v)), hi = std::max(hi, static_cast<T>(v));
  T s = (hi - lo) / T(127);
  if (!(s > 0)) s = 1;
  const T inv = T(1) / s;
  const T z = std::clamp(std::nearbyint(-lo * inv), T(0), T(127));
  std::vector<double> out(row.size());
  for (size_t i = 0; i < row.size(); ++i)
    out[i] = (static_cast<double>(
                  std::clamp(std::nearbyint(static_cast<T>(row[i]) * inv) + z, T(0), T(127))) -
              static_cast<double>(z)) *
             static_cast<double>(s);
  *scale = static_cast<double>(s);
  return out;
}

double act_exact(Activation act, double g) {
  if (act == Activation::silu) return g / (1.0 + std::exp(-g));
  if (act == Activation::gelu) return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0)));
  return 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
}

// W[c][i] = q * scale[c] from the int8_gemm layout.
std::vector<double> dequant(const frt_packed_weight& w) {
  const int64_t kq = (w.k + 3) / 4;
  std::vector<double> out(w.n * w.k);
  for (int64_t c = 0; c < w.n; ++c)
    for (int64_t i = 0; i < w.k; ++i)
      out[c * w.k + i] =
          static_cast<const int8_t*>(
              w.qdata)[((c / FRT_PANEL * kq + i / 4) * FRT_PANEL + c % FRT_PANEL) * 4 + i % 4] *
          static_cast<double>(static_cast<const float*>(w.scales)[c]);
  return out;
}

std::vector<float> random_vector(int64_t n, float sd, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// A feed-forward's weights: up [inner, k], down [n, inner], fp32 biases.
struct Ffn {
  int64_t k, inner, n;
  std::vector<float> up_w, down_w, up_b, down_b;
  PackedLinear up, down;
  Ffn(int64_t k_, int64_t inner_, int64_t n_, std::mt19937_64& rng)
      : k(k_),
        inner(inner_),
        n(n_),
        up_w(random_vector(inner_ * k_, 1.0f / std::sqrt(static_cast<float>(k_)), rng)),
        down_w(random_vector(n_ * inner_, 1.0f / std::sqrt(static_cast<float>(inner_)), rng)),
        up_b(random_vector(inner_, 0.5f, rng)),
        down_b(random_vector(n_, 0.5f, rng)),
        up(PackedLinear::int8_gemm(TensorView::matrix(up_w.data(), DType::f32, inner_, k_, k_))),
        down(PackedLinear::int8_gemm(
            TensorView::matrix(down_w.data(), DType::f32, n_, inner_, inner_))) {}
  FfnOperands operands(Activation act, bool biases) const {
    FfnOperands f;
    f.up = &up;
    f.down = &down;
    f.up_bias = biases ? up_b.data() : nullptr;
    f.down_bias = biases ? down_b.data() : nullptr;
    f.act = act;
    return f;
  }
};

struct Case {
  int64_t m, k, inner, n;
};
// Odd widths (k, inner not multiples of 4; inner, n not of FRT_PANEL), row tails (m % 4), one
// row, several blocks (m > 32 per thread), DiT-like widths.
const std::vector<Case> kCases = {{1, 4, 16, 1},      {3, 5, 19, 17},    {6, 7, 33, 9},
                                  {37, 129, 100, 65}, {70, 64, 256, 48}, {33, 96, 384, 96}};

// The plan-time form of a GELU feed-forward over the int8_gemm layout.
frt_op_desc ffn_desc(int64_t k, int64_t inner, int64_t n, int64_t rows_max) {
  frt_op_desc d{};
  d.op = FRT_OP_FFN;
  d.wformat = FRT_W_INT8_GEMM;
  d.act = FRT_ACT_GELU;
  d.k = k;
  d.inner = inner;
  d.n = n;
  d.rows_max = rows_max;
  return d;
}

class GemmFfn : public ::testing::TestWithParam<std::string> {};

TEST_P(GemmFfn, MatchesFloat64ReferenceEveryShapeDtypeActivationAndBias) {
  std::string skip;
  const frt_kernel_table* t = open_variant("gemm", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(2);
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  for (const Case& c : kCases)
    for (Activation act : {Activation::gelu, Activation::gelu_tanh, Activation::silu})
      for (DType dt : {DType::f32, DType::bf16})
        for (bool biases : {false, true}) {
          const Ffn f(c.k, c.inner, c.n, rng);
          const std::vector<double> up = dequant(f.up.view()), down = dequant(f.down.view());
          Rows x(dt, c.m, c.k, c.k + 3, rng, biases ? 0.3f : -0.2f);
          Out y(dt, c.m, c.n);
          run_ffn(*t, pool, f.operands(act, biases), x.view(), y.view());
          double dot = 0, g2 = 0, e2 = 0;
          for (int64_t r = 0; r < c.m; ++r) {
            std::vector<double> xr(c.k), h(c.inner), h_exact(c.inner);
            for (int64_t i = 0; i < c.k; ++i) xr[i] = x.at(r, i);
            double sx;
            const std::vector<double> xq = quantized_row<float>(xr, &sx);
            for (int64_t j = 0; j < c.inner; ++j) {
              double pre = biases ? f.up_b[j] : 0.0, exact = pre;
              for (int64_t i = 0; i < c.k; ++i) {
                pre += xq[i] * up[j * c.k + i];
                exact += xr[i] * f.up_w[j * c.k + i];
              }
              h[j] = act_exact(act, pre);
              h_exact[j] = act_exact(act, exact);
            }
            double sh;
            const std::vector<double> hq = quantized_row<double>(h, &sh);
            for (int64_t col = 0; col < c.n; ++col) {
              double want = biases ? f.down_b[col] : 0.0, mag = std::fabs(want), exact = want;
              double wmax = 0;
              for (int64_t j = 0; j < c.inner; ++j) {
                want += hq[j] * down[col * c.inner + j];
                mag += std::fabs(h[j] * down[col * c.inner + j]);
                exact += h_exact[j] * f.down_w[col * c.inner + j];
                wmax = std::max(wmax, std::fabs(down[col * c.inner + j]));
              }
              // fp32 epilogues and the activation's 1.5e-7 put h a few ulps from the reference's,
              // which can move a hidden element across a rounding tie: one quantum each, allowed
              // twice per row; bf16 output adds its own rounding.
              const double tol = 1e-5 * mag + 2 * sh * wmax +
                                 (dt == DType::bf16 ? std::fabs(want) / 128 : 0.0) + 1e-6;
              const double got = y.at(r, col);
              ASSERT_NEAR(got, want, tol)
                  << "m" << c.m << " k" << c.k << " inner" << c.inner << " n" << c.n << " "
                  << name_of(act) << " " << name_of(dt) << " [" << r << "," << col << "]";
              dot += got * exact, g2 += got * got, e2 += exact * exact;
            }
            for (int64_t col = c.n; col < y.ld; ++col)
              ASSERT_TRUE(y.gap_untouched(r, col)) << "wrote past the row at " << col;
          }
          if (c.k >= 64 && c.inner >= 256) {  // what the form costs against the exact FFN
            EXPECT_GE(dot / std::sqrt(g2 * e2), 0.999)
                << "m" << c.m << " k" << c.k << " " << name_of(act) << " " << name_of(dt);
          }
        }
}

TEST_P(GemmFfn, ThreadCountsAndTheGenericVariantAgreeBitwiseNaNRowsIncluded) {
  std::string skip;
  const frt_kernel_table* t = open_variant("gemm", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  std::string none;
  const frt_kernel_table* generic = open_variant("gemm", "generic", &none);
  ASSERT_NE(generic, nullptr);
  ThreadPool pool(3);
  std::mt19937_64 rng(fresh_seed());
  const Ffn f(301, 203, 150, rng);
  for (DType dt : {DType::f32, DType::bf16})
    for (Activation act : {Activation::silu, Activation::gelu, Activation::gelu_tanh}) {
      for (const int64_t m : {int64_t{301}, int64_t{50}}) {
        // 301 rows: on the amx variant, blocks of up to 128 rows on the tiles and their tails on
        // the 4-row tiles, however the threads split them; 50 rows: blocks of 17..31 rows (one
        // 16-row tile, the rest on the 4-row tiles).
        Rows x(dt, m, 301, 301 + 3, rng, 0.1f);
        x.set(5, 17, std::nanf(""));                           // a NaN row
        x.set(40, 0, std::numeric_limits<float>::infinity());  // an inf row
        Out one(dt, m, 150), two(dt, m, 150), three(dt, m, 150), gen(dt, m, 150);
        const FfnOperands ops = f.operands(act, true);
        run_ffn(*t, pool, ops, x.view(), one.view(), 1);
        run_ffn(*t, pool, ops, x.view(), two.view(), 2);
        run_ffn(*t, pool, ops, x.view(), three.view(), 3);
        run_ffn(*generic, pool, ops, x.view(), gen.view(), 2);
        EXPECT_TRUE(one.same_bits(two)) << name_of(dt) << " " << name_of(act);
        EXPECT_TRUE(one.same_bits(three)) << name_of(dt) << " " << name_of(act);
        EXPECT_TRUE(one.same_bits(gen)) << name_of(dt) << " " << name_of(act);
        // A row without a finite scale comes out NaN, never a finite guess; the others are the
        // rows of a clean call, bit for bit (quantization is per row).
        for (int64_t c = 0; c < 150; ++c) {
          EXPECT_TRUE(std::isnan(one.at(5, c))) << c;
          EXPECT_TRUE(std::isnan(one.at(40, c))) << c;
        }
        Rows clean = x;
        clean.set(5, 17, 0.0f);
        clean.set(40, 0, 0.0f);
        Out y_clean(dt, m, 150);
        run_ffn(*t, pool, ops, clean.view(), y_clean.view(), 2);
        for (int64_t r = 0; r < m; ++r) {
          if (r == 5 || r == 40) continue;
          for (int64_t c = 0; c < 150; ++c)
            ASSERT_EQ(one.at(r, c), y_clean.at(r, c)) << r << "," << c;
        }
      }
    }
}

TEST_P(GemmFfn, RefusesFormsOutsideItsContract) {
  std::string skip;
  const frt_kernel_table* t = open_variant("gemm", GetParam(), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  ThreadPool pool(1);
  std::mt19937_64 rng(fresh_seed());
  const Ffn f(64, 96, 48, rng);
  Rows x(DType::f32, 8, 64, 64 + 3, rng, 0.0f);
  Out y(DType::f32, 8, 48);
  // A gated call: this op is the ungated one.
  FfnOperands gated = f.operands(Activation::gelu, false);
  gated.gate = &f.up;
  EXPECT_NE(ffn_refusal(*t, gated, x.view(), y.view()).find("provides no gated_ffn"),
            std::string::npos)
      << ffn_refusal(*t, gated, x.view(), y.view());
  // The decode layout.
  const PackedLinear up8 = PackedLinear::int8(
      TensorView::matrix(const_cast<float*>(f.up_w.data()), DType::f32, 96, 64, 64));
  FfnOperands wrong = f.operands(Activation::gelu, true);
  wrong.up = &up8;
  const std::string why = ffn_refusal(*t, wrong, x.view(), y.view());
  EXPECT_NE(why.find("ffn up: gemm: weight format 1; takes int8_gemm"), std::string::npos) << why;
  EXPECT_THROW(run_ffn(*t, pool, wrong, x.view(), y.view()), Refused);
  // Weights that do not chain.
  const Ffn other(64, 80, 48, rng);
  FfnOperands split = f.operands(Activation::gelu, true);
  split.down = &other.down;
  EXPECT_NE(ffn_refusal(*t, split, x.view(), y.view()).find("do not chain"), std::string::npos);
  // An input of another width.
  Rows narrow(DType::f32, 8, 63, 63 + 3, rng, 0.0f);
  EXPECT_NE(
      ffn_refusal(*t, f.operands(Activation::gelu, true), narrow.view(), y.view()).find("width 63"),
      std::string::npos);
  // Plan time: activation, format, widths.
  frt_op_desc d = ffn_desc(64, 96, 48, int64_t{1} << 62);
  d.has_bias = 1;
  EXPECT_EQ(form_refusal(*t, d), "");
  d.act = 7;
  EXPECT_NE(form_refusal(*t, d).find("activation 7"), std::string::npos);
  d.act = FRT_ACT_GELU_TANH;
  d.inner = 200000;
  // The intermediate width is down's input width.
  EXPECT_NE(form_refusal(*t, d).find("ffn down: gemm: weight 48x200000 outside"), std::string::npos)
      << form_refusal(*t, d);
  d.inner = 96;
  d.wformat = FRT_W_INT8_CHANNEL;
  EXPECT_NE(form_refusal(*t, d).find("takes int8_gemm"), std::string::npos);
  d.op = FRT_OP_GATED_FFN;
  EXPECT_NE(form_refusal(*t, d).find("provides no"), std::string::npos);
}

// The ladder's premise: the decode-rows ffn package refuses this layout at plan time, so the
// encoder_ffn ladder reaches the GEMM's ffn rung only for the int8_gemm form.
TEST_P(GemmFfn, TheDecodeFfnPackageRefusesTheGemmLayout) {
  std::string skip;
  const frt_kernel_table* t = open_variant("ffn", without_amx(GetParam()), &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  const frt_op_desc d = ffn_desc(64, 96, 64, 16);
  EXPECT_NE(form_refusal(*t, d).find("unknown weight format 16"), std::string::npos)
      << form_refusal(*t, d);
}

INSTANTIATE_TEST_SUITE_P(Variants, GemmFfn, ::testing::ValuesIn(kAmxIsas));

}  // namespace
}  // namespace frt
