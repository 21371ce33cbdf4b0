// The neutral description of a host the door hands the planner: its module tree, slot tensors
// and what one real forward showed. Nothing here names a framework; discovery matches on shapes,
// kinds and observed dataflow, never on type or model names.
#pragma once

#include <flashrt/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace frt {

enum class ModuleKind : int32_t {
  linear,      // y = x W^T (+ b), weight [out, in]
  embedding,   // a lookup table [rows, width]
  activation,  // a parameter-free elementwise nonlinearity; `activation` says which
  norm,        // a 1-D-weighted normalisation over the last dim; attributes say which form
  experts,     // a bank of routed experts: 3-D weights [experts, out, in]; `experts` says which
  recurrence,  // a module whose forward calls a recurrence function; `recurrence` says which
  conv,        // a depthwise 1-D convolution whose weight a convolution function is called with
  attention,   // a module that calls the host's attention interface; `attention` says how
  rotary,      // a rotary embedding whose cos/sin a rotary function was called with; `rotary`
  block,       // a decoder layer: norms, an attention module and a feed-forward as children,
               // composed as `block` says (measured on its call)
  module,      // anything else (a container)
};

// A module that calls a recurrence function (transformers' linear-attention modules call
// torch_chunk_gated_delta_rule for prompts and torch_recurrent_gated_delta_rule for one token).
// Dims are the function's operands': q, k [batch, tokens, k_heads, k_dim], v [.., v_heads,
// v_dim], the state [batch, v_heads, k_dim, v_dim].
struct RecurrenceFacts {
  RecurrenceForm form = RecurrenceForm::unknown;
  int64_t k_heads = 0, v_heads = 0, k_dim = 0, v_dim = 0;
  bool l2norm = false;                 // its calls ask for q, k l2-normalised inside the function
  std::vector<std::string> functions;  // the functions of the module's namespace it calls
  std::string other;                   // form other: what the measurement showed, for the refusal
};

// A depthwise convolution module (groups == channels) whose weight [channels, 1, taps] a causal
// convolution function is called with (its own forward is never called).
struct ConvFacts {
  int64_t channels = 0, taps = 0, groups = 0, padding = 0;
  bool has_bias = false;
  std::vector<std::string> functions;           // the functions called with its weight
  Activation activation = Activation::unknown;  // what its calls asked for (silu; none: unknown)
  bool activated = false;                       // its calls ask for an activation
};

// A module that calls the host's attention interface (transformers' attention modules call the
// implementation their configuration names with q [batch, heads, q_len, head_dim] and the
// cache's k, v [batch, kv_heads, positions, head_dim]) or torch's scaled_dot_product_attention
// itself (a diffusion transformer's attention processor: cache none), as its observed calls
// showed it.
struct AttentionFacts {
  AttentionForm form = AttentionForm::unknown;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  double scale = 0;            // the scaling its calls pass (0: none passed, 1/sqrt(head_dim))
  double softcap = 0;          // the scores' softcap (0: none)
  int64_t sliding_window = 0;  // the window its calls name (0: none); the mask applies it
  std::string implementation;  // the host's implementation ("sdpa", "eager")
  std::string other;           // form other: what its calls showed, for the refusal
  // Where its calls' keys and values live: what the host's cache hands each call (dense), a
  // serving engine's pool of slots (paged), or the whole sequence each call hands (none). A
  // structure's attention node matches one kind only.
  AttentionCache cache = AttentionCache::dense;
};

// A bank of routed experts (transformers' experts modules: gate_up_proj [E, 2F, D], down_proj
// [E, D, F]), as the door read its tensors and measured its calls. The module's own call is
// (hidden [rows, D], top_k_index [rows, k], top_k_weights [rows, k]) -> [rows, D].
struct ExpertFacts {
  int64_t experts = 0, hidden = 0, intermediate = 0;
  int64_t top_k = 0;  // from its observed calls (0: never called)
  // Tensor names: gate and up fused in one bank (gate_up, gate rows first) or apart; down.
  std::string gate_up, gate, up, down;
  bool transposed = false;  // banks stored [E, in, out], or gate and up rows interleaved
  bool has_bias = false;    // per-expert biases
  std::string router;       // the sibling holding the routing weight [E, D], "" if none located
};

// How a router (the module holding a bank's routing weight [experts, hidden]) chooses, as the
// door measured it on a call of its own: the top-k of softmax(x W^T) taken in fp32, the k
// probabilities as they are or renormalised to sum to one. Anything else is `other`.
enum class RouterForm : int32_t { unknown, softmax_topk, softmax_topk_renormalised, other };

// What the door measured of a router (filled for a decode plan; RouterForm::unknown elsewhere).
struct RouterFacts {
  RouterForm form = RouterForm::unknown;
  int64_t experts = 0, hidden = 0, top_k = 0;  // its weight's [experts, hidden]; k per row
  std::string other;  // form other: what its call showed instead, for the refusal
};

struct HostModule;

// Why the router `m` cannot choose among a bank's `experts` experts of width `hidden` as the
// core routes (choose_experts(): the top-k of softmax(x W^T) in fp32, renormalised or not,
// k in 1..FRT_MAX_TOP_K); "" when it can. decode_loop's plan and a routed decoder block's
// ask the same question of the same facts, each adding what only it needs.
std::string router_refusal(const HostModule& m, int64_t experts, int64_t hidden);

// A decoder layer as the door measured its observed call (kind block): which child plays each
// part, and how its output is composed of theirs. The attention module's own children are
// named too (its projections, in the order its call ran them, and its per-head q/k norms), as
// is the rotary module whose tables the layer's call carried. Paths are the host's; "" where
// the part is absent (a layer without q/k norms).
struct BlockFacts {
  BlockForm form = BlockForm::unknown;
  std::string input_norm, attention, post_norm, ffn;
  std::string q, k, v, o, q_norm, k_norm;
  std::string rotary;
  int64_t hidden = 0;
  std::string other;  // form other: what the measurement showed, for the refusal
};

// A weight-holding parameter of the host (two dimensions or more), whatever module holds it: the
// plan accounts for every large one (seated, kept at host or refused, never silent).
struct HostParam {
  std::string module;  // path of the module holding it
  std::string name;    // "weight", "gate_up_proj"
  std::vector<int64_t> shape;
  int64_t elements = 0;
};

// What the door measured of a norm module (kind norm).
struct NormFacts {
  NormForm form = NormForm::unknown;
  double eps = 0;          // the module's epsilon; 0 for a norm seen only on its calls
  bool affine = true;      // false: a parameter-free norm, recognised on its calls
  std::string modulation;  // where its output's modulation is computed; "" when none was located
};

// A rotary embedding module's own (a module exposing its frequencies) and, where the observed
// forward called a rotary function of an attention module's namespace with the cos/sin this
// module returned (transformers' apply_rotary_pos_emb(q, k, cos, sin)), what those calls showed:
// q [batch, heads, tokens, head_dim], k [batch, kv_heads, tokens, head_dim], the measured form.
struct RotaryFacts {
  std::vector<float> inv_freq;     // the frequencies it rotates by, scaled as the host scales them
  double attention_scaling = 1.0;  // its cos/sin scale
  // A module holding a table per layer type (Gemma 3: local and global bases), by type.
  std::map<std::string, std::vector<float>> inv_freq_of;
  std::map<std::string, double> attention_scaling_of;
  RotaryForm form = RotaryForm::unknown;  // unknown: no rotary function call showed its tables
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  std::vector<std::string> functions;  // the rotary functions called with its tables
  std::string other;                   // form other: what the measurement showed, for the refusal
};

// What the host's configuration declares that its modules cannot show.
struct HostConfig {
  DType dtype = DType::f32;                                         // the first parameter's
  int64_t heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;  // 0: not declared
  RopeKind rope = RopeKind::plain;
  std::string rope_name = "default";  // as declared (a kind outside the table is `other`)
  int64_t sliding_window = 0;         // 0: no sliding window applies
  // LongRoPE's pretraining length: past it the host switches to its long factors (0: none).
  int64_t rope_original_max = 0;
  // Each layer's attention as declared ("full_attention", "sliding_attention", ...); empty when
  // the configuration declares none.
  std::vector<std::string> layer_types;
  // Which layers apply the rotary (SmolLM3's no_rope_layers: 1 rotates, 0 does not); empty: all.
  std::vector<int64_t> rope_layers;
  // Scalars a family's forward applies where its configuration declares them (0: none).
  double embedding_multiplier = 0, residual_multiplier = 0, attention_multiplier = 0;
  double logits_scaling = 0, query_pre_attn_scalar = 0;
  double attn_logit_softcapping = 0, final_logit_softcapping = 0;
  double clip_qkv = 0;  // q, k and v clamped to +-clip_qkv (OLMo, OLMoE); 0: not clamped
};

struct HostModule {
  std::string path;  // "model.layers.0.mlp.gate_proj"; "" is the root
  ModuleKind kind = ModuleKind::module;
  std::string type_name;  // shown by explain(); never matched on
  // linear / embedding / norm (in_features is a norm's width)
  int64_t in_features = 0, out_features = 0;
  bool has_bias = false;
  DType weight_dtype = DType::f32;
  std::string weight_device;
  int64_t weight_id = 0;  // storage identity: equal for tied weights
  // activation: what the door measured the module to compute (experts: its gated form's act,
  // unknown when act(gate) * up with none of the kernels' activations reproduced its calls).
  Activation activation = Activation::unknown;
  ExpertFacts experts;         // kind experts
  RouterFacts router;          // a bank's router, as measured on its own call
  NormFacts norm;              // kind norm: its measured form and epsilon
  RecurrenceFacts recurrence;  // kind recurrence
  ConvFacts conv;              // kind conv
  AttentionFacts attention;    // kind attention
  RotaryFacts rotary;          // a rotary embedding; empty inv_freq otherwise
  BlockFacts block;            // kind block
  // An embedding's call returns its rows times this (measured; Gemma scales by sqrt(hidden)),
  // 0 when its call is not its rows times one constant.
  double embed_scale = 1.0;
  std::optional<OpKind> seated;  // a flashrt seat stands here and runs this op
  // The rows of its input the door recorded statistics of (Statistic::input_moments), for a
  // calibrated form; 0 when none were recorded.
  int64_t calibration_rows = 0;
  std::vector<std::string> children;  // direct children's paths
};

// One call of a module seen during the observed forward, in call order.
struct HostCall {
  std::string path;
  int64_t rows = 0;                     // leading dimensions flattened
  int64_t width = 0;                    // last dimension of the input
  DType dtype = DType::f32;             // input dtype
  int64_t input_id = 0, output_id = 0;  // tensor identities: equal ids are the same tensor
  // The output_id of a norm call whose output this call's input is a per-channel affine
  // function of (x = n*scale + shift, fitted by the door over the observed rows); 0 if none.
  int64_t modulated_from = 0;
};

struct HostGraph {
  std::vector<HostModule> modules;
  std::vector<HostCall> calls;
  std::vector<HostParam> params;  // every parameter of 2-D or more
  std::string output_head;        // the module that produces the logits, "" if none
  std::string input_embedding;    // the token embedding, "" if none
  HostConfig config;              // the host's configuration as the door read it

  const HostModule* find(const std::string& path) const;
  std::vector<const HostCall*> calls_of(const std::string& path) const;
};

}  // namespace frt
