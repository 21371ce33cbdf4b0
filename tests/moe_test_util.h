// What the routed-bank tests (FRT_OP_MOE_FFN in flashrt/ffn and flashrt/gemm) share: the routing,
// the op's arguments over a bank, and running the op through the ABI with a workspace poisoned
// afresh for every call. Each test keeps its own bank (its forms and packing) and its reference.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/thread_pool.h>
#include <flashrt/types.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"

namespace frt::ktest {

// A bank's widths: gate/up [inner x k], down [n x inner].
struct Widths {
  int64_t k, inner, n;
};

// Row r's experts index[r][0..top_k) and weights.
struct Route {
  int top_k;
  std::vector<int64_t> index;
  std::vector<float> weight;
};

// Distinct experts per row drawn from [1, experts - 1), so experts 0 and experts - 1 are chosen
// by no row; every row after the first also takes row 0's first expert, so experts' groups hold
// several rows.
inline Route random_route(int64_t m, int top_k, int64_t experts, std::mt19937_64& rng) {
  Route rt{top_k, std::vector<int64_t>(m * top_k), std::vector<float>(m * top_k)};
  std::vector<int64_t> pool;
  for (int64_t e = 1; e + 1 < experts; ++e) pool.push_back(e);
  std::uniform_real_distribution<float> wdist(0.05f, 1.0f);
  for (int64_t r = 0; r < m; ++r) {
    std::shuffle(pool.begin(), pool.end(), rng);
    std::copy(pool.begin(), pool.begin() + top_k, rt.index.begin() + r * top_k);
    if (r > 0) {
      int64_t* row = rt.index.data() + r * top_k;
      const int64_t shared = rt.index[0];
      if (std::find(row, row + top_k, shared) == row + top_k) row[rng() % top_k] = shared;
    }
    for (int j = 0; j < top_k; ++j) rt.weight[r * top_k + j] = wdist(rng);
  }
  return rt;
}

// Over any test's bank: what the op reads of it is its expert count and the ABI's arrays
// gv, uv, dv (one frt_packed_weight per expert).
template <typename Bank>
frt_moe_args moe_args(const Bank& b, Activation act, const Route& rt, const Rows& x, Out& y) {
  frt_moe_args a{};
  a.x_dtype = abi_dtype(x.dtype);
  a.y_dtype = abi_dtype(y.dtype);
  a.act = static_cast<int32_t>(act);
  a.top_k = rt.top_k;
  a.m = x.m;
  a.x = x.data();
  a.ldx = x.ld;
  a.y = y.data();
  a.ldy = y.ld;
  a.index = rt.index.data();
  a.weight = rt.weight.data();
  a.experts = b.experts;
  a.gate = b.gv.data();
  a.up = b.uv.data();
  a.down = b.dv.data();
  return a;
}

inline const frt_op* moe_op(const frt_kernel_table& t) {
  const frt_op* op = find_op(t, OpKind::moe_ffn);
  EXPECT_NE(op, nullptr) << t.package << " (" << t.isa << ") lists no moe_ffn op";
  return op;
}

struct FreeBytes {
  void operator()(void* p) const { std::free(p); }
};
using Workspace = std::unique_ptr<void, FreeBytes>;

inline Workspace poisoned_workspace(int64_t bytes) {
  const size_t size = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
  Workspace w(std::aligned_alloc(64, size));
  std::memset(w.get(), 0xff, size);  // NaN floats: a read before a write shows
  return w;
}

// Runs every phase on `threads` threads: "" or the first refusal or failure.
inline std::string run_moe_op(const frt_kernel_table& t, ThreadPool& pool, frt_moe_args a,
                              int threads) {
  const frt_op* op = moe_op(t);
  if (op == nullptr) return "no moe_ffn op";
  frt_error err{};
  if (op->supports(&a, &err) != FRT_REASON_OK) return std::string("refused: ") + err.message;
  const Workspace ws = poisoned_workspace(op->workspace(&a));
  a.workspace = ws.get();
  std::mutex mu;
  std::string failure;
  for (int32_t phase = 0; phase < op->phases; ++phase)
    pool.run(threads, [&](int ith, int team) {
      frt_error e{};
      if (op->run(&a, phase, ith, team, &e) != FRT_OK) {
        std::lock_guard<std::mutex> lock(mu);
        if (failure.empty()) failure = std::string("phase failed: ") + e.message;
      }
    });
  return failure;
}

// The bank's two activations in float64, by their definitions.
inline double act64(Activation a, double g) {
  if (a == Activation::silu) return g / (1.0 + std::exp(-g));
  return 0.5 * g * (1.0 + std::tanh(0.7978845608028654 * (g + 0.044715 * g * g * g)));
}

}  // namespace frt::ktest
