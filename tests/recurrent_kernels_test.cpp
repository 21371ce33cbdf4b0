// flashrt/recurrent's gated delta rule and causal convolution in every variant this CPU runs,
// against float64 references of the published recurrences on fresh random inputs, outputs and
// gaps poisoned first, split over 3 threads and over 1 (the same bits either way).
#include <flashrt/abi/frt_kernel_abi.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace frt {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr uint16_t kPoison = 0x7fc1;  // a bf16 NaN

const frt_op* find_kind(const frt_kernel_table& t, int32_t kind) {
  for (int32_t i = 0; i < t.n_ops; ++i)
    if (t.ops[i].kind == kind) return &t.ops[i];
  return nullptr;
}

// Elements in f32 or bf16 storage, poisoned (NaN) until set. set() stores v as the dtype holds it
// (bf16: rounded to nearest even) and returns that value, so a reference reads what the kernel
// reads.
struct Buf {
  int32_t dtype;
  std::vector<float> f;
  std::vector<uint16_t> h;

  Buf(int32_t dt, int64_t n) : dtype(dt), f(dt == FRT_F32 ? n : 0, kNaN) {
    if (dt == FRT_BF16) h.assign(n, kPoison);
  }
  double set(int64_t i, float v) {
    if (dtype == FRT_F32) return f[i] = v;
    v = ktest::to_bf16_value(v);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    h[i] = static_cast<uint16_t>(bits >> 16);
    return v;
  }
  double get(int64_t i) const {
    if (dtype == FRT_F32) return f[i];
    const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  }
  int64_t size() const { return dtype == FRT_F32 ? f.size() : h.size(); }
  void* at(int64_t i) {
    return dtype == FRT_F32 ? static_cast<void*>(f.data() + i) : static_cast<void*>(h.data() + i);
  }
  bool same_bits(const Buf& o) const {  // bitwise: NaN gaps compare equal
    return f.size() == o.f.size() && h == o.h &&
           (f.empty() || std::memcmp(f.data(), o.f.data(), f.size() * sizeof(float)) == 0);
  }
};

// The value bf16 storage gives the kernel's fp32 result: half an ulp of bf16 (2^-9), and as much
// again for the fp32 result's own error near a rounding boundary.
double output_rounding(int32_t dt) { return dt == FRT_BF16 ? 1.0 / 256 : 0.0; }

// Runs op `kind` on nth threads one after another (ith = 0..nth-1), as the core's pool would.
template <typename Args>
void run_threads(const frt_kernel_table& t, int32_t kind, const Args& a, int32_t nth) {
  const frt_op* op = find_kind(t, kind);
  ASSERT_NE(op, nullptr) << t.package << " lists no op of kind " << kind;
  frt_error err{};
  ASSERT_EQ(op->supports(&a, &err), FRT_REASON_OK) << err.message;
  for (int32_t ith = 0; ith < nth; ++ith)
    ASSERT_EQ(op->run(&a, 0, ith, nth, &err), FRT_OK) << err.message;
}

class RecurrentKernels : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string skip;
    t_ = ktest::open_variant("recurrent", GetParam(), &skip);
    if (t_ == nullptr) GTEST_SKIP() << skip;
    const uint64_t seed = ktest::fresh_seed();
    std::printf("seed %llu\n", static_cast<unsigned long long>(seed));
    rng_.seed(seed);
  }
  const frt_kernel_table* t_ = nullptr;
  std::mt19937_64 rng_;
};

// ---- The gated delta rule. -------------------------------------------------------------------

enum class Init { none, separate, aliased };  // the initial state: NULL, its own, final_state's

struct GdCase {
  int64_t batch, tokens, k_heads, v_heads, k_dim, v_dim;
  bool l2norm;
  Init init;
  bool strided;  // q, k, v slices of one [tokens, channels] row; g and beta rows padded
  int32_t dtype;
  // q, k, v channels of a [channels, tokens] block, as a host's convolution output hands them:
  // a vector's elements `tokens` apart (q_inc, k_inc, v_inc).
  bool channel_major = false;
};

std::string describe(const GdCase& c) {
  return "batch " + std::to_string(c.batch) + " tokens " + std::to_string(c.tokens) + " heads " +
         std::to_string(c.k_heads) + "/" + std::to_string(c.v_heads) + " dims " +
         std::to_string(c.k_dim) + "x" + std::to_string(c.v_dim) + (c.l2norm ? " l2norm" : "") +
         (c.init == Init::none       ? " zero state"
          : c.init == Init::separate ? " initial state"
                                     : " aliased state") +
         (c.strided ? " strided" : "") + (c.channel_major ? " channel-major" : "") +
         (c.dtype == FRT_BF16 ? " bf16" : " f32");
}

// The inputs of one case, its args (state pointers left to the caller) and the float64 result.
struct GdProblem {
  GdCase c;
  Buf x;     // q, k and v
  Buf beta;  // in the case's dtype
  std::vector<float> g, init;
  frt_gated_delta_args args{};
  std::vector<double> out, state;  // the reference: [b][t][h][v] and [b][h][k][v]

  GdProblem(const GdCase& c_, std::mt19937_64& rng) : c(c_), x(c_.dtype, 0), beta(c_.dtype, 0) {
    const int64_t B = c.batch, T = c.tokens, HK = c.k_heads, HV = c.v_heads, K = c.k_dim,
                  V = c.v_dim;
    // Where q, k, v, g and beta stand: one row of all channels per token, with a gap, or three
    // contiguous tensors.
    const int64_t qk = HK * K, row = 2 * qk + HV * V + 5;
    int64_t qo = 0, ko, vo, inc = 1;
    if (c.channel_major) {
      const int64_t channels = 2 * qk + HV * V;
      x = Buf(c.dtype, B * T * channels);
      ko = qk * T;
      vo = 2 * qk * T;
      inc = T;
      for (int64_t* ld : {args.q_ld, args.k_ld}) ld[0] = channels * T, ld[1] = 1, ld[2] = K * T;
      args.v_ld[0] = channels * T, args.v_ld[1] = 1, args.v_ld[2] = V * T;
      args.q_inc = args.k_inc = args.v_inc = T;
    } else if (c.strided) {
      x = Buf(c.dtype, B * T * row);
      ko = qk;
      vo = 2 * qk;
      for (int64_t* ld : {args.q_ld, args.k_ld}) ld[0] = T * row, ld[1] = row, ld[2] = K;
      args.v_ld[0] = T * row, args.v_ld[1] = row, args.v_ld[2] = V;
    } else {
      x = Buf(c.dtype, B * T * (2 * qk + HV * V));
      ko = B * T * qk;
      vo = 2 * B * T * qk;
      for (int64_t* ld : {args.q_ld, args.k_ld}) ld[0] = T * qk, ld[1] = qk, ld[2] = K;
      args.v_ld[0] = T * HV * V, args.v_ld[1] = HV * V, args.v_ld[2] = V;
    }
    const int64_t gl = HV + (c.strided ? 3 : 0);
    g.assign(B * T * gl, kNaN);
    beta = Buf(c.dtype, B * T * gl);
    args.g_ld[0] = args.beta_ld[0] = T * gl;
    args.g_ld[1] = args.beta_ld[1] = gl;
    // Without the l2 norm, keys of about unit length keep the delta rule contractive.
    std::normal_distribution<float> qkd(0.0f, c.l2norm ? 1.0f : 1.0f / std::sqrt(float(K)));
    std::normal_distribution<float> vd(0.0f, 1.0f), sd(0.0f, 0.3f);
    std::uniform_real_distribution<float> gd(-2.0f, 0.0f), bd(0.05f, 1.0f);
    auto q_at = [&](int64_t b, int64_t t, int64_t j) {
      return qo + b * args.q_ld[0] + t * args.q_ld[1] + j * args.q_ld[2];
    };
    auto k_at = [&](int64_t b, int64_t t, int64_t j) {
      return ko + b * args.k_ld[0] + t * args.k_ld[1] + j * args.k_ld[2];
    };
    auto v_at = [&](int64_t b, int64_t t, int64_t j) {
      return vo + b * args.v_ld[0] + t * args.v_ld[1] + j * args.v_ld[2];
    };
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t j = 0; j < HK; ++j)
          for (int64_t i = 0; i < K; ++i) {
            x.set(q_at(b, t, j) + i * inc, qkd(rng));
            x.set(k_at(b, t, j) + i * inc, qkd(rng));
          }
        for (int64_t j = 0; j < HV; ++j) {
          for (int64_t i = 0; i < V; ++i) x.set(v_at(b, t, j) + i * inc, vd(rng));
          g[b * args.g_ld[0] + t * args.g_ld[1] + j] = gd(rng);
          beta.set(b * args.beta_ld[0] + t * args.beta_ld[1] + j, bd(rng));
        }
      }
    if (c.init != Init::none) {
      init.resize(B * HV * K * V);
      for (float& s : init) s = sd(rng);
    }
    args.batch = B, args.tokens = T, args.k_heads = HK, args.v_heads = HV;
    args.k_dim = K, args.v_dim = V;
    args.x_dtype = args.beta_dtype = c.dtype;
    args.l2norm = c.l2norm;
    args.l2_eps = 1e-6f;
    args.scale = 1.0f / std::sqrt(float(K));
    args.q = x.at(qo), args.k = x.at(ko), args.v = x.at(vo);
    args.g = g.data();
    args.beta = beta.at(0);

    // The reference: S <- e^g S; d = beta (v - S^T k); S <- S + k d^T; o = S^T q, in float64.
    out.assign(B * T * HV * V, 0.0);
    state.assign(B * HV * K * V, 0.0);
    std::vector<double> q(K), k(K), d(V);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < HV; ++h) {
        double* S = state.data() + (b * HV + h) * K * V;
        for (int64_t i = 0; i < K * V && c.init != Init::none; ++i)
          S[i] = init[S - state.data() + i];
        const int64_t kh = h / (HV / HK);
        for (int64_t t = 0; t < T; ++t) {
          double qq = 0, kk = 0;
          for (int64_t i = 0; i < K; ++i) {
            q[i] = x.get(q_at(b, t, kh) + i * inc);
            k[i] = x.get(k_at(b, t, kh) + i * inc);
            qq += q[i] * q[i];
            kk += k[i] * k[i];
          }
          const double qn = c.l2norm ? 1.0 / std::sqrt(qq + args.l2_eps) : 1.0;
          const double kn = c.l2norm ? 1.0 / std::sqrt(kk + args.l2_eps) : 1.0;
          for (int64_t i = 0; i < K; ++i) q[i] *= qn * args.scale, k[i] *= kn;
          const double a = std::exp(double(g[b * args.g_ld[0] + t * args.g_ld[1] + h]));
          const double bt = beta.get(b * args.beta_ld[0] + t * args.beta_ld[1] + h);
          for (int64_t i = 0; i < K * V; ++i) S[i] *= a;
          for (int64_t j = 0; j < V; ++j) {
            double kv = 0;
            for (int64_t i = 0; i < K; ++i) kv += S[i * V + j] * k[i];
            d[j] = bt * (x.get(v_at(b, t, h) + j * inc) - kv);
          }
          double* o = out.data() + ((b * T + t) * HV + h) * V;
          for (int64_t i = 0; i < K; ++i)
            for (int64_t j = 0; j < V; ++j) S[i * V + j] += k[i] * d[j];
          for (int64_t j = 0; j < V; ++j) {
            double sum = 0;
            for (int64_t i = 0; i < K; ++i) sum += S[i * V + j] * q[i];
            o[j] = sum;
          }
        }
      }
  }

  // Runs the case on nth threads into fresh, poisoned out and final state.
  void run(const frt_kernel_table& t, Buf& o, std::vector<float>& fin, int32_t nth) {
    o = Buf(c.dtype, c.batch * c.tokens * c.v_heads * c.v_dim);
    fin = c.init == Init::aliased ? init : std::vector<float>(state.size(), kNaN);
    frt_gated_delta_args a = args;
    a.initial_state = c.init == Init::none      ? nullptr
                      : c.init == Init::aliased ? fin.data()
                                                : init.data();
    a.final_state = fin.data();
    a.out = o.at(0);
    run_threads(t, FRT_OP_GATED_DELTA, a, nth);
  }
};

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::fabs(x));
  return m;
}

TEST_P(RecurrentKernels, GatedDeltaMatchesFloat64) {
  int checked = 0;
  for (int64_t tokens : {1, 7, 65})
    for (auto [k_dim, v_dim] : {std::pair<int64_t, int64_t>{32, 24}, {128, 128}})
      for (bool l2norm : {true, false})
        for (Init init : {Init::none, Init::separate, Init::aliased})
          for (int layout : {0, 1, 2})
            for (int32_t dt : {FRT_F32, FRT_BF16}) {
              const GdCase c{2,      tokens, 2,           4,  k_dim,      v_dim,
                             l2norm, init,   layout == 1, dt, layout == 2};
              SCOPED_TRACE(describe(c));
              GdProblem p(c, rng_);
              Buf out3(dt, 0), out1(dt, 0);
              std::vector<float> fin3, fin1;
              p.run(*t_, out3, fin3, 3);
              if (HasFatalFailure()) return;
              // fp32 rounding over k_dim-long sums and tokens of recurrence, against the scale of
              // the whole output; bf16 storage adds its rounding per element.
              const double tol = 2e-5 * max_abs(p.out), rel = output_rounding(dt);
              for (int64_t i = 0; i < out3.size(); ++i)
                ASSERT_LE(std::fabs(out3.get(i) - p.out[i]), tol + rel * std::fabs(p.out[i]))
                    << "out " << i << " = " << out3.get(i) << ", want " << p.out[i];
              const double stol = 2e-5 * max_abs(p.state);
              for (size_t i = 0; i < fin3.size(); ++i)
                ASSERT_LE(std::fabs(fin3[i] - p.state[i]), stol)
                    << "final state " << i << " = " << fin3[i] << ", want " << p.state[i];
              // Note [Column blocks of the state]: one thread writes the bits three do.
              p.run(*t_, out1, fin1, 1);
              EXPECT_TRUE(out1.same_bits(out3));
              EXPECT_EQ(std::memcmp(fin1.data(), fin3.data(), fin1.size() * sizeof(float)), 0);
              ++checked;
            }
  EXPECT_EQ(checked, 3 * 2 * 2 * 3 * 3 * 2);
}

TEST_P(RecurrentKernels, GatedDeltaTakesOddAndWidestKeys) {
  // More threads than items (1 sequence, 1 head, 1 block, a key width off the chains), and the
  // widest key (k_dim 256, the whole state block on the stack) over 3 blocks, the last partial.
  for (auto [k_dim, v_dim] : {std::pair<int64_t, int64_t>{13, 5}, {256, 40}})
    for (int32_t nth : {1, 2, 5}) {
      const GdCase c{1, 3, 1, 1, k_dim, v_dim, true, Init::separate, false, FRT_F32};
      SCOPED_TRACE(describe(c) + " on " + std::to_string(nth) + " threads");
      GdProblem p(c, rng_);
      Buf out(FRT_F32, 0);
      std::vector<float> fin;
      p.run(*t_, out, fin, nth);
      if (HasFatalFailure()) return;
      for (int64_t i = 0; i < out.size(); ++i)
        ASSERT_NEAR(out.get(i), p.out[i], 2e-5 * max_abs(p.out)) << i;
      for (size_t i = 0; i < fin.size(); ++i)
        ASSERT_NEAR(fin[i], p.state[i], 2e-5 * max_abs(p.state)) << i;
    }
}

// ---- The causal convolution. ----------------------------------------------------------------

struct ConvCase {
  int64_t batch, channels, tokens, kernel;
  int64_t state_len;  // -1: no state (the fn form)
  bool bias;
  int32_t act;
  bool x_last, y_last;  // channels-last x (and state), channels-last y
  int32_t dtype;
};

std::string describe(const ConvCase& c) {
  return "batch " + std::to_string(c.batch) + " channels " + std::to_string(c.channels) +
         " tokens " + std::to_string(c.tokens) + " kernel " + std::to_string(c.kernel) +
         (c.state_len < 0 ? " no state" : " state_len " + std::to_string(c.state_len)) +
         (c.bias ? " bias" : "") + (c.act == FRT_ACT_SILU ? " silu" : "") +
         (c.x_last ? " x channels-last" : "") + (c.y_last ? " y channels-last" : "") +
         (c.dtype == FRT_BF16 ? " bf16" : " f32");
}

// Strides of a [batch][channels][len] tensor with a gap past each row: channels-major (len
// contiguous) or channels-last (channels contiguous).
void strides(bool last, int64_t channels, int64_t len, int64_t* ld, int64_t* size, int64_t batch) {
  if (last) {
    ld[0] = len * (channels + 3), ld[1] = 1, ld[2] = channels + 3;
  } else {
    ld[0] = channels * (len + 2), ld[1] = len + 2, ld[2] = 1;
  }
  *size = batch * ld[0] + 1;  // never empty, so a state of length 0 is still a pointer
}

TEST_P(RecurrentKernels, CausalConv1dMatchesFloat64) {
  int checked = 0;
  for (int32_t dt : {FRT_F32, FRT_BF16})
    for (int64_t kernel : {4, 1})
      for (int64_t form : {-1, 0, 1})  // no state, state_len kernel - 1, state_len kernel
        for (int64_t tokens : {1, 5, 70})
          for (bool bias : {false, true})
            for (int32_t act : {-1, int32_t{FRT_ACT_SILU}})
              for (auto [x_last, y_last] :
                   {std::pair{false, false}, std::pair{true, true}, std::pair{true, false}}) {
                const int64_t len = form < 0 ? -1 : kernel - 1 + form;
                const ConvCase c{2, 40, tokens, kernel, len, bias, act, x_last, y_last, dt};
                SCOPED_TRACE(describe(c));
                const int64_t B = c.batch, C = c.channels, T = c.tokens, K = c.kernel;
                frt_causal_conv1d_args a{};
                int64_t xs, ys, ss = 0;
                strides(x_last, C, T, a.x_ld, &xs, B);
                strides(y_last, C, T, a.y_ld, &ys, B);
                if (len >= 0) strides(x_last, C, len, a.state_ld, &ss, B);
                Buf x(dt, xs), w(dt, C * K), bs(dt, C), st(dt, ss);
                std::normal_distribution<float> nd(0.0f, 1.0f), wd(0.0f, 0.5f);
                auto x_at = [&](int64_t b, int64_t ch, int64_t t) {
                  return b * a.x_ld[0] + ch * a.x_ld[1] + t * a.x_ld[2];
                };
                auto s_at = [&](int64_t b, int64_t ch, int64_t p) {
                  return b * a.state_ld[0] + ch * a.state_ld[1] + p * a.state_ld[2];
                };
                auto y_at = [&](int64_t b, int64_t ch, int64_t t) {
                  return b * a.y_ld[0] + ch * a.y_ld[1] + t * a.y_ld[2];
                };
                for (int64_t b = 0; b < B; ++b)
                  for (int64_t ch = 0; ch < C; ++ch) {
                    for (int64_t t = 0; t < T; ++t) x.set(x_at(b, ch, t), nd(rng_));
                    for (int64_t p = 0; p < len; ++p) st.set(s_at(b, ch, p), nd(rng_));
                  }
                for (int64_t i = 0; i < C * K; ++i) w.set(i, wd(rng_));
                for (int64_t i = 0; i < C; ++i) bs.set(i, nd(rng_));
                a.batch = B, a.channels = C, a.tokens = T, a.kernel = K;
                a.dtype = dt, a.act = act;
                a.x = x.at(0), a.weight = w.at(0), a.bias = bias ? bs.at(0) : nullptr;
                a.state_len = len < 0 ? 0 : len;

                // The reference: w = state (or kernel - 1 zeros) ++ x, y[t] over its window, and
                // the state's last positions.
                std::vector<double> want_y(ys, std::nan("")), want_s(ss, std::nan("")), mag(ys);
                for (int64_t b = 0; b < B; ++b)
                  for (int64_t ch = 0; ch < C; ++ch) {
                    const int64_t L = len < 0 ? K - 1 : len;
                    std::vector<double> win(L + T, 0.0);
                    for (int64_t p = 0; p < len; ++p) win[p] = st.get(s_at(b, ch, p));
                    for (int64_t t = 0; t < T; ++t) win[L + t] = x.get(x_at(b, ch, t));
                    for (int64_t t = 0; t < T; ++t) {
                      double acc = bias ? bs.get(ch) : 0.0, m = std::fabs(acc);
                      for (int64_t j = 0; j < K; ++j) {
                        acc += w.get(ch * K + j) * win[L + t - (K - 1) + j];
                        m += std::fabs(w.get(ch * K + j) * win[L + t - (K - 1) + j]);
                      }
                      if (act == FRT_ACT_SILU) acc = acc / (1.0 + std::exp(-acc));
                      want_y[y_at(b, ch, t)] = acc;
                      mag[y_at(b, ch, t)] = m;
                    }
                    for (int64_t p = 0; p < len; ++p) want_s[s_at(b, ch, p)] = win[T + p];
                  }

                auto run_on = [&](int32_t nth, Buf& y, Buf& s) {
                  y = Buf(dt, ys);
                  s = st;
                  frt_causal_conv1d_args r = a;
                  r.y = y.at(0);
                  r.state = len < 0 ? nullptr : s.at(0);
                  run_threads(*t_, FRT_OP_CAUSAL_CONV1D, r, nth);
                };
                Buf y3(dt, 0), s3(dt, 0), y1(dt, 0), s1(dt, 0);
                run_on(3, y3, s3);
                if (HasFatalFailure()) return;
                for (int64_t i = 0; i < ys; ++i) {
                  if (std::isnan(want_y[i])) {  // a gap: left as it was
                    ASSERT_TRUE(std::isnan(y3.get(i))) << "y gap " << i;
                    continue;
                  }
                  ASSERT_NEAR(y3.get(i), want_y[i],
                              1e-5 * (mag[i] + 1) + output_rounding(dt) * std::fabs(want_y[i]))
                      << "y " << i;
                }
                for (int64_t i = 0; i < ss; ++i) {
                  if (std::isnan(want_s[i]))
                    ASSERT_TRUE(std::isnan(s3.get(i))) << "state gap " << i;
                  else
                    ASSERT_EQ(s3.get(i), want_s[i]) << "state " << i;  // copied, not computed
                }
                run_on(1, y1, s1);
                EXPECT_TRUE(y1.same_bits(y3));
                EXPECT_TRUE(s1.same_bits(s3));
                ++checked;
              }
  EXPECT_EQ(checked, 2 * 2 * 3 * 3 * 2 * 2 * 3);
}

// ---- Refusals. -------------------------------------------------------------------------------

// A refusal: the reason, and a message naming the form and what is wrong. run() refuses it too.
template <typename Args>
void expect_refused(const frt_op& op, const Args& a, int32_t reason, const std::string& form,
                    const std::string& why) {
  frt_error err{};
  EXPECT_EQ(op.supports(&a, &err), reason) << why;
  EXPECT_NE(std::string(err.message).find(form), std::string::npos) << err.message;
  EXPECT_NE(std::string(err.message).find(why), std::string::npos) << err.message;
  frt_error run_err{};
  EXPECT_EQ(op.run(&a, 0, 0, 1, &run_err), FRT_E_INVALID) << why;
  EXPECT_NE(std::string(run_err.message).find(why), std::string::npos) << run_err.message;
}

TEST_P(RecurrentKernels, GatedDeltaRefusesBadCalls) {
  const frt_op* op = find_kind(*t_, FRT_OP_GATED_DELTA);
  ASSERT_NE(op, nullptr);
  std::vector<float> q(8, 0.5f), g(1, -0.1f), beta(1, 0.5f), state(4 * 4), out(4);
  frt_gated_delta_args good{};
  good.batch = good.tokens = good.k_heads = good.v_heads = 1;
  good.k_dim = good.v_dim = 4;
  good.x_dtype = good.beta_dtype = FRT_F32;
  good.l2norm = 1;
  good.l2_eps = 1e-6f;
  good.scale = 0.5f;
  good.q = good.k = good.v = q.data();
  good.q_ld[1] = good.k_ld[1] = good.v_ld[1] = 4;
  good.g = g.data();
  good.beta = beta.data();
  good.final_state = state.data();
  good.out = out.data();
  frt_error err{};
  ASSERT_EQ(op->supports(&good, &err), FRT_REASON_OK) << err.message;
  EXPECT_EQ(op->run(&good, 0, 0, 1, &err), FRT_OK) << err.message;
  EXPECT_EQ(op->supports(nullptr, &err), FRT_REASON_LAYOUT);
  const std::string form = "gated delta (batch 1";
  auto with = [&](auto change) {
    frt_gated_delta_args a = good;
    change(a);
    return a;
  };
  using A = frt_gated_delta_args&;
  const std::string missing = "q, k, v, g and beta are required";
  expect_refused(*op, with([](A a) { a.q = nullptr; }), FRT_REASON_LAYOUT, form, missing);
  expect_refused(*op, with([](A a) { a.k = nullptr; }), FRT_REASON_LAYOUT, form, missing);
  expect_refused(*op, with([](A a) { a.v = nullptr; }), FRT_REASON_LAYOUT, form, missing);
  expect_refused(*op, with([](A a) { a.g = nullptr; }), FRT_REASON_LAYOUT, form, missing);
  expect_refused(*op, with([](A a) { a.beta = nullptr; }), FRT_REASON_LAYOUT, form, missing);
  const std::string outputs = "final_state and out are required";
  expect_refused(*op, with([](A a) { a.final_state = nullptr; }), FRT_REASON_LAYOUT, form, outputs);
  expect_refused(*op, with([](A a) { a.out = nullptr; }), FRT_REASON_LAYOUT, form, outputs);
  const std::string dims = "every dimension must be at least 1";
  expect_refused(*op, with([](A a) { a.batch = 0; }), FRT_REASON_SHAPE, "gated delta (batch 0",
                 dims);
  expect_refused(*op, with([](A a) { a.tokens = 0; }), FRT_REASON_SHAPE, "tokens 0", dims);
  expect_refused(*op, with([](A a) { a.k_heads = 0; }), FRT_REASON_SHAPE, "heads 0/1", dims);
  expect_refused(*op, with([](A a) { a.v_heads = -1; }), FRT_REASON_SHAPE, "heads 1/-1", dims);
  expect_refused(*op, with([](A a) { a.k_dim = 0; }), FRT_REASON_SHAPE, "k_dim 0", dims);
  expect_refused(*op, with([](A a) { a.v_dim = 0; }), FRT_REASON_SHAPE, "v_dim 0", dims);
  expect_refused(*op, with([](A a) { a.k_heads = 2, a.v_heads = 3; }), FRT_REASON_SHAPE,
                 "heads 2/3", "v_heads is not a multiple of k_heads");
  expect_refused(*op, with([](A a) { a.k_dim = 257; }), FRT_REASON_SHAPE, "k_dim 257",
                 "k_dim above 256");
  expect_refused(*op, with([](A a) { a.x_dtype = FRT_F16; }), FRT_REASON_DTYPE, "f16, beta f32",
                 "q, k, v and out must be f32 or bf16");
  expect_refused(*op, with([](A a) { a.beta_dtype = 7; }), FRT_REASON_DTYPE, "beta unknown dtype",
                 "beta must be f32 or bf16");
  expect_refused(*op, with([](A a) { a.scale = kNaN; }), FRT_REASON_FORMAT, form,
                 "scale is not finite");
  expect_refused(*op, with([](A a) { a.scale = INFINITY; }), FRT_REASON_FORMAT, form,
                 "scale is not finite");
  expect_refused(*op, with([](A a) { a.l2_eps = -1.0f; }), FRT_REASON_FORMAT, form,
                 "l2_eps must be finite and at least 0");
  // Without the l2 norm the epsilon is not read.
  const frt_gated_delta_args plain = with([](A a) { a.l2norm = 0, a.l2_eps = -1.0f; });
  EXPECT_EQ(op->supports(&plain, &err), FRT_REASON_OK) << err.message;
  // A bad thread split is an error, not a stray range.
  EXPECT_EQ(op->run(&good, 0, 1, 1, &err), FRT_E_INVALID);
  EXPECT_EQ(op->run(&good, 0, 0, 0, &err), FRT_E_INVALID);
}

TEST_P(RecurrentKernels, CausalConv1dRefusesBadCalls) {
  const frt_op* op = find_kind(*t_, FRT_OP_CAUSAL_CONV1D);
  ASSERT_NE(op, nullptr);
  std::vector<float> x(4, 1.0f), w(4, 0.25f), st(3, 0.0f), y(4);
  frt_causal_conv1d_args good{};
  good.batch = good.channels = 1;
  good.tokens = 4;
  good.kernel = 4;
  good.dtype = FRT_F32;
  good.act = FRT_ACT_SILU;
  good.x = x.data();
  good.x_ld[2] = good.y_ld[2] = good.state_ld[2] = 1;
  good.weight = w.data();
  good.state = st.data();
  good.state_len = 3;
  good.y = y.data();
  frt_error err{};
  ASSERT_EQ(op->supports(&good, &err), FRT_REASON_OK) << err.message;
  EXPECT_EQ(op->run(&good, 0, 0, 1, &err), FRT_OK) << err.message;
  EXPECT_EQ(op->supports(nullptr, &err), FRT_REASON_LAYOUT);
  const std::string form = "causal conv1d (batch 1, channels 1, tokens 4, kernel 4";
  auto with = [&](auto change) {
    frt_causal_conv1d_args a = good;
    change(a);
    return a;
  };
  using A = frt_causal_conv1d_args&;
  const std::string missing = "x, weight and y are required";
  expect_refused(*op, with([](A a) { a.x = nullptr; }), FRT_REASON_LAYOUT, form, missing);
  expect_refused(*op, with([](A a) { a.weight = nullptr; }), FRT_REASON_LAYOUT, form, missing);
  expect_refused(*op, with([](A a) { a.y = nullptr; }), FRT_REASON_LAYOUT, form, missing);
  const std::string dims = "every dimension must be at least 1";
  expect_refused(*op, with([](A a) { a.batch = 0; }), FRT_REASON_SHAPE, "(batch 0", dims);
  expect_refused(*op, with([](A a) { a.channels = 0; }), FRT_REASON_SHAPE, "channels 0", dims);
  expect_refused(*op, with([](A a) { a.tokens = 0; }), FRT_REASON_SHAPE, "tokens 0", dims);
  expect_refused(*op, with([](A a) { a.kernel = 0; }), FRT_REASON_SHAPE, "kernel 0", dims);
  expect_refused(*op, with([](A a) { a.kernel = 17, a.state_len = 16; }), FRT_REASON_SHAPE,
                 "kernel 17", "more than 16 taps");
  expect_refused(*op, with([](A a) { a.state_len = 2; }), FRT_REASON_SHAPE, "state len 2",
                 "state_len below kernel - 1");
  expect_refused(*op, with([](A a) { a.dtype = FRT_F16; }), FRT_REASON_DTYPE, "f16",
                 "dtype must be f32 or bf16");
  expect_refused(*op, with([](A a) { a.act = FRT_ACT_GELU; }), FRT_REASON_FORMAT, "act 2",
                 "activation must be silu or none (-1)");
  // Without a state its length is not read: the window starts with kernel - 1 zeros.
  const frt_causal_conv1d_args stateless = with([](A a) { a.state = nullptr, a.state_len = 0; });
  EXPECT_EQ(op->supports(&stateless, &err), FRT_REASON_OK) << err.message;
  EXPECT_EQ(op->run(&good, 0, 3, 2, &err), FRT_E_INVALID);
}

TEST_P(RecurrentKernels, ListsItsOpsAndAnswersPlanTimeQuestions) {
  EXPECT_STREQ(t_->package, "flashrt/recurrent");
  ASSERT_EQ(t_->n_ops, 2);
  for (int32_t kind : {FRT_OP_GATED_DELTA, FRT_OP_CAUSAL_CONV1D}) {
    const frt_op* op = find_kind(*t_, kind);
    ASSERT_NE(op, nullptr) << kind;
    EXPECT_EQ(op->phases, 1) << kind;
    EXPECT_EQ(op->workspace, nullptr) << kind;
  }
  auto answer = [&](const frt_op_desc& d, std::string* message) {
    frt_error err{};
    const int32_t r = t_->supports_op(&d, &err);
    *message = err.message;
    return r;
  };
  std::string msg;
  frt_op_desc gd{};
  gd.op = FRT_OP_GATED_DELTA;
  gd.x_dtype = FRT_BF16;
  gd.k = 256;
  gd.n = 1;
  EXPECT_EQ(answer(gd, &msg), FRT_REASON_OK) << msg;
  gd.x_dtype = FRT_F16;
  EXPECT_EQ(answer(gd, &msg), FRT_REASON_DTYPE);
  EXPECT_NE(msg.find("gated delta: activations in f16"), std::string::npos) << msg;
  gd.x_dtype = FRT_F32;
  for (auto [k, n] : {std::pair<int64_t, int64_t>{0, 128}, {257, 128}, {128, 0}}) {
    gd.k = k, gd.n = n;
    EXPECT_EQ(answer(gd, &msg), FRT_REASON_SHAPE) << k << "x" << n;
    EXPECT_NE(msg.find("k_dim " + std::to_string(k) + ", v_dim " + std::to_string(n)),
              std::string::npos)
        << msg;
  }
  frt_op_desc conv{};
  conv.op = FRT_OP_CAUSAL_CONV1D;
  conv.x_dtype = FRT_F32;
  conv.n = 8192;
  conv.k = 4;
  conv.act = FRT_ACT_SILU;
  EXPECT_EQ(answer(conv, &msg), FRT_REASON_OK) << msg;
  conv.act = -1;
  conv.k = 16;
  EXPECT_EQ(answer(conv, &msg), FRT_REASON_OK) << msg;
  conv.act = FRT_ACT_GELU_TANH;
  EXPECT_EQ(answer(conv, &msg), FRT_REASON_FORMAT);
  EXPECT_NE(msg.find("activation 1"), std::string::npos) << msg;
  conv.act = -1;
  for (auto [n, k] : {std::pair<int64_t, int64_t>{0, 4}, {8, 0}, {8, 17}}) {
    conv.n = n, conv.k = k;
    EXPECT_EQ(answer(conv, &msg), FRT_REASON_SHAPE) << n << " " << k;
    EXPECT_NE(msg.find(std::to_string(n) + " channels, " + std::to_string(k) + " taps"),
              std::string::npos)
        << msg;
  }
  conv.n = 8, conv.k = 4, conv.x_dtype = 5;
  EXPECT_EQ(answer(conv, &msg), FRT_REASON_DTYPE);
  frt_op_desc linear{};
  linear.op = FRT_OP_LINEAR;
  EXPECT_EQ(answer(linear, &msg), FRT_REASON_NOT_PROVIDED);
  EXPECT_NE(msg.find("'flashrt/recurrent' provides no op of kind 1"), std::string::npos) << msg;
  EXPECT_EQ(t_->supports_op(nullptr, nullptr), FRT_REASON_NOT_PROVIDED);
}

INSTANTIATE_TEST_SUITE_P(Variants, RecurrentKernels, ::testing::ValuesIn(ktest::kIsas));

}  // namespace
}  // namespace frt
