// decode_loop's program (DESIGN §8): the whole decode step of a pre- or post-norm decoder (RMSNorm
// x*w or x*(1+w) before and/or after attention and the feed-forward, q/k/v separate or fused,
// q/k norms per head or over the projection, rotary over the whole head or its leading part or
// none, attention over a static KV window with grouped heads, a sliding window per layer and
// softcapped scores, o, scaled residuals, a gated feed-forward or a routed bank of gated experts,
// final norm, head, softcapped or scaled logits, argmax) run in the core, one token at a time,
// over the host's own weights (borrowed, never copied) or the packed weights of seated impls.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/seat.h>
#include <flashrt/tensor.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace frt {

// A rotary table, taken from the host's rotary module: rotary_dim / 2 frequencies and the scale
// of its cos/sin.
struct DecodeRotary {
  std::vector<float> inv_freq;
  float attention_scaling = 1.0f;
};

// Where a layer's q/k norms normalise: each head's vector (Qwen3, Gemma 3) or the whole
// projection at once (OLMo 2).
enum class QkNorm : int32_t { none, per_head, whole };

// The width a q or k norm normalises over: a head's, or the whole projection of `heads` heads.
inline int64_t qk_norm_width(QkNorm form, int64_t heads, int64_t head_dim) {
  return form == QkNorm::whole ? heads * head_dim : head_dim;
}

struct DecodeLayerConfig {
  int64_t window = 0;  // > 0: attends to the last `window` positions (sliding); 0: all of them
  int32_t rotary = 0;  // index into DecodeConfig::rotaries; -1: this layer has no rotary (NoPE)
  QkNorm qk_norm = QkNorm::none;
};

struct DecodeConfig {
  int64_t layers = 0, hidden = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int64_t vocab = 0, max_len = 0;
  // Sequences the program holds a KV window of max_len for (1..FRT_MAX_ROWS): a batch step runs
  // one row of each at once (Note [A batch of sequences] in program.cpp).
  int64_t sequences = 1;
  // The KV cache's elements: f32 (the host's values) or bf16, half the bytes attention reads a
  // step (Note [KV cache dtype] in program.cpp).
  DType cache_dtype = DType::f32;
  float eps = 1e-6f;
  bool norm_plus_one = false;  // every norm computes x·(1+w)/rms(x) (Gemma), else x·w/rms(x)
  int64_t rotary_dim = 0;      // the leading dims of a head that rotate (halves of them pair)
  std::vector<DecodeRotary> rotaries;
  std::vector<DecodeLayerConfig> layer;  // one per layer
  // The scalars a family's forward applies (1 / 0 where it applies none).
  float embed_scale = 1.0f;        // the embedding's rows times this (Gemma: sqrt(hidden))
  float residual_scale = 1.0f;     // each sublayer's output times this before its residual add
  float attention_scale = 0.0f;    // q·k times this; 0: 1/sqrt(head_dim)
  float attention_softcap = 0.0f;  // > 0: scores become c·tanh(s / c) before the softmax
  float logits_divisor = 1.0f;     // the logits divided by this (Granite's logits_scaling)
  float final_softcap = 0.0f;      // > 0: logits become c·tanh(l / c)
};

// One projection: a seat's packed weight when `seat` is set, else the host's own row-major
// weight [n][k] (fp32 or bf16), borrowed.
struct ProjWeights {
  TensorView host;
  const float* bias = nullptr;
  const LinearSeat* seat = nullptr;
  bool present() const;  // a seat or a host weight stands here
  int64_t n() const;
  int64_t k() const;
};

struct FfnWeights {
  // gate and up apart, or one fused projection [gate; up] (rows in that order) in `gate_up`.
  ProjWeights gate, up, down, gate_up;
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
  // The norms around each sublayer, where the family has them: before attention, after it (on
  // its output, before the residual add), before the feed-forward and after it.
  const float *attn_in_norm = nullptr, *attn_out_norm = nullptr;
  const float *ffn_in_norm = nullptr, *ffn_out_norm = nullptr;
  const float *q_norm = nullptr, *k_norm = nullptr;  // as DecodeLayerConfig::qk_norm says
  // q, k, v apart, or one fused projection [q; k; v] (rows in that order) in `qkv`.
  ProjWeights q, k, v, o, qkv;
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

  // One token of sequence `seq` at position pos (0 <= pos < max_len): writes its K/V, returns
  // the logits' argmax.
  int64_t step(int64_t token, int64_t pos, int64_t seq = 0);
  // One token of each of m distinct sequences (m <= sequences), row r at positions[r] of
  // sequence seqs[r]: every weight read once for the m rows; next[r] is row r's argmax and
  // logits(r) its logits.
  void step_batch(const int64_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t m,
                  int64_t* next);
  // A prompt of `count` tokens of sequence `seq` at positions pos0.. run in blocks of up to
  // kPromptBlock rows (each weight read once per block where its kernel takes the block whole,
  // causal attention inside it; Note [Prompt blocks]); the logits and the returned argmax are the
  // last token's.
  int64_t prefill(const int64_t* tokens, int64_t count, int64_t pos0, int64_t seq = 0);
  // The rows of a batch step (FRT_MAX_ROWS: the decode band's kernels take up to that many).
  static constexpr int64_t kBlock = FRT_MAX_ROWS;
  // The rows of a prompt block.
  static constexpr int64_t kPromptBlock = 256;
  // Host K/V for positions [0, n) of `layer`, each [n][kv_heads][head_dim] contiguous fp32.
  // A host whose sliding layers cache only their window hands positions [first, first + n).
  void load_cache(int64_t layer, int64_t n, const float* k, const float* v, int64_t first = 0,
                  int64_t seq = 0);
  // The same layout out: what the program wrote for positions [0, n) of `layer` (the self-check
  // holds its keys, rotated, against the host's).
  void read_cache(int64_t layer, int64_t n, float* k, float* v, int64_t seq = 0) const;
  // The last call's logits: a prefill's or step's in row 0, a batch step's row r.
  std::span<const float> logits(int64_t row = 0) const;
  const DecodeConfig& config() const { return cfg_; }
  // Weight bytes one step reads (packed where seated): the floor's numerator.
  int64_t weight_bytes() const;

 private:
  // Rows [0, m): row r is token tokens[r] of sequence seqs[r] at position positions[r]. Logits
  // for every row (into logits rows 0..m-1, argmaxes into next) or, for a prompt block, the last
  // row's alone (row 0); returns the last row's argmax.
  int64_t run_rows(const int64_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t m,
                   int64_t* next);
  void project(const ProjWeights& p, const float* x, float* y, int64_t m);
  void project_group(std::initializer_list<std::pair<const ProjWeights*, float*>> outs,
                     const float* x, int64_t m);
  // project_group's calls of m rows their kernels all take.
  void group_pieces(const std::vector<std::pair<const ProjWeights*, float*>>& outs, const float* x,
                    int64_t m);
  void ffn(const FfnWeights& f, const float* x, float* y, int64_t m);
  void moe(const MoeWeights& w, const float* x, float* y, int64_t m);
  void route(const MoeWeights& w, const float* x, int64_t m);
  void host_bank(const BankWeights& b, const float* x, float* y, int64_t m, int64_t top_k);
  void norm_rows(const float* w, float* x, int64_t rows, int64_t width);
  // Rotates `heads` vectors a head_dim apart by a row's cos/sin (their leading rotary_dim dims).
  void rotate(float* x, int64_t heads, const float* cos, const float* sin);
  // x (+)= scale * y over n values: a residual add, or a store where the family scales none.
  void residual(float* h, const float* y, int64_t n) const;
  void gated_activation(Activation act, float* gate, const float* up, int64_t n);
  // The first `rows` rows of logits_ finished (divisor, softcap) and their greedy tokens into
  // next (when given); returns the last row's (Note [Greedy tokens on the team]).
  int64_t greedy_tokens(int64_t rows, int64_t* next);
  // A norm weight as the rmsnorm kernel takes it: the host's own, or 1 + w kept here.
  const float* norm_weight(const float* host, int64_t width);

  DecodeConfig cfg_;
  ModelWeights w_;
  const frt_kernel_table& decode_;
  const frt_op *dense_ = nullptr, *rmsnorm_ = nullptr, *rotary_ = nullptr, *attention_ = nullptr;
  const frt_op* capped_attention_ = nullptr;  // where the family softcaps its scores
  const frt_op* cache_attention_ = nullptr;   // over a bf16 cache (Note [KV cache dtype])
  const frt_op* gated_act_ = nullptr;         // act(gate) * up between separate projections
  const frt_kernel_table* linear_;
  const frt_kernel_table* ffn_;
  // Preallocated once for a block of kPromptBlock rows (row-major [row][width]): no allocation
  // per step.
  std::vector<float> h_, xn_, q_, k_, v_, attn_, o_, gate_, up_, mlp_out_, scores_, logits_;
  int64_t logits_rows_ = 0;  // rows of logits_ the last call wrote
  // Per sequence, the positions [0, written) its cache holds: a call may start at or before it,
  // never past it (attention would read positions nothing wrote).
  std::vector<int64_t> written_;
  // `seq` is one of the program's sequences and `pos` leaves no gap in its cache.
  void check_start(int64_t seq, int64_t pos) const;
  // Routed layers: the router's logits [row][experts], the choice [row][top_k], the rows one
  // expert takes (gathered), its output, the shared expert's output and gate.
  std::vector<float> router_, route_w_, xg_, yg_, shared_out_, shared_g_;
  std::vector<int64_t> route_i_;
  std::vector<float> qkv_, gate_up_;  // fused projections' outputs, [row][q; k; v], [row][g; u]
  std::vector<float> cos_, sin_;      // [rotary table][row][rotary_dim / 2]
  std::vector<std::vector<float>> plus_one_;  // 1 + w of each norm, for x·(1+w) families
  // The KV cache, one buffer: [layer][K, V][kv_head][max_len][head_dim] (Note [KV cache layout])
  // of cache_dtype elements.
  struct FreeCache {
    void operator()(char* p) const;
  };
  std::unique_ptr<char[], FreeCache> cache_;
  int64_t cache_elem_ = 4;  // bytes per element
  char* cache_at(int64_t seq, int64_t layer, int64_t kv, int64_t head) const;
  // head_dim values into / out of the cache element at p, in cache_dtype.
  void to_cache(char* p, const float* x) const;
  void from_cache(const char* p, float* x) const;
  void attend(int64_t seq, int64_t layer, int64_t first, int64_t positions, const float* q,
              float* out, float scale);
  void for_cache_rows(int64_t seq, int64_t layer, int64_t first, int64_t n,
                      const std::function<void(char*, char*, int64_t)>& copy) const;
};

}  // namespace frt
