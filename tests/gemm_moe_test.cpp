// flashrt/gemm's routed bank of gated experts (FRT_OP_MOE_FFN over FRT_W_INT8_GEMM with
// activation blocks of 32 and FRT_W_INT4_GEMM g32) in every variant this CPU runs: against a
// float64 reference over the dequantized packs and the activation-block quantization the ABI
// defines (Note [W8A8 blocks]), bitwise across variants and thread counts, and its refusals. The
// op is driven through the ABI directly, with a workspace poisoned afresh for every call.
#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/pack.h>
#include <flashrt/thread_pool.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "moe_test_util.h"

namespace frt {
namespace {

using namespace ktest;  // the kernel tests' shared helpers (kernel_test_util.h, moe_test_util.h)

// The bank forms under test: int8_gemm with activation blocks of 32, int4_gemm symmetric and
// with mins, and GGUF Q4_K's and Q6_K's values (int4_super_gemm, int6_super_gemm).
enum class BankForm { int8, int4_sym, int4_asym, int4_super, int6_super };
const std::vector<BankForm> kForms = {BankForm::int8, BankForm::int4_sym, BankForm::int4_asym,
                                      BankForm::int4_super, BankForm::int6_super};

const char* form_name(BankForm f) {
  switch (f) {
    case BankForm::int8:
      return "int8_gemm";
    case BankForm::int4_sym:
      return "int4_gemm";
    case BankForm::int4_asym:
      return "int4_asym";
    case BankForm::int4_super:
      return "int4_super_gemm";
    default:
      return "int6_super_gemm";
  }
}

PackedLinear pack_gemm(BankForm f, std::vector<float>& w, int64_t n, int64_t k) {
  const TensorView v = TensorView::matrix(w.data(), DType::f32, n, k, k);
  if (f == BankForm::int8) return PackedLinear::int8_gemm(v, /*act_block=*/32);
  if (f == BankForm::int4_super) return PackedLinear::int4_super_gemm(v);
  if (f == BankForm::int6_super) return PackedLinear::int6_super_gemm(v);
  return PackedLinear::int4_gemm(v, f == BankForm::int4_sym);
}

// `experts` gated experts in one form with their values (PackedLinear::dequantize(), which the
// gemm linear tests check against each layout's definition). gate/up [inner x k], down
// [n x inner]; int4 needs k and inner multiples of 32, int8 nothing.
struct Bank {
  int64_t experts, k, inner, n;
  std::vector<PackedLinear> gate, up, down;
  std::vector<frt_packed_weight> gv, uv, dv;
  std::vector<std::vector<float>> g64, u64, d64;

  Bank(BankForm f, int64_t experts_, int64_t k_, int64_t inner_, int64_t n_, std::mt19937_64& rng)
      : experts(experts_), k(k_), inner(inner_), n(n_) {
    for (int64_t e = 0; e < experts; ++e) {
      std::vector<float> wg = random_weight(inner, k, rng), wu = random_weight(inner, k, rng),
                         wd = random_weight(n, inner, rng);
      gate.push_back(pack_gemm(f, wg, inner, k));
      up.push_back(pack_gemm(f, wu, inner, k));
      down.push_back(pack_gemm(f, wd, n, inner));
    }
    for (int64_t e = 0; e < experts; ++e) {
      gv.push_back(gate[e].view());
      uv.push_back(up[e].view());
      dv.push_back(down[e].view());
      g64.push_back(gate[e].dequantize());
      u64.push_back(up[e].dequantize());
      d64.push_back(down[e].dequantize());
    }
  }
};

// The block quantization by its definition (Note [W8A8 blocks]): per 32 inputs d = amax / 127,
// a = nearbyint(x * (127 / amax)), in fp32; dequantized values a * d in float64.
std::vector<double> quantized_blocks(const std::vector<float>& x) {
  const int64_t k = static_cast<int64_t>(x.size());
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

// y against float64: x quantized per block, gate/up over the packs' values, h = act(g) * u
// requantized per block (from its fp32 value), down, the weighted sum. The kernel's h differs
// from float64's in fp32 rounding, which can move an element of h across a rounding boundary of
// its block quantization: one step (the block's scale) of an element, allowed twice per term on
// top of 1e-4 of the magnitude.
void expect_matches_reference(const Bank& b, Activation act, const Route& rt, const Rows& x,
                              const Out& y, const std::string& where) {
  const int64_t k = b.k, inner = b.inner, n = b.n;
  for (int64_t r = 0; r < x.m; ++r) {
    std::vector<float> xr(k);
    for (int64_t i = 0; i < k; ++i) xr[i] = static_cast<float>(x.value[r * k + i]);
    const std::vector<double> xq = quantized_blocks(xr);
    std::vector<double> want(n, 0.0), mag(n, 0.0), step(n, 0.0);
    for (int j = 0; j < rt.top_k; ++j) {
      const int64_t e = rt.index[r * rt.top_k + j];
      const double w = rt.weight[r * rt.top_k + j];
      std::vector<float> h(inner);
      for (int64_t c = 0; c < inner; ++c) {
        double gv = 0, uv = 0;
        for (int64_t i = 0; i < k; ++i) {
          gv += xq[i] * b.g64[e][c * k + i];
          uv += xq[i] * b.u64[e][c * k + i];
        }
        h[c] = static_cast<float>(act64(act, gv) * uv);
      }
      const std::vector<double> hq = quantized_blocks(h);
      std::vector<double> dblock(inner);
      for (int64_t i0 = 0; i0 < inner; i0 += 32) {
        double amax = 0;
        for (int64_t i = i0; i < std::min(inner, i0 + 32); ++i)
          amax = std::max(amax, std::fabs(static_cast<double>(h[i])));
        for (int64_t i = i0; i < std::min(inner, i0 + 32); ++i) dblock[i] = amax / 127;
      }
      for (int64_t c = 0; c < n; ++c) {
        double d = 0, dm = 0, flip = 0;
        for (int64_t i = 0; i < inner; ++i) {
          d += hq[i] * b.d64[e][c * inner + i];
          dm += std::fabs(hq[i] * b.d64[e][c * inner + i]);
          flip = std::max(flip, dblock[i] * std::fabs(b.d64[e][c * inner + i]));
        }
        want[c] += w * d;
        mag[c] += std::fabs(w) * dm;
        step[c] += 2 * std::fabs(w) * flip;
      }
    }
    for (int64_t c = 0; c < n; ++c) {
      const double got = y.at(r, c);
      ASSERT_TRUE(std::isfinite(got)) << where << ": y[" << r << "][" << c << "] unwritten";
      ASSERT_NEAR(
          got, want[c],
          1e-4 * mag[c] + step[c] + (y.dtype == DType::bf16 ? std::fabs(want[c]) / 128 : 0) + 1e-6)
          << where << " y[" << r << "][" << c << "]";
    }
    for (int64_t c = n; c < y.ld; ++c)
      ASSERT_TRUE(y.gap_untouched(r, c)) << where << ": wrote past row " << r << " at " << c;
  }
}

// Widths per form: int8 takes any widths (partial blocks, panel tails), int4 multiples of 32,
// the super-block forms of 256.
Widths widths_for(BankForm f) {
  if (f == BankForm::int4_super || f == BankForm::int6_super) return Widths{256, 512, 100};
  return f == BankForm::int8 ? Widths{120, 100, 75} : Widths{128, 192, 100};
}

class GemmMoe : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string skip;
    t = open_variant("gemm", GetParam(), &skip);
    if (t == nullptr) GTEST_SKIP() << skip;
    generic = open_variant("gemm", "generic", &skip);
    ASSERT_NE(generic, nullptr);
  }
  const frt_kernel_table* t = nullptr;
  const frt_kernel_table* generic = nullptr;
  const uint64_t seed = fresh_seed();
  const ::testing::ScopedTrace trace{__FILE__, __LINE__, "seed " + std::to_string(seed)};
  std::mt19937_64 rng{seed};
};

// Against float64, and bitwise against the generic variant on 1, 2 and 3 threads.
TEST_P(GemmMoe, MatchesFloat64AndTheGenericVariantOnAnyThreadCountBitwise) {
  ThreadPool pool(3);
  for (BankForm f : kForms) {
    const Widths w = widths_for(f);
    const Bank bank(f, 10, w.k, w.inner, w.n, rng);
    struct Case {
      int64_t m;
      int top_k;
    };
    for (const Case c : {Case{1, 1}, Case{1, 8}, Case{3, 2}, Case{5, 4}, Case{16, 8}})
      for (Activation act : {Activation::silu, Activation::gelu_tanh})
        for (DType dt : {DType::f32, DType::bf16}) {
          const std::string where = std::string(form_name(f)) + " " + name_of(act) + " " +
                                    name_of(dt) + " m" + std::to_string(c.m) + " top" +
                                    std::to_string(c.top_k);
          const Route rt = random_route(c.m, c.top_k, bank.experts, rng);
          Rows x(dt, c.m, bank.k, bank.k + 5, rng, 0.2f);
          Out ref(dt, c.m, bank.n);
          ASSERT_EQ("", run_moe_op(*generic, pool, moe_args(bank, act, rt, x, ref), 1)) << where;
          expect_matches_reference(bank, act, rt, x, ref, where);
          for (int threads : {1, 2, 3}) {
            Out y(dt, c.m, bank.n);
            ASSERT_EQ("", run_moe_op(*t, pool, moe_args(bank, act, rt, x, y), threads)) << where;
            EXPECT_TRUE(y.same_bits(ref)) << where << " on " << threads << " threads";
          }
        }
  }
}

TEST_P(GemmMoe, RepeatedExpertInARowAddsBothTerms) {
  ThreadPool pool(2);
  for (BankForm f : kForms) {
    const Widths w = widths_for(f);
    const Bank bank(f, 4, w.k, w.inner, w.n, rng);
    const Route rt{3, {2, 1, 2, 0, 3, 3}, {0.25f, 0.5f, 0.75f, 1.0f, 0.5f, 0.5f}};
    Rows x(DType::f32, 2, bank.k, bank.k, rng);
    Out y(DType::f32, 2, bank.n);
    ASSERT_EQ("", run_moe_op(*t, pool, moe_args(bank, Activation::silu, rt, x, y), 2));
    expect_matches_reference(bank, Activation::silu, rt, x, y, form_name(f));
  }
}

// The gated product of one expert with weight 1 through the package's own linear: gate and up
// are the linear's tiles over the same activation blocks, so act(gate) * up computed here from
// the linear's outputs, then the linear over h, agree with the bank op to fp32 rounding of the
// activation (the package exposes no gated activation to compare bit for bit).
TEST_P(GemmMoe, OneRowTopOneWeightOneMatchesThePackagesLinears) {
  ThreadPool pool(2);
  for (BankForm f : kForms) {
    const Widths w = widths_for(f);
    const Bank bank(f, 3, w.k, w.inner, w.n, rng);
    for (int64_t e : {int64_t{0}, int64_t{2}}) {
      Rows x(DType::f32, 1, bank.k, bank.k, rng);
      const Route rt{1, {e}, {1.0f}};
      Out moe(DType::f32, 1, bank.n);
      ASSERT_EQ("", run_moe_op(*t, pool, moe_args(bank, Activation::silu, rt, x, moe), 2));
      std::vector<float> g(bank.inner), u(bank.inner), h(bank.inner), y(bank.n);
      run_linear(*t, pool, bank.gate[e], nullptr, x.view(),
                 TensorView::matrix(g.data(), DType::f32, 1, bank.inner, bank.inner));
      run_linear(*t, pool, bank.up[e], nullptr, x.view(),
                 TensorView::matrix(u.data(), DType::f32, 1, bank.inner, bank.inner));
      for (int64_t c = 0; c < bank.inner; ++c) h[c] = g[c] / (1.0f + std::exp(-g[c])) * u[c];
      run_linear(*t, pool, bank.down[e], nullptr,
                 TensorView::matrix(h.data(), DType::f32, 1, bank.inner, bank.inner),
                 TensorView::matrix(y.data(), DType::f32, 1, bank.n, bank.n));
      double mag = 0;
      for (float v : y) mag = std::max(mag, static_cast<double>(std::fabs(v)));
      for (int64_t c = 0; c < bank.n; ++c)
        EXPECT_NEAR(moe.at(0, c), y[c], 2e-3 * mag + 1e-6) << form_name(f) << " column " << c;
    }
  }
}

TEST_P(GemmMoe, RefusesBadRoutingRowsTopKAndForms) {
  const frt_op* op = moe_op(*t);
  ASSERT_NE(op, nullptr);
  {
    frt_error none{};  // no arguments at all: refused by name, nothing read
    EXPECT_EQ(op->supports(nullptr, &none), FRT_REASON_FORMAT);
    EXPECT_STREQ(none.message, "gemm moe: no arguments");
  }
  const Bank bank(BankForm::int8, 8, 64, 48, 40, rng);
  const Route rt{2, {1, 2, 3, 7}, {0.5f, 0.5f, 0.25f, 0.75f}};
  const Rows x(DType::f32, 2, 64, 64 + 5, rng);
  Out y(DType::f32, 2, 40);
  const frt_moe_args good = moe_args(bank, Activation::silu, rt, x, y);
  const auto expect_refused = [&](const frt_moe_args& a, int32_t want_reason,
                                  const std::string& want_text) {
    frt_error err{};
    const int32_t reason = op->supports(&a, &err);
    EXPECT_EQ(reason, want_reason) << err.message;
    EXPECT_NE(std::string(err.message).find(want_text), std::string::npos)
        << "'" << err.message << "' lacks '" << want_text << "'";
  };
  frt_error err{};
  EXPECT_EQ(op->supports(&good, &err), FRT_REASON_OK) << err.message;

  std::vector<int64_t> idx = rt.index;
  frt_moe_args a = good;
  a.index = idx.data();
  idx[3] = 8;
  expect_refused(a, FRT_REASON_LAYOUT, "index[1][1] = 8 outside the bank's 8 experts");
  idx[3] = -1;
  expect_refused(a, FRT_REASON_LAYOUT, "index[1][1] = -1 outside");
  std::vector<float> wts = rt.weight;
  a = good;
  a.weight = wts.data();
  wts[1] = std::numeric_limits<float>::infinity();
  expect_refused(a, FRT_REASON_LAYOUT, "weight[0][1] = inf is not finite");
  a = good;
  a.top_k = 0;
  expect_refused(a, FRT_REASON_SHAPE, "top_k 0 outside 1..32");
  a.top_k = FRT_MAX_TOP_K + 1;
  expect_refused(a, FRT_REASON_SHAPE, "top_k 33 outside 1..32");
  a = good;
  a.m = FRT_MAX_ROWS + 1;
  expect_refused(a, FRT_REASON_ROWS_OUT_OF_BAND, "outside the decode band 1..16");
  a.m = 0;
  expect_refused(a, FRT_REASON_ROWS_OUT_OF_BAND, "outside the decode band 1..16");
  a = good;
  a.act = FRT_ACT_GELU;
  expect_refused(a, FRT_REASON_FORMAT, "not in {silu, gelu_tanh}");
  // An int8_gemm pack quantizing activations per row, and weight-only packs, are not bank forms.
  std::vector<frt_packed_weight> down = bank.dv;
  a = good;
  a.down = down.data();
  down[5].group = 0;
  expect_refused(a, FRT_REASON_FORMAT, "down[5]");
  std::vector<float> w = random_weight(48, 64, rng);
  const PackedLinear rows_form =
      PackedLinear::int8_gemm(TensorView::matrix(w.data(), DType::f32, 48, 64, 64));
  std::vector<frt_packed_weight> gate = bank.gv;
  a = good;
  a.gate = gate.data();
  gate[0] = rows_form.view();
  expect_refused(a, FRT_REASON_FORMAT, "takes 32 only");
  const PackedLinear weight_only =
      PackedLinear::int8(TensorView::matrix(w.data(), DType::f32, 48, 64, 64));
  gate[0] = weight_only.view();
  expect_refused(a, FRT_REASON_FORMAT, "takes int8_gemm");
  gate = bank.gv;
  gate[3].mins = nullptr;  // int8_gemm without its column sums
  expect_refused(a, FRT_REASON_FORMAT, "gate[3]");
  // An int4 bank mixing the symmetric and the with-mins grids.
  const Bank sym(BankForm::int4_sym, 8, 64, 64, 40, rng),
      asym(BankForm::int4_asym, 8, 64, 64, 40, rng);
  std::vector<frt_packed_weight> up = sym.uv;
  up[4] = asym.uv[4];
  a = moe_args(sym, Activation::silu, rt, x, y);
  a.up = up.data();
  expect_refused(a, FRT_REASON_FORMAT, "up[4]: format 17 group 32 with mins");
}

TEST_P(GemmMoe, FormRefusalAnswersForTheDescribedBank) {
  frt_op_desc good{};
  good.op = FRT_OP_MOE_FFN;
  good.wformat = FRT_W_INT4_GEMM;
  good.group = 32;
  good.scale_dtype = FRT_F16;
  good.act = FRT_ACT_SILU;
  good.x_dtype = FRT_BF16;
  good.y_dtype = FRT_BF16;
  good.rows_max = FRT_MAX_ROWS;
  good.n = 2048;
  good.k = 2048;
  good.inner = 768;
  good.experts = 128;
  good.top_k = 8;
  EXPECT_EQ(form_refusal(*t, good), "");
  frt_op_desc d = good;
  d.wformat = FRT_W_INT8_GEMM;
  d.inner = 100;
  d.n = 75;
  EXPECT_EQ(form_refusal(*t, d), "");
  const auto expect_refused = [&](const frt_op_desc& desc, const std::string& want) {
    const std::string msg = form_refusal(*t, desc);
    EXPECT_NE(msg.find(want), std::string::npos) << "'" << msg << "' lacks '" << want << "'";
  };
  d.group = 0;  // per-row activations: the prefill form
  expect_refused(d, "takes 32 only");
  for (int32_t wf : {FRT_W_INT8_CHANNEL, FRT_W_INT8_GROUP, FRT_W_INT4_GROUP}) {
    d = good;
    d.wformat = wf;
    expect_refused(d, "takes int8_gemm");
  }
  d = good;
  d.inner = 80;
  expect_refused(d, "down: int4_gemm width k=80 not a multiple of 32");
  d = good;
  d.has_bias = 1;
  expect_refused(d, "takes no biases");
  d = good;
  d.act = FRT_ACT_GELU;
  expect_refused(d, "not in {silu, gelu_tanh}");
  d = good;
  d.top_k = 33;
  expect_refused(d, "top_k 33 outside 1..32");
  d = good;
  d.experts = 0;
  expect_refused(d, "a bank of 0 experts");
  d = good;
  d.rows_max = FRT_MAX_ROWS + 1;
  expect_refused(d, "outside the decode band 1..16");
  // The ffn package's bank refuses the gemm forms.
  std::string why;
  const frt_kernel_table* ffn = open_variant_library(library("ffn", without_amx(GetParam())), &why);
  ASSERT_NE(ffn, nullptr) << why;
  for (int32_t wf : {FRT_W_INT8_GEMM, FRT_W_INT4_GEMM}) {
    d = good;
    d.wformat = wf;
    EXPECT_NE(form_refusal(*ffn, d).find("unknown weight format"), std::string::npos)
        << form_refusal(*ffn, d);
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, GemmMoe, ::testing::ValuesIn(kAmxIsas));

// ---- Timing (disabled: --gtest_also_run_disabled_tests --gtest_filter='*GemmMoeTiming*')
// A Qwen3-30B-A3B-shaped bank (128 experts, hidden 2048, intermediate 768, top_k 8) in the gemm
// forms, packed from random weights, one buffer per expert weight.
TEST(GemmMoeTiming, DISABLED_Qwen3_30B_A3B_Bank) {
  std::string skip;
  const std::string isa = detect_cpu().has("avx512_vnni") ? "avx512vnni" : "avx2";
  const frt_kernel_table* t = open_variant("gemm", isa, &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  const frt_op* op = moe_op(*t);
  ASSERT_NE(op, nullptr);
  const int threads = 2;
  ThreadPool pool(threads);
  std::mt19937_64 rng(1234);
  for (BankForm f : {BankForm::int8, BankForm::int4_asym}) {
    const Bank bank(f, 128, 2048, 768, 2048, rng);
    const double bytes_per_expert =
        static_cast<double>(bank.gate[0].nbytes() + bank.up[0].nbytes() + bank.down[0].nbytes());
    for (int64_t m : {1, 4}) {
      const int top_k = 8;
      Rows x(DType::f32, m, bank.k, bank.k, rng);
      Out y(DType::f32, m, bank.n);
      Route rt{top_k, std::vector<int64_t>(m * top_k), std::vector<float>(m * top_k, 0.125f)};
      frt_moe_args a = moe_args(bank, Activation::silu, rt, x, y);
      const Workspace ws = poisoned_workspace(op->workspace(&a));
      a.workspace = ws.get();
      std::vector<int64_t> all(bank.experts);
      for (int64_t e = 0; e < bank.experts; ++e) all[e] = e;
      std::vector<double> run_us;
      double bytes = 0;
      for (int it = 0; it < 60; ++it) {
        std::set<int64_t> chosen;
        for (int64_t r = 0; r < m; ++r) {
          std::shuffle(all.begin(), all.end(), rng);
          std::copy(all.begin(), all.begin() + top_k, rt.index.begin() + r * top_k);
          chosen.insert(all.begin(), all.begin() + top_k);
        }
        const auto t0 = std::chrono::steady_clock::now();
        frt_error err{};
        ASSERT_EQ(op->supports(&a, &err), FRT_REASON_OK) << err.message;
        for (int32_t phase = 0; phase < op->phases; ++phase)
          pool.run(threads, [&](int ith, int team) {
            frt_error e{};
            op->run(&a, phase, ith, team, &e);
          });
        const auto t1 = std::chrono::steady_clock::now();
        if (it < 10) continue;  // warm-up
        run_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        bytes += static_cast<double>(chosen.size()) * bytes_per_expert;
      }
      std::sort(run_us.begin(), run_us.end());
      double total = 0;
      for (double v : run_us) total += v;
      std::printf(
          "%s m=%lld top_k=%d %s on %d threads: median %.0f us (supports + phases), "
          "%.1f GB/s of expert weights\n",
          form_name(f), static_cast<long long>(m), top_k, isa.c_str(), threads,
          run_us[run_us.size() / 2], bytes / (total * 1e3));
    }
  }
}

}  // namespace
}  // namespace frt
