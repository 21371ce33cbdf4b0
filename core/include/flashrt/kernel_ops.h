// Running a kernel package's ops on tensor views: checks the form, carves the workspace, drives
// the op's phases on the thread pool. Refusals name the form and the shape.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/pack.h>
#include <flashrt/tensor.h>
#include <flashrt/thread_pool.h>
#include <flashrt/types.h>

#include <string>
#include <vector>

namespace frt {

// The op of `kind` the package owns, or nullptr.
const frt_op* find_op(const frt_kernel_table& table, OpKind kind);
// Plan time: "" when the package runs the described form, else its reason (naming the op when
// the package does not own it).
std::string form_refusal(const frt_kernel_table& table, const frt_op_desc& desc);

// "" when the table's linear op takes this call, else the reason.
std::string linear_refusal(const frt_kernel_table& table, const PackedLinear& w,
                           const TensorView& x, const TensorView& y);
// y = x W^T (+ bias). bias is fp32 [n] or nullptr. Throws Refused with linear_refusal()'s reason.
void run_linear(const frt_kernel_table& table, Parallel& pool, const PackedLinear& w,
                const float* bias, const TensorView& x, const TensorView& y, int threads = 0);

// One linear of a group that run_linears runs together.
struct LinearCall {
  const frt_kernel_table* table = nullptr;
  const PackedLinear* w = nullptr;
  const float* bias = nullptr;
  TensorView x, y;
};
// Several linears (typically reading one input: q, k and v; gate and up), each checked as
// run_linear checks it, run phase by phase in lockstep: one parallel region per phase for the
// whole group instead of one per phase and call, so a thread that finishes its share of one
// weight goes on to the next without waiting (Note [Projection groups] in kernel_ops.cpp).
// Throws Refused with the first call's reason; nothing runs then.
void run_linears(Parallel& pool, const std::vector<LinearCall>& calls);

// The weights of a fused feed-forward. gate set: y = down(act(gate(x)) * up(x)) (gated_ffn);
// gate null: y = down(act(up(x) + up_bias)) + down_bias (ffn), biases fp32 or null.
struct FfnOperands {
  const PackedLinear* gate = nullptr;
  const PackedLinear* up = nullptr;
  const PackedLinear* down = nullptr;
  const float* up_bias = nullptr;
  const float* down_bias = nullptr;
  Activation act = Activation::silu;
  OpKind kind() const { return gate != nullptr ? OpKind::gated_ffn : OpKind::ffn; }
};

std::string ffn_refusal(const frt_kernel_table& table, const FfnOperands& f, const TensorView& x,
                        const TensorView& y);
void run_ffn(const frt_kernel_table& table, Parallel& pool, const FfnOperands& f,
             const TensorView& x, const TensorView& y, int threads = 0);

// A bank of routed experts (moe_ffn): each expert's gate and up [inner x k] and down [n x inner],
// all in one form, with the per-expert views the op reads.
class ExpertBank {
 public:
  // Throws InvalidArgument when the three lists differ in length, are empty, or a pack's form or
  // shape differs from the first expert's.
  ExpertBank(std::vector<PackedLinear> gate, std::vector<PackedLinear> up,
             std::vector<PackedLinear> down, Activation act);
  int64_t experts() const { return static_cast<int64_t>(gate_.size()); }
  int64_t hidden() const { return gate_.front().k(); }
  int64_t intermediate() const { return gate_.front().n(); }
  Activation activation() const { return act_; }
  std::string form() const { return gate_.front().form(); }
  int64_t nbytes() const;         // every expert's packed bytes
  int64_t expert_nbytes() const;  // one expert's: what a routed row's expert streams
  const frt_packed_weight* gate_views() const { return gate_views_.data(); }
  const frt_packed_weight* up_views() const { return up_views_.data(); }
  const frt_packed_weight* down_views() const { return down_views_.data(); }

 private:
  struct FreeRegion {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, FreeRegion> region_;  // every pack's buffers, expert after expert
  std::vector<PackedLinear> gate_, up_, down_;
  std::vector<frt_packed_weight> gate_views_, up_views_, down_views_;
  Activation act_;
};

// The router's choice for one call: index i64 [rows, top_k], weights f32 or bf16 [rows, top_k],
// both row-major and contiguous.
struct Routing {
  TensorView index, weights;
};

// "" when the table's moe_ffn op takes this call (x, y [rows, hidden]), else the reason.
std::string moe_refusal(const frt_kernel_table& table, const ExpertBank& bank, const TensorView& x,
                        const Routing& routing, const TensorView& y);
// y[r] = sum_j weights[r][j] * expert index[r][j] (x[r]). Throws Refused with moe_refusal()'s
// reason.
void run_moe(const frt_kernel_table& table, Parallel& pool, const ExpertBank& bank,
             const TensorView& x, const Routing& routing, const TensorView& y, int threads = 0);

// A softmax router's choice from its logits [rows, experts] (x W^T at the host's precision),
// which become the probabilities (fp32, in place): each row's top-k (the lower expert on a tie,
// where torch.topk's CPU order is its own; exact ties are rare in real logits), divided by their
// sum where the host's router renormalises, into index [rows, k] and weight [rows, k]. The
// decode program and a routed decoder block both choose with it.
void choose_experts(float* logits, int64_t rows, int64_t experts, int64_t k, bool renormalise,
                    int64_t* index, float* weight);

// A shared expert joined to the routed experts' sum y [rows, hidden] as Qwen2-MoE's block does:
// y += sigmoid(gate_logit) * shared, row by row, gate_logits [rows] (x g, the gate's one output)
// and shared [rows, hidden] the expert's output. The decode program and a routed decoder block
// both mix with it.
void mix_shared_expert(const float* gate_logits, const float* shared, int64_t rows, int64_t hidden,
                       float* y);

// Every query of a sequence against every key, unmasked (sequence_attention): q [batch, heads,
// q_len, head_dim], k and v [batch, kv_heads, kv_len, head_dim], out like q, each bf16 with
// head_dim contiguous and any other strides (torch's scaled_dot_product_attention layout).
struct SequenceAttention {
  TensorView q, k, v, out;
  float scale = 1.0f;
};
// "" when the table's sequence_attention op takes this call, else the reason.
std::string sequence_attention_refusal(const frt_kernel_table& table, const SequenceAttention& a);
// out = softmax(scale q k^T) v. Throws Refused with sequence_attention_refusal()'s reason.
void run_sequence_attention(const frt_kernel_table& table, Parallel& pool,
                            const SequenceAttention& a, int threads = 0);

// Streams `bytes` of memory on `threads` threads of the process team (at most its size) `repeats`
// times and returns the best read rate in GB/s (1e9 bytes/s): the floor every decode kernel is
// measured against (core/src/runtime/read_probe.cpp, Note [Read probe]).
double measure_read_bandwidth(int64_t bytes, int threads, int repeats);

}  // namespace frt
