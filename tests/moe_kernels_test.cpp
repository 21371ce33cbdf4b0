// The routed bank of gated experts (FRT_OP_MOE_FFN, flashrt/ffn) of every variant this CPU runs:
// against a float64 reference over the dequantised packs, across thread counts bit for bit,
// against the gated feed-forward on one expert, and its refusals. The op is driven through the
// ABI directly (supports, workspace, phases), with a workspace poisoned afresh for every call.
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
#include <memory>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_test_util.h"
#include "moe_test_util.h"

namespace frt {
namespace {

using namespace ktest;  // the kernel tests' shared helpers (kernel_test_util.h, moe_test_util.h)

const std::vector<Format> kMoeFormats = {
    {"int8", WeightFormat::int8_channel, 0, true, DType::f32},
    {"int8_g64_f16", WeightFormat::int8_group, 64, true, DType::f16},
    {"int4_g32_asym_f16", WeightFormat::int4_group, 32, false, DType::f16},
    {"int4_super", WeightFormat::int4_super, 32, false, DType::f16},
    {"int8_super", WeightFormat::int8_super, 16, true, DType::f16}};

// The group formats need k and inner to be multiples of the group (so of FRT_PANEL too), the
// super-block form of 256; n, and every width of int8 per channel, need not be.
Widths widths_for(const Format& f) {
  if (is_super_format(f.format)) return Widths{256, 512, 100};
  return f.group == 0 ? Widths{120, 100, 75} : Widths{128, 192, 100};
}

// `experts` gated experts in one format, packed, with their float64 values.
struct Bank {
  int64_t experts, k, inner, n;
  std::vector<PackedLinear> gate, up, down;
  std::vector<frt_packed_weight> gv, uv, dv;  // the ABI's arrays
  std::vector<std::vector<double>> g64, u64, d64;

  Bank(const Format& f, int64_t experts_, Widths w, std::mt19937_64& rng)
      : experts(experts_), k(w.k), inner(w.inner), n(w.n) {
    for (int64_t e = 0; e < experts; ++e) {
      std::vector<float> wg = random_weight(inner, k, rng), wu = random_weight(inner, k, rng),
                         wd = random_weight(n, inner, rng);
      gate.push_back(pack(f, wg, inner, k));
      up.push_back(pack(f, wu, inner, k));
      down.push_back(pack(f, wd, n, inner));
    }
    for (int64_t e = 0; e < experts; ++e) {
      gv.push_back(gate[e].view());
      uv.push_back(up[e].view());
      dv.push_back(down[e].view());
      g64.push_back(dequant64(gv.back()));
      u64.push_back(dequant64(uv.back()));
      d64.push_back(dequant64(dv.back()));
    }
  }
};

// Checks y against float64 over the packs' own values: the only error is fp32 accumulation (and
// bf16 rounding of the output).
void expect_matches_reference(const Bank& b, Activation act, const Route& rt, const Rows& x,
                              const Out& y, const std::string& where) {
  const int64_t k = b.k, inner = b.inner, n = b.n;
  for (int64_t r = 0; r < x.m; ++r) {
    std::vector<double> want(n, 0.0), mag(n, 0.0);
    for (int j = 0; j < rt.top_k; ++j) {
      const int64_t e = rt.index[r * rt.top_k + j];
      const double w = rt.weight[r * rt.top_k + j];
      std::vector<double> h(inner);
      for (int64_t c = 0; c < inner; ++c) {
        double gv = 0, uv = 0;
        for (int64_t i = 0; i < k; ++i) {
          gv += x.value[r * k + i] * b.g64[e][c * k + i];
          uv += x.value[r * k + i] * b.u64[e][c * k + i];
        }
        h[c] = act64(act, gv) * uv;
      }
      for (int64_t c = 0; c < n; ++c) {
        double d = 0, dm = 0;
        for (int64_t i = 0; i < inner; ++i) {
          d += h[i] * b.d64[e][c * inner + i];
          dm += std::fabs(h[i] * b.d64[e][c * inner + i]);
        }
        want[c] += w * d;
        mag[c] += std::fabs(w) * dm;
      }
    }
    for (int64_t c = 0; c < n; ++c) {
      const double got = y.at(r, c);
      ASSERT_TRUE(std::isfinite(got)) << where << ": y[" << r << "][" << c << "] unwritten";
      // h carries fp32 rounding from two dot products: 1e-4 of the magnitude, as the gated ffn.
      ASSERT_NEAR(got, want[c],
                  1e-4 * mag[c] + (y.dtype == DType::bf16 ? std::fabs(want[c]) / 128 : 0) + 1e-6)
          << where << " y[" << r << "][" << c << "]";
    }
    for (int64_t c = n; c < y.ld; ++c)
      ASSERT_TRUE(y.gap_untouched(r, c)) << where << ": wrote past row " << r << " at " << c;
  }
}

// Each test: the variant's table t (skipped where this CPU cannot run it) and rng from a fresh
// seed, traced for the whole test so that a failure can be replayed.
class MoeKernel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string skip;
    t = open_variant("ffn", GetParam(), &skip);
    if (t == nullptr) GTEST_SKIP() << skip;
  }
  const frt_kernel_table* t = nullptr;
  const uint64_t seed = fresh_seed();
  const ::testing::ScopedTrace trace{__FILE__, __LINE__, "seed " + std::to_string(seed)};
  std::mt19937_64 rng{seed};
};

TEST_P(MoeKernel, MatchesFloat64ReferenceEveryFormatActivationDtypeRowsAndTopK) {
  ThreadPool pool(2);
  for (const Format& f : kMoeFormats)
    for (int top_k : {1, 2, 8}) {
      // 8..20 experts, at least two more than top_k, so two go unchosen.
      const int64_t lo = std::max(8, top_k + 2);
      const int64_t experts = lo + static_cast<int64_t>(rng() % (21 - lo));
      const Bank bank(f, experts, widths_for(f), rng);
      for (int64_t m : {1, 3, 16})
        for (Activation act : {Activation::silu, Activation::gelu_tanh})
          for (DType dt : {DType::f32, DType::bf16}) {
            const std::string where = std::string(f.name) + " " + std::to_string(experts) +
                                      " experts top_k " + std::to_string(top_k) + " m " +
                                      std::to_string(m) + " " + name_of(act) + " " +
                                      (dt == DType::f32 ? "f32" : "bf16");
            const Route rt = random_route(m, top_k, experts, rng);
            const Rows x(dt, m, bank.k, bank.k + 5, rng);
            Out y(dt, m, bank.n);
            ASSERT_EQ("", run_moe_op(*t, pool, moe_args(bank, act, rt, x, y), 2)) << where;
            expect_matches_reference(bank, act, rt, x, y, where);
          }
    }
}

// A row may name an expert twice: both terms count, the expert's weights are still read once.
TEST_P(MoeKernel, RepeatedExpertInARowAddsBothTerms) {
  ThreadPool pool(2);
  for (const Format& f : kMoeFormats) {
    const Bank bank(f, 6, widths_for(f), rng);
    Route rt{3, {5, 2, 5, 0, 0, 0}, {0.5f, 0.25f, -0.75f, 1.0f, 2.0f, 0.125f}};
    const Rows x(DType::f32, 2, bank.k, bank.k + 5, rng);
    Out y(DType::f32, 2, bank.n);
    ASSERT_EQ("", run_moe_op(*t, pool, moe_args(bank, Activation::silu, rt, x, y), 2)) << f.name;
    expect_matches_reference(bank, Activation::silu, rt, x, y, f.name);
  }
}

TEST_P(MoeKernel, OneTwoAndThreeThreadsAgreeBitwise) {
  ThreadPool pool(3);
  for (const Format& f : kMoeFormats) {
    const Bank bank(f, 12, widths_for(f), rng);
    struct Case {
      int64_t m;
      int top_k;
      DType x, y;
    };
    for (Case c : {Case{1, 8, DType::f32, DType::f32}, Case{3, 2, DType::bf16, DType::f32},
                   Case{16, 8, DType::f32, DType::bf16}, Case{16, 1, DType::bf16, DType::bf16}}) {
      const Route rt = random_route(c.m, c.top_k, bank.experts, rng);
      const Rows x(c.x, c.m, bank.k, bank.k + 5, rng);
      Out y1(c.y, c.m, bank.n), y2(c.y, c.m, bank.n), y3(c.y, c.m, bank.n);
      ASSERT_EQ("", run_moe_op(*t, pool, moe_args(bank, Activation::gelu_tanh, rt, x, y1), 1));
      ASSERT_EQ("", run_moe_op(*t, pool, moe_args(bank, Activation::gelu_tanh, rt, x, y2), 2));
      ASSERT_EQ("", run_moe_op(*t, pool, moe_args(bank, Activation::gelu_tanh, rt, x, y3), 3));
      EXPECT_TRUE(y1.same_bits(y2)) << f.name << " m " << c.m << " top_k " << c.top_k;
      EXPECT_TRUE(y1.same_bits(y3)) << f.name << " m " << c.m << " top_k " << c.top_k;
    }
  }
}

// One row routed to one expert with weight 1 is that expert's gated feed-forward, bit for bit.
TEST_P(MoeKernel, OneRowTopOneWeightOneIsTheGatedFfnBitwise) {
  ThreadPool pool(2);
  for (const Format& f : kMoeFormats) {
    const Bank bank(f, 5, widths_for(f), rng);
    for (Activation act : {Activation::silu, Activation::gelu_tanh})
      for (DType dt : {DType::f32, DType::bf16})
        for (int64_t e : {int64_t{0}, int64_t{3}, int64_t{4}}) {
          Rows x(dt, 1, bank.k, bank.k + 5, rng);
          const Route rt{1, {e}, {1.0f}};
          Out moe(dt, 1, bank.n), ffn(dt, 1, bank.n);
          ASSERT_EQ("", run_moe_op(*t, pool, moe_args(bank, act, rt, x, moe), 2));
          FfnOperands ops;
          ops.gate = &bank.gate[e];
          ops.up = &bank.up[e];
          ops.down = &bank.down[e];
          ops.act = act;
          run_ffn(*t, pool, ops, x.view(), ffn.view(), 2);
          EXPECT_TRUE(moe.same_bits(ffn)) << f.name << " " << name_of(act) << " expert " << e;
        }
  }
}

// supports() per call: the reason and a message naming what is wrong.
TEST_P(MoeKernel, RefusesBadRoutingRowsTopKFormatsAndMissingBanks) {
  const frt_op* op = moe_op(*t);
  ASSERT_NE(op, nullptr);
  {
    frt_error none{};  // no arguments at all: refused by name, nothing read
    EXPECT_EQ(op->supports(nullptr, &none), FRT_REASON_FORMAT);
    EXPECT_STREQ(none.message, "moe: no arguments");
  }
  const Bank bank(kMoeFormats[0], 8, Widths{64, 48, 40}, rng);
  const Bank int4_bank(kMoeFormats[2], 8, Widths{64, 64, 40}, rng);
  const Bank wide_bank(kMoeFormats[0], 8, Widths{64, 64, 40}, rng);
  Route rt{2, {1, 2, 3, 7}, {0.5f, 0.5f, 0.25f, 0.75f}};
  const Rows x(DType::f32, 2, 64, 64 + 5, rng);
  Out y(DType::f32, 2, 40);
  const frt_moe_args good = moe_args(bank, Activation::silu, rt, x, y);
  const auto refusal = [&](const frt_moe_args& a, int32_t* reason = nullptr) {
    frt_error err{};
    const int32_t r = op->supports(&a, &err);
    if (reason != nullptr) *reason = r;
    return r == FRT_REASON_OK ? std::string() : std::string(err.message);
  };
  const auto expect_refused = [&](const frt_moe_args& a, int32_t want_reason,
                                  const std::string& want_text) {
    int32_t reason = FRT_REASON_OK;
    const std::string msg = refusal(a, &reason);
    EXPECT_EQ(reason, want_reason) << msg;
    EXPECT_NE(msg.find(want_text), std::string::npos)
        << "'" << msg << "' lacks '" << want_text << "'";
  };
  EXPECT_EQ(refusal(good), "");

  std::vector<int64_t> idx = rt.index;
  frt_moe_args a = good;
  a.index = idx.data();
  idx[3] = 8;
  expect_refused(a, FRT_REASON_LAYOUT, "moe: index[1][1] = 8 outside the bank's 8 experts");
  idx[3] = 7;
  idx[0] = -1;
  expect_refused(a, FRT_REASON_LAYOUT, "index[0][0] = -1 outside the bank's 8 experts");

  std::vector<float> wts = rt.weight;
  a = good;
  a.weight = wts.data();
  wts[1] = std::numeric_limits<float>::quiet_NaN();
  expect_refused(a, FRT_REASON_LAYOUT, "weight[0][1] = nan is not finite");
  wts[1] = 0.5f;
  wts[2] = -std::numeric_limits<float>::infinity();
  expect_refused(a, FRT_REASON_LAYOUT, "weight[1][0] = -inf is not finite");

  a = good;
  a.top_k = 0;
  expect_refused(a, FRT_REASON_SHAPE, "top_k 0 outside 1..32");
  a.top_k = FRT_MAX_TOP_K + 1;
  expect_refused(a, FRT_REASON_SHAPE, "top_k 33 outside 1..32");

  a = good;
  a.m = 0;
  expect_refused(a, FRT_REASON_ROWS_OUT_OF_BAND, "rows M=0 outside the decode band 1..16");
  a.m = FRT_MAX_ROWS + 1;
  expect_refused(a, FRT_REASON_ROWS_OUT_OF_BAND, "rows M=17 outside the decode band 1..16");

  a = good;
  a.experts = 0;
  expect_refused(a, FRT_REASON_SHAPE, "a bank of 0 experts");
  a = good;
  a.act = FRT_ACT_GELU;
  expect_refused(a, FRT_REASON_FORMAT, "not in {silu, gelu_tanh}");

  // One expert's up in another format, one expert's down of another shape.
  std::vector<frt_packed_weight> ups = bank.uv, downs = bank.dv;
  a = good;
  a.up = ups.data();
  ups[3] = int4_bank.uv[3];
  expect_refused(a, FRT_REASON_FORMAT, "moe up[3] is int4 g32 (f16 scales)");
  expect_refused(a, FRT_REASON_FORMAT, "must share one weight format");
  a = good;
  a.down = downs.data();
  downs[5] = wide_bank.dv[5];
  expect_refused(a, FRT_REASON_SHAPE,
                 "moe down[5] is 40x64; the bank's gate and up are 48x64 and its down 40x48");
  a = good;
  a.gate = nullptr;
  expect_refused(a, FRT_REASON_FORMAT, "no gate bank");
  a = good;
  a.down = nullptr;
  expect_refused(a, FRT_REASON_FORMAT, "no down bank");
  std::vector<frt_packed_weight> gates = bank.gv;
  gates[6].qdata = nullptr;
  a = good;
  a.gate = gates.data();
  expect_refused(a, FRT_REASON_FORMAT, "moe gate[6]: no packed weight");
  a = good;
  a.index = nullptr;
  expect_refused(a, FRT_REASON_LAYOUT, "missing routing (index is NULL)");
  a = good;
  a.weight = nullptr;
  expect_refused(a, FRT_REASON_LAYOUT, "missing routing (weight is NULL)");
  a = good;
  a.ldx = 63;
  expect_refused(a, FRT_REASON_LAYOUT, "row strides");
  a = good;
  a.y_dtype = FRT_F16;
  expect_refused(a, FRT_REASON_DTYPE, "supported: f32, bf16");

  // run() itself fails cleanly on an index supports() would refuse, whatever the phase.
  idx = rt.index;
  idx[2] = 99;
  a = good;
  a.index = idx.data();
  const Workspace ws = poisoned_workspace(op->workspace(&good));
  a.workspace = ws.get();
  frt_error err{};
  EXPECT_EQ(op->run(&a, 0, 0, 1, &err), FRT_E_INVALID);
  EXPECT_NE(std::string(err.message).find("outside the bank"), std::string::npos) << err.message;
}

// supports_op() at plan time.
TEST_P(MoeKernel, FormRefusalAnswersForTheDescribedBank) {
  frt_op_desc good{};
  good.op = FRT_OP_MOE_FFN;
  good.wformat = FRT_W_INT4_GROUP;
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
  frt_op_desc int8 = good;
  int8.wformat = FRT_W_INT8_CHANNEL;
  int8.group = 0;
  int8.scale_dtype = FRT_F32;
  int8.inner = 100;
  int8.n = 75;
  EXPECT_EQ(form_refusal(*t, int8), "");

  const auto expect_refused = [&](const frt_op_desc& d, const std::string& want) {
    const std::string msg = form_refusal(*t, d);
    EXPECT_NE(msg.find(want), std::string::npos) << "'" << msg << "' lacks '" << want << "'";
  };
  frt_op_desc d = good;
  d.has_bias = 1;
  expect_refused(d, "moe: takes no biases");
  d = good;
  d.act = FRT_ACT_GELU;
  expect_refused(d, "activation 2 not in {silu, gelu_tanh}");
  d.act = static_cast<int32_t>(Activation::relu);
  expect_refused(d, "not in {silu, gelu_tanh}");
  d = good;
  d.experts = 0;
  expect_refused(d, "a bank of 0 experts");
  d = good;
  d.top_k = 0;
  expect_refused(d, "top_k 0 outside 1..32");
  d.top_k = 33;
  expect_refused(d, "top_k 33 outside 1..32");
  d = good;
  d.rows_max = FRT_MAX_ROWS + 1;
  expect_refused(d, "outside the decode band 1..16");
  d = good;
  d.inner = 80;  // down's input width is the intermediate
  expect_refused(d, "moe down: int4 width k=80 is not a multiple of group 32");
  d.inner = 768;
  d.k = 100;
  expect_refused(d, "moe gate/up: int4 width k=100 is not a multiple of group 32");
  d = good;
  d.wformat = FRT_W_INT8_GEMM;
  expect_refused(d, "unknown weight format 16");

  // The linear package owns no bank.
  std::string why;
  const frt_kernel_table* linear = open_variant_library(library("linear", GetParam()), &why);
  ASSERT_NE(linear, nullptr) << why;
  EXPECT_NE(form_refusal(*linear, good).find("provides no moe_ffn op"), std::string::npos)
      << form_refusal(*linear, good);
}

INSTANTIATE_TEST_SUITE_P(Variants, MoeKernel, ::testing::ValuesIn(kAmxIsas));

// ---- Timing (disabled by default: --gtest_also_run_disabled_tests --gtest_filter='*MoeTiming*')
// A Qwen3-30B-A3B-shaped bank: 128 experts, hidden 2048, intermediate 768, top_k 8. The packs hold
// random bytes in the formats' layouts (the kernels' speed does not depend on the values), one
// buffer per expert weight, so every call reads its experts from memory, not cache.
struct RawBank {
  int64_t experts, k, inner, n;
  std::vector<std::unique_ptr<uint8_t[]>> buffers;
  std::vector<frt_packed_weight> gate, up, down;
  int64_t bytes_per_expert = 0;

  static void fill(uint8_t* p, int64_t bytes, uint64_t& s) {
    for (int64_t i = 0; i < bytes; ++i) {
      s ^= s << 13;
      s ^= s >> 7;
      s ^= s << 17;
      p[i] = static_cast<uint8_t>(s >> 32);
    }
  }
  frt_packed_weight make(int32_t format, int32_t group, int64_t n_, int64_t k_, uint64_t& s) {
    frt_packed_weight w{};
    w.format = format;
    w.group = group;
    w.scale_dtype = FRT_F16;
    w.n = n_;
    w.k = k_;
    const int64_t cols = (n_ + FRT_PANEL - 1) / FRT_PANEL * FRT_PANEL;
    const int64_t qbytes = format == FRT_W_INT4_GROUP ? cols * k_ / 2 : cols * k_;
    const int64_t scales = cols * (k_ / group);
    auto q = std::make_unique<uint8_t[]>(qbytes);
    fill(q.get(), qbytes, s);
    auto sc = std::make_unique<uint8_t[]>(scales * 2);
    auto mn = std::make_unique<uint8_t[]>(scales * 2);
    auto* sc16 = reinterpret_cast<uint16_t*>(sc.get());
    auto* mn16 = reinterpret_cast<uint16_t*>(mn.get());
    for (int64_t i = 0; i < scales; ++i) {
      sc16[i] = static_cast<uint16_t>(0x1c00 + (i * 37) % 0x800);    // about 0.004 .. 0.016
      mn16[i] = static_cast<uint16_t>(0x8000 | (sc16[i] + 0x0c00));  // -8 scales
    }
    w.qdata = q.get();
    w.scales = sc.get();
    w.mins = format == FRT_W_INT4_GROUP ? mn.get() : nullptr;
    bytes_per_expert += qbytes + scales * 2 * (format == FRT_W_INT4_GROUP ? 2 : 1);
    buffers.push_back(std::move(q));
    buffers.push_back(std::move(sc));
    buffers.push_back(std::move(mn));
    return w;
  }
  RawBank(int32_t format, int32_t group, int64_t experts_, int64_t k_, int64_t inner_, int64_t n_)
      : experts(experts_), k(k_), inner(inner_), n(n_) {
    uint64_t s = 0x9e3779b97f4a7c15ull;
    for (int64_t e = 0; e < experts; ++e) {
      gate.push_back(make(format, group, inner, k, s));
      up.push_back(make(format, group, inner, k, s));
      down.push_back(make(format, group, n, inner, s));
    }
    bytes_per_expert /= experts;
  }
};

TEST(MoeTiming, DISABLED_Qwen3_30B_A3B_Bank) {
  std::string skip;
  const std::string isa = detect_cpu().has("avx512_vnni") ? "avx512vnni" : "avx2";
  const frt_kernel_table* t = open_variant("ffn", isa, &skip);
  if (t == nullptr) GTEST_SKIP() << skip;
  const frt_op* op = moe_op(*t);
  ASSERT_NE(op, nullptr);
  const int threads = 2;
  ThreadPool pool(threads);
  std::printf("read bandwidth on %d threads: %.1f GB/s (1 GiB, best of 3)\n", threads,
              measure_read_bandwidth(int64_t{1} << 30, threads, 3));
  std::mt19937_64 rng(1234);
  for (auto [format, group, name] : {std::tuple{FRT_W_INT8_GROUP, 64, "int8 g64 f16"},
                                     std::tuple{FRT_W_INT4_GROUP, 32, "int4 g32 asym f16"}}) {
    const RawBank bank(format, group, 128, 2048, 768, 2048);
    for (int64_t m : {1, 4}) {
      const int top_k = 8;
      std::vector<float> x(m * bank.k), y(m * bank.n);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      for (float& v : x) v = dist(rng);
      std::vector<int64_t> index(m * top_k);
      std::vector<float> weight(m * top_k, 0.125f);
      frt_moe_args a{};
      a.x_dtype = a.y_dtype = FRT_F32;
      a.act = FRT_ACT_SILU;
      a.top_k = top_k;
      a.m = m;
      a.x = x.data();
      a.ldx = bank.k;
      a.y = y.data();
      a.ldy = bank.n;
      a.index = index.data();
      a.weight = weight.data();
      a.experts = bank.experts;
      a.gate = bank.gate.data();
      a.up = bank.up.data();
      a.down = bank.down.data();
      const Workspace ws = poisoned_workspace(op->workspace(&a));
      a.workspace = ws.get();
      std::vector<int64_t> all(bank.experts);
      for (int64_t e = 0; e < bank.experts; ++e) all[e] = e;
      std::vector<double> run_us, check_us;
      double bytes = 0;
      for (int it = 0; it < 60; ++it) {
        std::set<int64_t> chosen;
        for (int64_t r = 0; r < m; ++r) {
          std::shuffle(all.begin(), all.end(), rng);
          std::copy(all.begin(), all.begin() + top_k, index.begin() + r * top_k);
          chosen.insert(all.begin(), all.begin() + top_k);
        }
        const auto t0 = std::chrono::steady_clock::now();
        frt_error err{};
        ASSERT_EQ(op->supports(&a, &err), FRT_REASON_OK) << err.message;
        const auto t1 = std::chrono::steady_clock::now();
        for (int32_t phase = 0; phase < op->phases; ++phase)
          pool.run(threads, [&](int ith, int team) {
            frt_error e{};
            op->run(&a, phase, ith, team, &e);
          });
        const auto t2 = std::chrono::steady_clock::now();
        if (it < 10) continue;  // warm-up
        check_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        run_us.push_back(std::chrono::duration<double, std::micro>(t2 - t1).count());
        bytes += static_cast<double>(chosen.size()) * bank.bytes_per_expert;
      }
      // For scale: the gated feed-forward op over the same experts one after another (what a
      // caller without the bank op runs), the same bytes from memory, row by row for m > 1.
      const frt_op* ffn = find_op(*t, OpKind::gated_ffn);
      ASSERT_NE(ffn, nullptr);
      std::vector<double> ffn_us;
      for (int it = 0; it < 30; ++it) {
        for (int64_t r = 0; r < m; ++r) {
          std::shuffle(all.begin(), all.end(), rng);
          std::copy(all.begin(), all.begin() + top_k, index.begin() + r * top_k);
        }
        const auto t0 = std::chrono::steady_clock::now();
        for (int64_t r = 0; r < m; ++r)
          for (int j = 0; j < top_k; ++j) {
            const int64_t e = index[r * top_k + j];
            frt_ffn_args f{};
            f.x_dtype = f.y_dtype = FRT_F32;
            f.act = FRT_ACT_SILU;
            f.m = 1;
            f.x = x.data() + r * bank.k;
            f.ldx = bank.k;
            f.y = y.data() + r * bank.n;
            f.ldy = bank.n;
            f.gate = &bank.gate[e];
            f.up = &bank.up[e];
            f.down = &bank.down[e];
            f.workspace = ws.get();  // the bank's workspace is larger than one row's
            for (int32_t phase = 0; phase < ffn->phases; ++phase)
              pool.run(threads, [&](int ith, int team) {
                frt_error e2{};
                ffn->run(&f, phase, ith, team, &e2);
              });
          }
        const auto t1 = std::chrono::steady_clock::now();
        if (it >= 5) ffn_us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      std::sort(ffn_us.begin(), ffn_us.end());
      std::sort(run_us.begin(), run_us.end());
      std::sort(check_us.begin(), check_us.end());
      double total = 0;
      for (double v : run_us) total += v;
      const double median = run_us[run_us.size() / 2];
      std::printf(
          "moe %s (%s, %d threads): 128 experts 2048/768/2048, top_k 8, m %lld: run median %.0f "
          "us (min %.0f, mean %.0f), %.1f GB/s of selected experts; supports() median %.1f us; "
          "gated ffn per (row, expert) median %.0f us\n",
          name, isa.c_str(), threads, static_cast<long long>(m), median, run_us.front(),
          total / run_us.size(), bytes / (total * 1e-6) / 1e9, check_us[check_us.size() / 2],
          ffn_us[ffn_us.size() / 2]);
    }
  }
}

}  // namespace
}  // namespace frt
