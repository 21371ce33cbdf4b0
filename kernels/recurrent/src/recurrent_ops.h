// flashrt/recurrent: the recurrences of linear-attention layers (the gated delta rule and the
// short causal convolution before it), single-phase, the state owned by the caller.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>

#include <cstdint>
#include <cstring>

namespace frt::kern {

// The per-call checks (frt_reason, the message naming the form) and the runs, which repeat the
// checks so a caller that skipped supports() gets an error, not a stray write.
int32_t gated_delta_supports(const frt_gated_delta_args* a, frt_error* err);
int32_t gated_delta_run(const frt_gated_delta_args* a, int32_t ith, int32_t nth, frt_error* err);
int32_t causal_conv1d_supports(const frt_causal_conv1d_args* a, frt_error* err);
int32_t causal_conv1d_run(const frt_causal_conv1d_args* a, int32_t ith, int32_t nth,
                          frt_error* err);

// The widest key vector the gated delta rule takes: a state block [k_dim][16] stays in L1.
inline constexpr int64_t kMaxKeyDim = 256;
// The most taps the convolution takes (models use 4).
inline constexpr int64_t kMaxTaps = 16;
// Value columns per gated delta item and channels per convolution item.
inline constexpr int64_t kBlock = 16;

// Note [Lanes]: a block's kBlock columns are kRegs native vectors of kWidth floats (GCC/Clang
// vectors: one zmm, two ymm or four xmm), each op a loop over u < kRegs that unrolls. A single
// 64-byte vector type left GCC 12 going through memory on AVX2 and SSE, and loops over 16 plain
// floats had it vectorise across rows instead. kChains independent accumulators per sum keep about
// eight multiply-adds in flight whatever kRegs is. Vectors cross functions by reference only.
#if defined(__AVX512F__)
inline constexpr int kWidth = 16;
#elif defined(__AVX__)
inline constexpr int kWidth = 8;
#else
inline constexpr int kWidth = 4;
#endif
typedef float Vec __attribute__((vector_size(kWidth * sizeof(float))));
inline constexpr int kRegs = static_cast<int>(kBlock) / kWidth;
inline constexpr int kChains = 4 / kRegs;

struct Lanes {
  Vec r[kRegs];
};

inline void load_lanes(Lanes& x, const float* p) {
  for (int u = 0; u < kRegs; ++u) std::memcpy(&x.r[u], p + u * kWidth, sizeof(Vec));
}

inline void store_lanes(float* p, const Lanes& x) {
  for (int u = 0; u < kRegs; ++u) std::memcpy(p + u * kWidth, &x.r[u], sizeof(Vec));
}

// acc[0] = the sum of the kChains chains, pairwise in a fixed order.
inline void sum_chains(Lanes (&acc)[kChains]) {
  for (int step = 1; step < kChains; step *= 2)
    for (int j = 0; j + step < kChains; j += 2 * step)
      for (int u = 0; u < kRegs; ++u) acc[j].r[u] += acc[j + step].r[u];
}

}  // namespace frt::kern
