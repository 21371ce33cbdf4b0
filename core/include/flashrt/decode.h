// decode_loop's program (DESIGN §8): the whole decode step of a Llama-family decoder (RMSNorm,
// q/k/v, per-head q/k norm, rotary, attention over a static KV window with grouped heads, o,
// residuals, a gated feed-forward or a routed bank of gated experts, final norm, head, argmax)
// run in the core, one token at a time, over the host's own weights (borrowed, never copied) or
// the packed weights of seated impls.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/seat.h>
#include <flashrt/tensor.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace frt {

struct DecodeConfig {
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int64_t vocab = 0, max_len = 0;
  float eps = 1e-6f;
  bool qk_norm = false;
  std::vector<float> inv_freq;     // head_dim / 2 rotary frequencies, taken from the host
  float attention_scaling = 1.0f;  // the host's rotary cos/sin scale
};

// One projection: a seat's packed weight when `seat` is set, else the host's own row-major
// weight [n][k] (fp32 or bf16), borrowed.
struct ProjWeights {
  TensorView host;
  const float* bias = nullptr;
  const LinearSeat* seat = nullptr;
  int64_t n() const;
  int64_t k() const;
};

struct FfnWeights {
  ProjWeights gate, up, down;
  Activation act = Activation::silu;
  const FfnSeat* seat = nullptr;  // the fused impl, when the FFN is seated as one
};

// A bank of routed experts: a seat's packed bank (run by moe_ffn) when `seat` is set, else the
// host's own banks, borrowed: gate and up [experts][inner][hidden] (the halves of a fused
// gate_up), down [experts][hidden][inner], fp32 or bf16, each matrix's rows contiguous.
struct BankWeights {
  TensorView gate, up, down;
  Activation act = Activation::silu;
  const MoeSeat* seat = nullptr;
  int64_t experts() const;
  int64_t inner() const;
  int64_t hidden() const;
};

// A routed feed-forward (Note [Routed layers] in plan_decode.cpp): the router's weight at the
// host's precision and its measured form, the bank, and a shared expert beside it.
struct MoeWeights {
  ProjWeights router;  // [experts][hidden], the host's own
  int64_t top_k = 0;
  bool renormalise = false;  // the top-k probabilities divided by their sum
  BankWeights bank;
  bool shared = false;
  FfnWeights shared_expert;
  ProjWeights shared_gate;  // [1][hidden]: sigmoid(x g) scales the shared expert's output
};

struct LayerWeights {
  const float *input_norm = nullptr, *post_norm = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;  // per-head, when the host has them
  ProjWeights q, k, v, o;
  FfnWeights mlp;  // a dense layer's
  bool routed = false;
  MoeWeights moe;  // a routed layer's
};

struct ModelWeights {
  TensorView embed;  // [vocab][hidden] fp32
  const float* final_norm = nullptr;
  ProjWeights head;
  std::vector<LayerWeights> layers;
};

class DecodeProgram {
 public:
  // Checks every shape against the config and throws Refused naming the slot and its shape.
  DecodeProgram(DecodeConfig config, ModelWeights weights, const frt_kernel_table& decode,
                const frt_kernel_table* linear, const frt_kernel_table* ffn);

  // One token at position pos (0 <= pos < max_len): writes its K/V, returns the logits' argmax.
  int64_t step(int64_t token, int64_t pos);
  // A prompt of `count` tokens at positions pos0.. run in blocks of up to kBlock rows (each
  // weight read once per block, causal attention inside it); the logits and the returned argmax
  // are the last token's.
  int64_t prefill(const int64_t* tokens, int64_t count, int64_t pos0);
  static constexpr int64_t kBlock = FRT_MAX_ROWS;
  // Host K/V for positions [0, n) of `layer`, each [n][kv_heads][head_dim] contiguous fp32.
  void load_cache(int64_t layer, int64_t n, const float* k, const float* v);
  // The same layout out: what the program wrote for positions [0, n) of `layer` (the self-check
  // holds its keys, rotated, against the host's).
  void read_cache(int64_t layer, int64_t n, float* k, float* v) const;
  const std::vector<float>& logits() const { return logits_; }
  const DecodeConfig& config() const { return cfg_; }
  // Weight bytes one step reads (packed where seated): the floor's numerator.
  int64_t weight_bytes() const;

 private:
  // Rows [0, m) of a block at positions pos0..pos0+m-1; logits for the last row.
  int64_t run_block(const int64_t* tokens, int64_t m, int64_t pos0);
  void project(const ProjWeights& p, const float* x, float* y, int64_t m);
  void project_group(std::initializer_list<std::pair<const ProjWeights*, float*>> outs,
                     const float* x, int64_t m);
  void ffn(const FfnWeights& f, const float* x, float* y, int64_t m);
  void moe(const MoeWeights& w, const float* x, float* y, int64_t m);
  void route(const MoeWeights& w, const float* x, int64_t m);
  void host_bank(const BankWeights& b, const float* x, float* y, int64_t m, int64_t top_k);
  void norm_rows(const float* w, float* x, int64_t rows, int64_t width);

  DecodeConfig cfg_;
  ModelWeights w_;
  const frt_kernel_table& decode_;
  const frt_op *dense_ = nullptr, *rmsnorm_ = nullptr, *rotary_ = nullptr, *attention_ = nullptr;
  const frt_kernel_table* linear_;
  const frt_kernel_table* ffn_;
  // Preallocated once for a block of kBlock rows (row-major [row][width]): no allocation per step.
  std::vector<float> h_, xn_, q_, k_, v_, attn_, o_, gate_, up_, mlp_out_, scores_, logits_;
  // Routed layers: the router's logits [row][experts], the choice [row][top_k], the rows one
  // expert takes (gathered), its output, the shared expert's output and gate.
  std::vector<float> router_, route_w_, xg_, yg_, shared_out_, shared_g_;
  std::vector<int64_t> route_i_;
  std::vector<float> cos_, sin_;  // [row][head_dim / 2]
  // The KV cache, one buffer: [layer][K, V][kv_head][max_len][head_dim] (Note [KV cache layout]).
  struct FreeCache {
    void operator()(float* p) const;
  };
  std::unique_ptr<float[], FreeCache> cache_;
  float* cache_at(int64_t layer, int64_t kv, int64_t head) const;
  void for_cache_rows(int64_t layer, int64_t n,
                      const std::function<void(float*, float*, int64_t)>& copy) const;
};

}  // namespace frt
