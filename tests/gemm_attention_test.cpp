// flashrt/gemm's sequence attention (FRT_OP_SEQUENCE_ATTENTION) in every variant this CPU runs:
// against float64 softmax attention over the same bf16 values, within the bound each path's
// roundings give (Note [Sequence attention] in kernels/gemm/src/gemm_attention.cpp), across
// layouts, grouped heads, tails of queries and keys and scores large enough to move the running
// maximum; bitwise across thread counts; NaN kept to the queries it reaches; refusals by reason.
#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/errors.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/thread_pool.h>
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

using namespace ktest;

constexpr uint16_t kPoison = 0x7fa5;  // a NaN no kernel writes: the gaps past each output row

float widen(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
uint16_t narrow(float f) {  // the test's values are finite: round to nearest even
  f = to_bf16_value(f);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<uint16_t>(bits >> 16);
}

struct Shape {
  int64_t batch, heads, kv_heads, q_len, kv_len, dim;
};

// A [batch][positions][heads][dim] tensor stored as the op reads it, either position-major
// (a projection's [batch, positions, heads * dim] output viewed per head: ld {P*H*D', H*D', D'})
// or head-major ([batch, heads, positions, dim'], ld {H*P*D', D', P*D'}), rows dim' = dim + gap
// apart with poisoned gaps.
struct Heads {
  int64_t batch, positions, heads, dim, row;
  bool head_major;
  std::vector<uint16_t> data;
  int64_t ld[3];
  Heads(int64_t b, int64_t p, int64_t h, int64_t d, bool hm, int64_t gap)
      : batch(b),
        positions(p),
        heads(h),
        dim(d),
        row(d + gap),
        head_major(hm),
        data(static_cast<size_t>(b * p * h * (d + gap)), kPoison) {
    ld[0] = p * h * row;
    ld[1] = hm ? row : h * row;
    ld[2] = hm ? p * row : row;
  }
  uint16_t& at(int64_t b, int64_t t, int64_t h, int64_t i) {
    return data[static_cast<size_t>(b * ld[0] + t * ld[1] + h * ld[2] + i)];
  }
  double value(int64_t b, int64_t t, int64_t h, int64_t i) const {
    return widen(data[static_cast<size_t>(b * ld[0] + t * ld[1] + h * ld[2] + i)]);
  }
  void fill(std::mt19937_64& rng, float sigma) {
    std::normal_distribution<float> dist(0.0f, sigma);
    for (int64_t b = 0; b < batch; ++b)
      for (int64_t t = 0; t < positions; ++t)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t i = 0; i < dim; ++i) at(b, t, h, i) = narrow(dist(rng));
  }
};

struct Problem {
  Shape s;
  Heads q, k, v, out;
  float scale;
  Problem(const Shape& sh, bool head_major, float q_sigma, uint64_t seed)
      : s(sh),
        q(sh.batch, sh.q_len, sh.heads, sh.dim, head_major, 3),
        k(sh.batch, sh.kv_len, sh.kv_heads, sh.dim, !head_major, 0),
        v(sh.batch, sh.kv_len, sh.kv_heads, sh.dim, head_major, 5),
        out(sh.batch, sh.q_len, sh.heads, sh.dim, !head_major, 2),
        scale(1.0f / std::sqrt(static_cast<float>(sh.dim))) {
    std::mt19937_64 rng(seed);
    q.fill(rng, q_sigma);
    k.fill(rng, 1.0f);
    v.fill(rng, 1.0f);
  }
  frt_sequence_attention_args args() {
    frt_sequence_attention_args a{};
    a.batch = s.batch, a.heads = s.heads, a.kv_heads = s.kv_heads, a.head_dim = s.dim;
    a.q_len = s.q_len, a.kv_len = s.kv_len, a.dtype = FRT_BF16;
    a.q = q.data.data(), a.k = k.data.data(), a.v = v.data.data(), a.out = out.data.data();
    std::copy(q.ld, q.ld + 3, a.q_ld);
    std::copy(k.ld, k.ld + 3, a.k_ld);
    std::copy(v.ld, v.ld + 3, a.v_ld);
    std::copy(out.ld, out.ld + 3, a.out_ld);
    a.scale = scale;
    return a;
  }
  // The float64 attention of query t, head h (its dims) and the largest |v| it weighs.
  std::vector<double> reference(int64_t b, int64_t t, int64_t h, double* vmax) const {
    const int64_t kvh = h / (s.heads / s.kv_heads);
    std::vector<double> score(s.kv_len), o(s.dim, 0.0);
    double mx = -std::numeric_limits<double>::infinity(), sum = 0;
    for (int64_t j = 0; j < s.kv_len; ++j) {
      double dot = 0;
      for (int64_t i = 0; i < s.dim; ++i) dot += q.value(b, t, h, i) * k.value(b, j, kvh, i);
      score[j] = dot * scale;
      mx = std::max(mx, score[j]);
    }
    *vmax = 0;
    for (int64_t j = 0; j < s.kv_len; ++j) {
      const double p = std::exp(score[j] - mx);
      sum += p;
      for (int64_t i = 0; i < s.dim; ++i) {
        o[i] += p * v.value(b, j, kvh, i);
        *vmax = std::max(*vmax, std::fabs(v.value(b, j, kvh, i)));
      }
    }
    for (double& x : o) x /= sum;
    return o;
  }
};

// The core's view of a Heads: [batch, heads, positions, dim].
TensorView view(Heads& x) {
  TensorView v;
  v.data = x.data.data();
  v.dtype = DType::bf16;
  v.rank = 4;
  v.shape = {x.batch, x.heads, x.positions, x.dim};
  v.strides = {x.ld[0], x.ld[2], x.ld[1], 1};
  return v;
}

// Runs the op as the core does: supports(), the workspace, phase 0 then phase 1 on nth "threads"
// (in turn, on this one).
void run_attention(const frt_kernel_table& t, frt_sequence_attention_args a, int nth) {
  const frt_op* op = find_op(t, OpKind::sequence_attention);
  ASSERT_NE(op, nullptr);
  frt_error err{};
  ASSERT_EQ(op->supports(&a, &err), FRT_REASON_OK) << err.message;
  // A workspace of NaN: a pack that leaves padding unwritten shows in the outputs.
  std::vector<uint8_t> space(static_cast<size_t>(op->workspace(&a) + 64), 0xff);
  a.workspace = space.data() + (64 - reinterpret_cast<uintptr_t>(space.data()) % 64) % 64;
  for (int32_t phase = 0; phase < op->phases; ++phase)
    for (int ith = 0; ith < nth; ++ith)
      ASSERT_EQ(op->run(&a, phase, ith, nth, &err), FRT_OK) << err.message;
}

bool on_tiles(const std::string& isa, int64_t dim) {
  return (isa == "amx" || isa == "amx-simde") && dim <= 128;
}

class SequenceAttention : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string skip;
    t_ = open_variant("gemm", GetParam(), &skip);
    if (t_ == nullptr) GTEST_SKIP() << skip;
  }
  const frt_kernel_table* t_ = nullptr;
};

// Heads of 1..512 dims (130 and up: past the tiles, the portable path in every variant), query and
// key tails of every kind, grouped heads, both layouts; q_sigma 8 makes scores of tens, so a later
// block's maximum moves the running one.
TEST_P(SequenceAttention, MatchesFloat64WithinItsRoundingsEveryShapeAndLayout) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const std::vector<Shape> shapes = {
      {1, 1, 1, 1, 1, 1},     {1, 2, 1, 17, 33, 72},  {2, 2, 2, 16, 128, 64},
      {1, 3, 1, 40, 300, 72}, {1, 1, 1, 5, 257, 128}, {1, 2, 2, 20, 129, 130},
      {1, 1, 1, 33, 16, 8},   {2, 4, 2, 3, 1, 40},    {1, 2, 1, 18, 200, 96},
      {1, 2, 1, 17, 45, 37},  {1, 1, 1, 9, 130, 127}, {1, 2, 1, 7, 40, 256},
      {1, 1, 1, 5, 33, 512}};
  int case_no = 0;
  for (const Shape& sh : shapes)
    for (const bool head_major : {false, true})
      for (const float q_sigma : {1.0f, 8.0f}) {
        Problem p(sh, head_major, q_sigma, seed + static_cast<uint64_t>(case_no++));
        run_attention(*t_, p.args(), 2);
        // bf16's unit roundoff eps = 2^-9: the output's rounding is eps |ref|; the tile path's
        // bf16 weights move a value by at most eps max|v|; twice each covers fp32's sums.
        const double eps = std::ldexp(1.0, -9);
        const bool tiles = on_tiles(GetParam(), sh.dim);
        for (int64_t b = 0; b < sh.batch; ++b)
          for (int64_t h = 0; h < sh.heads; ++h)
            for (int64_t t = 0; t < sh.q_len; ++t) {
              double vmax = 0;
              const std::vector<double> ref = p.reference(b, t, h, &vmax);
              for (int64_t i = 0; i < sh.dim; ++i) {
                const double got = p.out.value(b, t, h, i);
                const double bound =
                    2 * eps * std::fabs(ref[i]) + (tiles ? 2 * eps : std::ldexp(1.0, -14)) * vmax;
                ASSERT_LE(std::fabs(got - ref[i]), bound)
                    << "shape " << sh.batch << "x" << sh.heads << "/" << sh.kv_heads << " q "
                    << sh.q_len << " kv " << sh.kv_len << " d " << sh.dim << " head_major "
                    << head_major << " q_sigma " << q_sigma << " at b " << b << " h " << h << " t "
                    << t << " i " << i;
              }
              for (int64_t i = sh.dim; i < p.out.row; ++i)
                ASSERT_EQ(p.out.at(b, t, h, i), kPoison) << "the gap past an output row";
            }
      }
}

TEST_P(SequenceAttention, OneTwoAndThreeThreadsAgreeBitwise) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const Shape& sh : {Shape{2, 3, 1, 50, 140, 72}, Shape{1, 2, 2, 33, 70, 130}}) {
    std::vector<std::vector<uint16_t>> outs;
    for (const int nth : {1, 2, 3}) {
      Problem p(sh, true, 2.0f, seed);
      run_attention(*t_, p.args(), nth);
      outs.push_back(p.out.data);
    }
    EXPECT_EQ(outs[0], outs[1]);
    EXPECT_EQ(outs[0], outs[2]);
  }
}

// The last key of a partial block (kv_len past a multiple of 16, 32 and 128) counts: it is
// made to dominate every query's softmax, so the output is its value row.
TEST_P(SequenceAttention, TheLastKeyOfAPartialBlockCounts) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const int64_t kv : {int64_t{129}, int64_t{161}, int64_t{257}, int64_t{17}}) {
    Problem p({1, 1, 1, 20, kv, 64}, false, 1.0f, seed);
    for (int64_t j = 0; j + 1 < kv; ++j) p.k.at(0, j, 0, 0) = narrow(0.0f);  // others: ~N(0, 1)
    for (int64_t i = 0; i < 64; ++i) p.k.at(0, kv - 1, 0, i) = narrow(i == 0 ? 1.0f : 0.0f);
    for (int64_t t = 0; t < 20; ++t) p.q.at(0, t, 0, 0) = narrow(200.0f);  // its score: 25
    run_attention(*t_, p.args(), 2);
    for (int64_t t = 0; t < 20; ++t) {
      double vmax = 0;
      const std::vector<double> ref = p.reference(0, t, 0, &vmax);
      for (int64_t i = 0; i < 64; ++i) {
        ASSERT_NEAR(ref[i], p.v.value(0, kv - 1, 0, i), 0.02 * vmax) << "the reference itself";
        ASSERT_LE(std::fabs(p.out.value(0, t, 0, i) - ref[i]),
                  std::ldexp(1.0, -8) * (std::fabs(ref[i]) + vmax))
            << "kv " << kv << " t " << t << " i " << i;
      }
    }
  }
}

// A key whose dot product overflows to -inf weighs nothing: every query's output is the other
// key's value.
TEST_P(SequenceAttention, AScoreOfMinusInfinityWeighsNothing) {
  Problem p({1, 1, 1, 3, 2, 8}, false, 1.0f, 7);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t i = 0; i < 8; ++i) p.q.at(0, t, 0, i) = narrow(i == 0 ? 1e20f : 0.0f);
  for (int64_t i = 0; i < 8; ++i) {
    p.k.at(0, 0, 0, i) = narrow(i == 0 ? -1e20f : 0.0f);  // q . k = -1e40: -inf in fp32
    p.k.at(0, 1, 0, i) = narrow(i == 0 ? 1.0f : 0.0f);
    p.v.at(0, 0, 0, i) = narrow(5.0f);
    p.v.at(0, 1, 0, i) = narrow(2.0f);
  }
  run_attention(*t_, p.args(), 1);
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(p.out.value(0, t, 0, i), 2.0) << t << " " << i;
}

// Every score of the first block(s) -inf, one finite key after them: the output is its value
// (the weights taken against 0 while the running maximum is -inf, not -inf - -inf).
TEST_P(SequenceAttention, BlocksOfMinusInfinityBeforeAFiniteKeyWeighNothing) {
  for (const int64_t kv : {int64_t{200}, int64_t{300}}) {
    Problem p({1, 1, 1, 18, kv, 8}, false, 1.0f, 11);
    for (int64_t t = 0; t < 18; ++t)
      for (int64_t i = 0; i < 8; ++i) p.q.at(0, t, 0, i) = narrow(i == 0 ? 1e20f : 0.0f);
    for (int64_t j = 0; j < kv; ++j)
      for (int64_t i = 0; i < 8; ++i) {
        p.k.at(0, j, 0, i) = narrow(i != 0 ? 0.0f : j == kv - 1 ? 1.0f : -1e20f);
        p.v.at(0, j, 0, i) = narrow(j == kv - 1 ? 3.0f : 5.0f);
      }
    run_attention(*t_, p.args(), 2);
    for (int64_t t = 0; t < 18; ++t)
      for (int64_t i = 0; i < 8; ++i)
        EXPECT_EQ(p.out.value(0, t, 0, i), 3.0) << "kv " << kv << " t " << t << " i " << i;
  }
}

// A negative scale (the largest weight on the least score) and a zero one (every key alike).
TEST_P(SequenceAttention, NegativeAndZeroScalesMatchFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const float scale : {-0.3f, 0.0f}) {
    Problem p({1, 2, 1, 20, 150, 72}, true, 2.0f, seed);
    p.scale = scale;
    run_attention(*t_, p.args(), 2);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < 20; ++t) {
        double vmax = 0;
        const std::vector<double> ref = p.reference(0, t, h, &vmax);
        for (int64_t i = 0; i < 72; ++i)
          ASSERT_LE(std::fabs(p.out.value(0, t, h, i) - ref[i]),
                    std::ldexp(1.0, -8) * (std::fabs(ref[i]) + vmax))
              << "scale " << scale << " h " << h << " t " << t << " i " << i;
      }
  }
}

// Threads that run at once (the core's pool of 3 through run_sequence_attention) write the bits
// one thread writes: no item depends on another's buffers.
TEST_P(SequenceAttention, ConcurrentThreadsWriteTheBitsOfOne) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Problem one({2, 3, 1, 70, 300, 72}, true, 2.0f, seed), three = one;
  run_attention(*t_, one.args(), 1);
  ThreadPool pool(3);
  for (int round = 0; round < 3; ++round)
    run_sequence_attention(
        *t_, pool, {view(three.q), view(three.k), view(three.v), view(three.out), three.scale});
  EXPECT_EQ(three.out.data, one.out.data);
}

// A NaN in one query reaches that query's outputs only; a NaN among the values reaches every
// query of the heads that read it, and no other head.
TEST_P(SequenceAttention, NaNStaysWithTheQueriesItReaches) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  const uint16_t nan = 0x7fc0;
  {
    Problem p({1, 2, 2, 20, 40, 72}, false, 1.0f, seed);
    p.q.at(0, 7, 1, 3) = nan;
    run_attention(*t_, p.args(), 2);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t t = 0; t < 20; ++t)
        for (int64_t i = 0; i < 72; ++i)
          ASSERT_EQ(std::isnan(p.out.value(0, t, h, i)), h == 1 && t == 7)
              << "h " << h << " t " << t << " i " << i;
  }
  {
    Problem p({1, 4, 2, 20, 40, 72}, true, 1.0f, seed);
    p.v.at(0, 33, 0, 5) = nan;  // KV head 0: query heads 0 and 1
    run_attention(*t_, p.args(), 2);
    for (int64_t h = 0; h < 4; ++h)
      for (int64_t t = 0; t < 20; ++t)
        ASSERT_EQ(std::isnan(p.out.value(0, t, h, 5)), h < 2) << "h " << h << " t " << t;
  }
}

TEST_P(SequenceAttention, RefusesWhatItDoesNotComputeByReason) {
  Problem p({1, 2, 1, 4, 8, 16}, false, 1.0f, 1);
  const frt_op* op = find_op(*t_, OpKind::sequence_attention);
  ASSERT_NE(op, nullptr);
  const auto refusal = [&](frt_sequence_attention_args a) {
    frt_error err{};
    return op->supports(&a, &err) == FRT_REASON_OK ? std::string() : std::string(err.message);
  };
  EXPECT_EQ(refusal(p.args()), "");
  frt_sequence_attention_args a = p.args();
  a.dtype = FRT_F32;
  EXPECT_NE(refusal(a).find("over f32: takes bf16"), std::string::npos) << refusal(a);
  for (const int64_t dim : {int64_t{0}, int64_t{513}}) {
    a = p.args();
    a.head_dim = dim;
    EXPECT_NE(refusal(a).find("head_dim 1..512"), std::string::npos) << refusal(a);
  }
  a = p.args();
  a.kv_heads = 3;  // 2 heads over 3 KV heads
  EXPECT_NE(refusal(a).find("a multiple of KV heads"), std::string::npos) << refusal(a);
  a = p.args();
  a.kv_len = 0;
  EXPECT_NE(refusal(a), "");
  a = p.args();
  a.q = nullptr;
  EXPECT_NE(refusal(a).find("missing q, k, v or output"), std::string::npos) << refusal(a);
  for (const float scale : {std::numeric_limits<float>::infinity(), 3e38f}) {
    a = p.args();
    a.scale = scale;
    EXPECT_NE(refusal(a).find("is not finite"), std::string::npos) << refusal(a);
  }
  a = p.args();
  a.kv_len = int64_t{1} << 50;  // packs of 2^57 elements
  EXPECT_NE(refusal(a).find("past what it indexes"), std::string::npos) << refusal(a);
  // Plan time: bf16 heads of 1..512.
  frt_op_desc d{};
  d.op = FRT_OP_SEQUENCE_ATTENTION;
  d.x_dtype = FRT_BF16;
  d.k = 72;
  EXPECT_EQ(form_refusal(*t_, d), "");
  d.x_dtype = FRT_F32;
  EXPECT_NE(form_refusal(*t_, d).find("over f32 heads of 72"), std::string::npos);
  d.x_dtype = FRT_BF16;
  d.k = 600;
  EXPECT_NE(form_refusal(*t_, d).find("heads of 1..512"), std::string::npos);
}

// The core's door to the op: views checked before anything runs, the output written after.
TEST_P(SequenceAttention, TheCoreChecksViewsAndRunsTheOp) {
  Problem p({1, 2, 1, 9, 20, 24}, true, 1.0f, 3);
  frt::SequenceAttention call{view(p.q), view(p.k), view(p.v), view(p.out), p.scale};
  EXPECT_EQ(sequence_attention_refusal(*t_, call), "");
  frt::SequenceAttention bad = call;
  bad.k.dtype = DType::f32;
  EXPECT_NE(sequence_attention_refusal(*t_, bad).find("key"), std::string::npos);
  bad = call;
  bad.v.shape[2] = 19;
  EXPECT_NE(sequence_attention_refusal(*t_, bad).find("value"), std::string::npos);
  bad = call;
  bad.q.rank = 3;
  EXPECT_NE(sequence_attention_refusal(*t_, bad).find("4-D"), std::string::npos);
  bad = call;
  bad.out.strides[3] = 2;
  EXPECT_NE(sequence_attention_refusal(*t_, bad).find("not contiguous"), std::string::npos);
  const std::vector<uint16_t> before = p.out.data;
  ThreadPool pool(2);
  bad = call;
  bad.k.dtype = DType::f32;
  EXPECT_THROW(run_sequence_attention(*t_, pool, bad), Refused);
  EXPECT_EQ(p.out.data, before) << "a refused call wrote its output";
  run_sequence_attention(*t_, pool, call);
  double vmax = 0;
  const std::vector<double> ref = p.reference(0, 4, 1, &vmax);
  for (int64_t i = 0; i < 24; ++i)
    EXPECT_LE(std::fabs(p.out.value(0, 4, 1, i) - ref[i]), std::ldexp(1.0, -8) * (vmax + 1));
}

INSTANTIATE_TEST_SUITE_P(Variants, SequenceAttention, ::testing::ValuesIn(kAmxIsas));

}  // namespace
}  // namespace frt
