// flashrt/decode's primitives in every variant this CPU runs, against float64 references on fresh
// random inputs, outputs poisoned first.
#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/cpu_features.h>
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
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

const frt_kernel_table* open_decode(const std::string& isa, std::string* skip) {
  return ktest::open_variant("decode", isa, skip);
}

std::vector<float> randn(int64_t n, std::mt19937_64& rng, float sd = 1.0f) {
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// Runs the package's single-phase op of `kind` once (phase 0, thread ith of nth). A package that
// does not list the op, or lists it with more than one phase, fails the test.
int32_t run_op(const frt_kernel_table& t, OpKind kind, const void* args, int32_t ith, int32_t nth,
               frt_error* err) {
  const frt_op* op = find_op(t, kind);
  EXPECT_NE(op, nullptr) << t.package << " lists no " << name_of(kind) << " op";
  if (op == nullptr) return FRT_E_UNSUPPORTED;
  EXPECT_EQ(op->phases, 1) << name_of(kind) << " is a single-phase primitive";
  return op->run(args, 0, ith, nth, err);
}

// Runs a single-phase op on 3 "threads" (sequentially), as the core's pool would split it.
template <typename Args>
void run3(const frt_kernel_table& t, OpKind kind, const Args& a) {
  for (int ith = 0; ith < 3; ++ith) {
    frt_error err{};
    ASSERT_EQ(run_op(t, kind, &a, ith, 3, &err), FRT_OK) << err.message;
  }
}

class DecodeKernels : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string skip;
    t_ = open_decode(GetParam(), &skip);
    if (t_ == nullptr) GTEST_SKIP() << skip;
    rng_.seed(std::random_device{}());
  }
  const frt_kernel_table* t_ = nullptr;
  std::mt19937_64 rng_;
};

TEST_P(DecodeKernels, RmsnormMatchesFloat64) {
  for (int64_t width : {1, 7, 64, 1000}) {
    const int64_t rows = 5;
    std::vector<float> x = randn(rows * width, rng_), w = randn(width, rng_);
    std::vector<float> y(rows * width, std::nanf(""));
    frt_rmsnorm_args a{rows, width, x.data(), width, w.data(), 1e-6f, y.data(), width};
    run3(*t_, OpKind::rmsnorm, a);
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < width; ++i) ss += double(x[r * width + i]) * x[r * width + i];
      const double inv = 1.0 / std::sqrt(ss / width + 1e-6);
      for (int64_t i = 0; i < width; ++i)
        ASSERT_NEAR(y[r * width + i], w[i] * x[r * width + i] * inv,
                    1e-5 * (1 + std::fabs(w[i] * x[r * width + i] * inv)))
            << width << " " << r << " " << i;
    }
  }
}

TEST_P(DecodeKernels, RotaryMatchesFloat64) {
  const int64_t heads = 3, d = 64;
  std::vector<float> x = randn(heads * d, rng_), orig = x, c(d / 2), s(d / 2);
  for (int64_t i = 0; i < d / 2; ++i) c[i] = std::cos(0.37f * i), s[i] = std::sin(0.37f * i);
  frt_rotary_args a{heads, d, x.data(), c.data(), s.data()};
  run3(*t_, OpKind::rotary, a);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t i = 0; i < d / 2; ++i) {
      const double a1 = orig[h * d + i], a2 = orig[h * d + i + d / 2];
      ASSERT_NEAR(x[h * d + i], a1 * c[i] - a2 * s[i], 1e-5);
      ASSERT_NEAR(x[h * d + i + d / 2], a2 * c[i] + a1 * s[i], 1e-5);
    }
  frt_rotary_args odd{1, 7, x.data(), c.data(), s.data()};
  frt_error err{};
  EXPECT_NE(run_op(*t_, OpKind::rotary, &odd, 0, 1, &err), FRT_OK);
  EXPECT_NE(std::string(err.message).find("head_dim must be even"), std::string::npos);
}

// One query head's attention in float64 over n positions: element i of position t's key or value
// vector is at(k or v, t, i), wherever the cache under test keeps it.
template <typename At>
std::vector<double> head_reference(const float* q, int64_t n, int64_t d, double scale,
                                   double softcap, const std::vector<float>& k,
                                   const std::vector<float>& v, At at) {
  std::vector<double> p(n), out(d, 0.0);
  double mx = -1e300, total = 0;
  for (int64_t t = 0; t < n; ++t) {
    double dot = 0;
    for (int64_t i = 0; i < d; ++i) dot += double(q[i]) * at(k, t, i);
    p[t] = dot * scale;
    if (softcap > 0) p[t] = softcap * std::tanh(p[t] / softcap);
    mx = std::max(mx, p[t]);
  }
  for (double& x : p) total += (x = std::exp(x - mx));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t i = 0; i < d; ++i) out[i] += p[t] / total * at(v, t, i);
  return out;
}

// bf16's top half of an f32: the value a bf16 pool holds for x (rounded to nearest even).
uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

TEST_P(DecodeKernels, GroupedAttentionMatchesFloat64InBothCacheLayouts) {
  // head_dim 48 and 20 take the AVX2 8-wide and scalar tails, 64/80/96/128 the zmm paths (query
  // heads in pairs; a group of 3 ends on a single head); 1 KV head with 3 threads splits query
  // heads instead of groups. Each shape runs over the host's cache order [position][kv][d] and
  // the loop's [kv][max_len][d] (Note [KV cache layout]), plain and with softcapped scores (a cap
  // of 1.5 that bends most of these scores): through attention / capped_attention over f32, and
  // through cache_attention (kernel ABI 4.8) over f32 and over bf16 (the reference reads the bf16
  // values the cache holds).
  struct Shape {
    int64_t heads, kv, d, positions;
  };
  struct Cache {
    bool via_cache_op;
    int32_t dtype;
  };
  for (const Shape& sh :
       {Shape{8, 2, 48, 1}, Shape{8, 2, 48, 2}, Shape{8, 2, 48, 37}, Shape{16, 8, 128, 133},
        Shape{4, 1, 20, 6}, Shape{6, 6, 72, 5}, Shape{9, 3, 64, 40}, Shape{6, 2, 80, 19},
        Shape{4, 2, 96, 23}, Shape{2, 1, 128, 3}})
    for (bool per_head : {false, true})
      for (float softcap : {0.0f, 1.5f})
        for (const auto& [via_cache_op, dtype] :
             {Cache{false, FRT_F32}, Cache{true, FRT_F32}, Cache{true, FRT_BF16}}) {
          const int64_t heads = sh.heads, kv = sh.kv, d = sh.d, positions = sh.positions;
          const int64_t stride = positions + 3, max_len = positions + 5;
          const int64_t ld_pos = per_head ? d : kv * d, ld_head = per_head ? max_len * d : d;
          std::vector<float> q = randn(heads * d, rng_), kt = randn(positions * kv * d, rng_),
                             vt = randn(positions * kv * d, rng_);
          // kt/vt hold K and V as [t][g][i] (for a bf16 cache, the values it holds); the cache
          // holds them in the layout under test, in its dtype; NaN where nothing was written.
          if (dtype == FRT_BF16)
            for (std::vector<float>* x : {&kt, &vt})
              for (float& e : *x) e = from_bf16(to_bf16(e));
          std::vector<float> k(kv * max_len * d, std::nanf("")), v(k);
          std::vector<uint16_t> kb(k.size(), 0x7fc0), vb(kb);
          for (int64_t t = 0; t < positions; ++t)
            for (int64_t g = 0; g < kv; ++g)
              for (int64_t i = 0; i < d; ++i) {
                const int64_t at = t * ld_pos + g * ld_head + i, from = (t * kv + g) * d + i;
                k[at] = kt[from], v[at] = vt[from];
                kb[at] = to_bf16(kt[from]), vb[at] = to_bf16(vt[from]);
              }
          const bool bf16 = dtype == FRT_BF16;
          const void* kc = bf16 ? static_cast<const void*>(kb.data()) : k.data();
          const void* vc = bf16 ? static_cast<const void*>(vb.data()) : v.data();
          const float scale = 1.0f / std::sqrt(float(d));
          // Run once on three threads into `out`, once on one thread into `alone`.
          const auto run = [&](float* out, int nth) {
            frt_attention_args a{heads, kv,  d,       positions, q.data(), k.data(), v.data(),
                                 scale, out, nullptr, stride,    ld_pos,   ld_head};
            std::vector<float> scores(heads * stride);
            a.scores = scores.data();
            const frt_capped_attention_args capped{a, softcap};
            const frt_cache_attention_args cached{heads,    kv,      d,   positions,     dtype,
                                                  q.data(), kc,      vc,  ld_pos,        ld_head,
                                                  scale,    softcap, out, scores.data(), stride};
            const OpKind kind = via_cache_op  ? OpKind::cache_attention
                                : softcap > 0 ? OpKind::capped_attention
                                              : OpKind::attention;
            const void* args = via_cache_op  ? static_cast<const void*>(&cached)
                               : softcap > 0 ? static_cast<const void*>(&capped)
                                             : &a;
            for (int ith = 0; ith < nth; ++ith) {
              frt_error err{};
              ASSERT_EQ(run_op(*t_, kind, args, ith, nth, &err), FRT_OK) << err.message;
            }
          };
          std::vector<float> out(heads * d, std::nanf("")), alone(out);
          run(out.data(), 3);
          // One thread computes the same bits as three (Note [Grouped attention]).
          run(alone.data(), 1);
          EXPECT_EQ(std::memcmp(alone.data(), out.data(), out.size() * sizeof(float)), 0);
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t g = h / (heads / kv);
            const std::vector<double> want =
                head_reference(q.data() + h * d, positions, d, scale, softcap, kt, vt,
                               [&](const std::vector<float>& kv_t, int64_t t, int64_t i) {
                                 return double(kv_t[(t * kv + g) * d + i]);
                               });
            for (int64_t i = 0; i < d; ++i) {
              ASSERT_NEAR(out[h * d + i], want[i], 2e-5)
                  << heads << "/" << kv << " d=" << d << " positions " << positions << " "
                  << (per_head ? "per head" : "host order") << " softcap " << softcap << " "
                  << (via_cache_op ? "cache_attention " : "") << (bf16 ? "bf16" : "f32") << " " << h
                  << " " << i;
            }
          }
        }
}

TEST_P(DecodeKernels, PagedAttentionMatchesFloat64OverScatteredSlots) {
  // A pool of slots shared by the rows, each row's positions at shuffled slots named by its table
  // line (lines in another order than the rows), f32 and bf16 pools, heads in groups, head_dim
  // 128 / 64 (vector paths), 72 / 80 / 96 (16- and 8-wide passes) and 20 (tails), a slot stride
  // wider than the heads (a padded pool), softcapped scores; 3 threads against 1 give the same bits
  // (Note [Paged attention]).
  struct Shape {
    int64_t batch, heads, kv, d;
  };
  for (const Shape& sh :
       {Shape{16, 16, 8, 128}, Shape{3, 9, 3, 64}, Shape{1, 4, 1, 20}, Shape{5, 8, 8, 128},
        Shape{2, 6, 2, 72}, Shape{2, 4, 2, 96}, Shape{2, 4, 4, 80}})
    for (int32_t dtype : {FRT_F32, FRT_BF16})
      for (float softcap : {0.0f, 1.5f}) {
        const int64_t b = sh.batch, heads = sh.heads, kv = sh.kv, d = sh.d;
        const int64_t slots = 1200, width = 64, lines = b + 2, ld_slot = kv * d + 8, ld_head = d;
        std::vector<int64_t> rows(b), lengths(b);
        std::vector<int32_t> table(lines * width, -1);
        std::vector<int32_t> perm(slots);
        for (int32_t s = 0; s < slots; ++s) perm[s] = s;
        std::shuffle(perm.begin(), perm.end(), rng_);
        int64_t used = 0;
        for (int64_t r = 0; r < b; ++r) {
          rows[r] = (r * 7 + 1) % lines;
          lengths[r] = 1 + static_cast<int64_t>(rng_() % (width - 1));  // at most 16 * 63 slots
          for (int64_t t = 0; t < lengths[r]; ++t) table[rows[r] * width + t] = perm[used++];
        }
        std::vector<float> k = randn(slots * ld_slot, rng_), v = randn(slots * ld_slot, rng_);
        std::vector<uint16_t> k16(k.size()), v16(v.size());
        for (size_t i = 0; i < k.size(); ++i) {
          k16[i] = to_bf16(k[i]);
          v16[i] = to_bf16(v[i]);
          if (dtype == FRT_BF16) k[i] = from_bf16(k16[i]), v[i] = from_bf16(v16[i]);
        }
        const int64_t ld_q = heads * d + 16;
        std::vector<float> q = randn(b * ld_q, rng_);
        std::vector<float> out(b * heads * d, std::nanf("")), scores(b * heads * width);
        const float scale = 1.0f / std::sqrt(float(d));
        frt_paged_attention_args a{};
        a.batch = b;
        a.heads = heads;
        a.kv_heads = kv;
        a.head_dim = d;
        a.cache_dtype = dtype;
        a.q = q.data();
        a.ld_q = ld_q;
        a.k_pool = dtype == FRT_F32 ? static_cast<const void*>(k.data()) : k16.data();
        a.v_pool = dtype == FRT_F32 ? static_cast<const void*>(v.data()) : v16.data();
        a.slots = slots;
        a.ld_slot = ld_slot;
        a.ld_head = ld_head;
        a.table = table.data();
        a.table_lines = lines;
        a.table_width = width;
        a.ld_table = width;
        a.rows = rows.data();
        a.lengths = lengths.data();
        a.scale = scale;
        a.softcap = softcap;
        a.out = out.data();
        a.ld_out = heads * d;
        a.scores = scores.data();
        a.scores_stride = width;
        run3(*t_, OpKind::paged_attention, a);
        std::vector<float> alone(out.size(), std::nanf(""));
        frt_paged_attention_args one = a;
        one.out = alone.data();
        frt_error err{};
        ASSERT_EQ(run_op(*t_, OpKind::paged_attention, &one, 0, 1, &err), FRT_OK) << err.message;
        EXPECT_EQ(std::memcmp(alone.data(), out.data(), out.size() * sizeof(float)), 0);
        for (int64_t r = 0; r < b; ++r)
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t g = h / (heads / kv), n = lengths[r];
            const std::vector<double> want = head_reference(
                q.data() + r * ld_q + h * d, n, d, scale, softcap, k, v,
                [&](const std::vector<float>& pool, int64_t t, int64_t i) {
                  return double(pool[table[rows[r] * width + t] * ld_slot + g * ld_head + i]);
                });
            for (int64_t i = 0; i < d; ++i) {
              ASSERT_NEAR(out[(r * heads + h) * d + i], want[i], 2e-5)
                  << heads << "/" << kv << " d=" << d << " row " << r << " of length " << n
                  << (dtype == FRT_BF16 ? " bf16" : " f32") << " softcap " << softcap << " head "
                  << h << " " << i;
            }
          }
        // A slot outside the pool is an error before anything is read or written.
        table[rows[0] * width] = static_cast<int32_t>(slots);
        std::vector<float> untouched(out.size(), 7.0f);
        one.out = untouched.data();
        EXPECT_NE(run_op(*t_, OpKind::paged_attention, &one, 0, 1, &err), FRT_OK);
        EXPECT_NE(std::string(err.message).find("a slot outside the pool"), std::string::npos)
            << err.message;
        EXPECT_EQ(untouched, std::vector<float>(out.size(), 7.0f));
        table[rows[0] * width] = perm[0];
        one.table_lines = rows[0];  // row 0's line past the table's end
        EXPECT_NE(run_op(*t_, OpKind::paged_attention, &one, 0, 1, &err), FRT_OK);
        EXPECT_NE(std::string(err.message).find("table line or length is out of range"),
                  std::string::npos)
            << err.message;
        EXPECT_EQ(untouched, std::vector<float>(out.size(), 7.0f));
      }
}

TEST_P(DecodeKernels, DenseMatchesFloat64ForF32AndBf16Weights) {
  for (int64_t k : {1, 9, 128, 1003})
    for (int32_t wdt : {FRT_F32, FRT_BF16}) {
      const int64_t m = 3, n = 21, ldw = k + 4;
      std::vector<float> x = randn(m * k, rng_), wf = randn(n * ldw, rng_), bias = randn(n, rng_);
      std::vector<uint16_t> wb(n * ldw);
      for (int64_t i = 0; i < n * ldw; ++i) {
        uint32_t bits;
        std::memcpy(&bits, &wf[i], 4);
        wb[i] = static_cast<uint16_t>(bits >> 16);
        bits &= 0xffff0000u;
        std::memcpy(&wf[i], &bits, 4);  // the value the bf16 weight holds
      }
      std::vector<float> y(m * n, std::nanf(""));
      frt_dense_args a{wdt,
                       m,
                       n,
                       k,
                       x.data(),
                       k,
                       wdt == FRT_F32 ? static_cast<const void*>(wf.data()) : wb.data(),
                       ldw,
                       bias.data(),
                       y.data(),
                       n};
      run3(*t_, OpKind::dense, a);
      for (int64_t r = 0; r < m; ++r)
        for (int64_t c = 0; c < n; ++c) {
          double want = bias[c], mag = std::fabs(bias[c]);
          for (int64_t i = 0; i < k; ++i) {
            want += double(x[r * k + i]) * wf[c * ldw + i];
            mag += std::fabs(double(x[r * k + i]) * wf[c * ldw + i]);
          }
          ASSERT_NEAR(y[r * n + c], want, 1e-5 * mag + 1e-6) << k << " " << r << " " << c;
        }
    }
}

// act(g) * u against float64, every split the same bits (elementwise), in place over the gate.
TEST_P(DecodeKernels, GatedActivationMatchesFloat64AndAnySplit) {
  for (int32_t act : {FRT_ACT_SILU, FRT_ACT_GELU_TANH, FRT_ACT_GELU}) {
    for (int64_t n : {1, 15, 16, 200, 1000, 1003}) {
      std::vector<float> g = randn(n, rng_, 3.0f), u = randn(n, rng_);
      std::vector<float> whole(n, std::nanf("")), split = g;
      frt_gated_act_args one{act, n, g.data(), u.data(), whole.data()};
      frt_error err{};
      ASSERT_EQ(run_op(*t_, OpKind::gated_act, &one, 0, 1, &err), FRT_OK) << err.message;
      frt_gated_act_args inplace{act, n, split.data(), u.data(), split.data()};
      run3(*t_, OpKind::gated_act, inplace);
      for (int64_t i = 0; i < n; ++i) {
        const double x = g[i];
        const double a =
            act == FRT_ACT_SILU ? x / (1 + std::exp(-x))
            : act == FRT_ACT_GELU_TANH
                ? 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
                : 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
        ASSERT_NEAR(whole[i], a * u[i], 2e-6 * (1 + std::fabs(a * u[i]))) << act << " " << i;
        ASSERT_EQ(std::memcmp(&whole[i], &split[i], sizeof(float)), 0) << act << " " << i;
      }
    }
  }
}

TEST_P(DecodeKernels, BadArgumentsAreErrorsNotCrashes) {
  frt_error err{};
  frt_dense_args d{};
  EXPECT_NE(run_op(*t_, OpKind::dense, &d, 0, 1, &err), FRT_OK);
  frt_attention_args at{};
  at.heads = 3;
  at.kv_heads = 2;
  EXPECT_NE(run_op(*t_, OpKind::attention, &at, 0, 1, &err), FRT_OK);
  // A cache stride below head_dim would read rows over each other.
  std::vector<float> q(2 * 8), kv(4 * 8), out(2 * 8), scores(2 * 4);  // [heads][4]
  frt_attention_args narrow{
      2, 1, 8, 4, q.data(), kv.data(), kv.data(), 1.0f, out.data(), scores.data(), 4, 7, 8};
  EXPECT_NE(run_op(*t_, OpKind::attention, &narrow, 0, 1, &err), FRT_OK);
  EXPECT_NE(std::string(err.message).find("attention: bad arguments"), std::string::npos);
  // cache_attention over a dtype it does not read (f16), with a negative or infinite softcap, or
  // without q: an error, not a misread; the same arguments over f32 run.
  const frt_cache_attention_args cached{2,         1, 8, 4,    FRT_F32, q.data(),   kv.data(),
                                        kv.data(), 8, 8, 1.0f, 0.0f,    out.data(), scores.data(),
                                        4};
  EXPECT_EQ(run_op(*t_, OpKind::cache_attention, &cached, 0, 1, &err), FRT_OK) << err.message;
  frt_cache_attention_args f16 = cached, negative = cached, infinite = cached, no_q = cached;
  f16.cache_dtype = FRT_F16;
  negative.softcap = -1.0f;
  infinite.softcap = std::numeric_limits<float>::infinity();
  no_q.q = nullptr;
  for (const frt_cache_attention_args* bad : {&f16, &negative, &infinite, &no_q}) {
    EXPECT_NE(run_op(*t_, OpKind::cache_attention, bad, 0, 1, &err), FRT_OK);
    EXPECT_NE(std::string(err.message).find("attention: bad arguments"), std::string::npos);
  }
  EXPECT_NE(run_op(*t_, OpKind::rmsnorm, nullptr, 0, 1, &err), FRT_OK);
  // A softcap of zero (or below) is no cap: an error, not a division by zero.
  std::vector<float> q1(8, 1.0f), kv1(8, 1.0f), out1(8), scores1(1);
  frt_capped_attention_args uncapped{
      {1, 1, 8, 1, q1.data(), kv1.data(), kv1.data(), 1.0f, out1.data(), scores1.data(), 1, 8, 8},
      0.0f};
  EXPECT_NE(run_op(*t_, OpKind::capped_attention, &uncapped, 0, 1, &err), FRT_OK);
  EXPECT_NE(std::string(err.message).find("softcap must be positive"), std::string::npos);
  // An activation no kernel computes, or a missing buffer: an error, nothing written.
  std::vector<float> g(4, 1.0f), u(4, 1.0f), act_out(4, 7.0f);
  frt_gated_act_args relu{100, 4, g.data(), u.data(), act_out.data()};
  EXPECT_NE(run_op(*t_, OpKind::gated_act, &relu, 0, 1, &err), FRT_OK);
  EXPECT_NE(std::string(err.message).find("gated activation: bad arguments"), std::string::npos);
  frt_gated_act_args no_up{FRT_ACT_SILU, 4, g.data(), nullptr, act_out.data()};
  EXPECT_NE(run_op(*t_, OpKind::gated_act, &no_up, 0, 1, &err), FRT_OK);
  EXPECT_EQ(act_out, std::vector<float>(4, 7.0f));
}

TEST_P(DecodeKernels, ListsItsPrimitivesAndAnswersPlanTimeQuestions) {
  EXPECT_EQ(t_->n_ops, 8);
  for (OpKind kind :
       {OpKind::rmsnorm, OpKind::rotary, OpKind::attention, OpKind::dense, OpKind::capped_attention,
        OpKind::gated_act, OpKind::paged_attention, OpKind::cache_attention}) {
    const frt_op* op = find_op(*t_, kind);
    ASSERT_NE(op, nullptr) << name_of(kind);
    EXPECT_EQ(op->phases, 1) << name_of(kind);
  }
  EXPECT_EQ(find_op(*t_, OpKind::linear), nullptr);
  frt_op_desc dense{};
  dense.op = FRT_OP_DENSE;
  dense.rows_max = FRT_MAX_ROWS;
  EXPECT_EQ(form_refusal(*t_, dense), "");
  dense.rows_max = FRT_MAX_ROWS + 1;
  EXPECT_NE(form_refusal(*t_, dense).find("outside 1..16"), std::string::npos)
      << form_refusal(*t_, dense);
  frt_op_desc linear{};
  linear.op = FRT_OP_LINEAR;
  EXPECT_NE(form_refusal(*t_, linear).find("provides no linear op"), std::string::npos)
      << form_refusal(*t_, linear);
  // A primitive has one phase: asking for a second is an error, not a silent no-op.
  std::vector<float> x(8, 1.0f), w(8, 1.0f), y(8);
  frt_rmsnorm_args a{1, 8, x.data(), 8, w.data(), 1e-6f, y.data(), 8};
  frt_error err{};
  EXPECT_NE(find_op(*t_, OpKind::rmsnorm)->run(&a, 1, 0, 1, &err), FRT_OK);
}

INSTANTIATE_TEST_SUITE_P(Variants, DecodeKernels, ::testing::ValuesIn(ktest::kIsas));

}  // namespace
}  // namespace frt
