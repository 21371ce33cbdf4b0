// The decode plan (DESIGN §8): how decode_loop's program covers a host, decided in the core from
// the HostGraph and a binding (catalog/bindings/*.yaml), before any program is built. It names
// the module of every slot, the program's configuration, and every refusal in the planner's
// vocabulary (site, reason with the form); explain() prints it like any plan.
#pragma once

#include <flashrt/catalog.h>
#include <flashrt/decode.h>
#include <flashrt/host_graph.h>
#include <flashrt/plan.h>

#include <array>
#include <map>
#include <string>
#include <vector>

namespace frt {

// The slots the decode program reads, by name: a binding maps each to a path on its family.
// The stack's and kDecodeLayerSlots are read always (a binding must mark them required). The
// attention's input is q, k and v or one fused qkv; each sublayer has a norm before it, after
// it (on its output) or both, as the family places them; q_norm and k_norm are optional
// (per-head or whole-projection norms, measured by their width). The feed-forward's slots are
// read when the layer is dense and its feed-forward is not one seat: gate and up or one fused
// gate_up, down, act. A binding naming a slot outside these tables is refused at plan time.
inline constexpr std::array<const char*, 2> kDecodeStackSlots = {"final_norm", "rotary"};
inline constexpr std::array<const char*, 2> kDecodeLayerSlots = {"o", "mlp"};
inline constexpr std::array<const char*, 6> kDecodeAttentionSlots = {"q",   "k",      "v",
                                                                     "qkv", "q_norm", "k_norm"};
inline constexpr std::array<const char*, 4> kDecodeNormSlots = {"attn_in_norm", "attn_out_norm",
                                                                "ffn_in_norm", "ffn_out_norm"};
inline constexpr std::array<const char*, 5> kDecodeFfnSlots = {"gate", "up", "gate_up", "down",
                                                               "act"};
// A routed feed-forward (read when the binding names `experts` and a layer holds it): the bank,
// its router, and a shared expert with the sigmoid gate that mixes it in (both optional on a
// host; the shared expert's projections are read when it is not one seat).
inline constexpr std::array<const char*, 2> kDecodeMoeSlots = {"experts", "router"};
inline constexpr std::array<const char*, 6> kDecodeSharedSlots = {
    "shared",           "shared_gate_proj", "shared_up_proj",
    "shared_down_proj", "shared_act",       "shared_expert_gate"};
// What the program computes: a binding may only admit these (checked when it is planned).
inline constexpr std::array<NormForm, 2> kDecodeNormForms = {NormForm::rms, NormForm::rms_one_plus};
inline constexpr std::array<Activation, 2> kDecodeActivations = {Activation::silu,
                                                                 Activation::gelu_tanh};

// A layer's routed feed-forward: what the program computes per row is
//   p = softmax(x W_r^T) (fp32), the top_k of p (ties to the lower expert), divided by their sum
//   when `renormalise`, y = sum_j p_j expert_j(x) (+ sigmoid(x g) shared(x) with a shared expert)
// where the router's form and the bank's activation are what the door measured on their calls.
struct DecodeMoePlan {
  int64_t experts = 0, top_k = 0, intermediate = 0;
  bool renormalise = false;
  bool bank_seated = false;  // a moe_ffn seat holds the bank packed; else the host's tensors
  Activation activation = Activation::unknown;
  bool shared = false;              // a shared expert beside the bank, mixed in by a sigmoid gate
  int64_t shared_intermediate = 0;  // its width (its up projection's)
  bool shared_seated = false;       // it is one seated gated_ffn
  Activation shared_activation = Activation::unknown;
};

struct DecodeLayerPlan {
  std::map<std::string, std::string> slots;  // binding slot -> module path (present slots only)
  bool mlp_seated = false;                   // the feed-forward is one seated gated_ffn
  Activation activation = Activation::unknown;
  // The layer holds the binding's `experts` (a bank of routed experts): its feed-forward is
  // `moe`, else the dense one of gate/up/down.
  bool routed = false;
  DecodeMoePlan moe;
};

struct DecodePlan {
  std::string binding;
  // The binding describes the host's structure: every slot it requires is there and every
  // weight of every layer is a slot the program reads. A plan that fits may still be refused
  // for a form (a dtype, an activation); one that does not is the wrong binding.
  bool fits = false;
  // The kernel packages the program runs, as the binding names them.
  std::string decode_package, linear_package, ffn_package;
  DecodeConfig config;
  std::string embed, head;                   // module paths
  std::map<std::string, std::string> stack;  // binding stack slot -> module path
  std::vector<DecodeLayerPlan> layers;
  int64_t seated = 0;  // projections and feed-forwards that run a seat's packed weights
  std::vector<SiteReason> refused;  // empty: the program can be built
  std::vector<std::string> assumed;
  bool ok() const { return refused.empty(); }
};

// Reads the host's declared configuration (HostGraph::config), each norm's measured form and
// epsilon, what a seated module runs, and the rotary module's own frequencies and scale.
// An empty `binding` chooses one (Note [Choosing a binding] in plan_decode.cpp).
// `sequences`: the KV windows the program holds (a batch of up to FRT_MAX_ROWS sequences);
// `kv_cache`: their elements' dtype by name, "f32" (the host's values) or "bf16" (Note [KV cache
// dtype] in program.cpp); another is a refusal naming it.
DecodePlan plan_decode(const HostGraph& graph, const Catalog& catalog, const std::string& binding,
                       int64_t max_len, int64_t sequences = 1, const std::string& kv_cache = "f32");

// Grouped by index like a Plan's explain() unless verbose.
std::string explain(const DecodePlan& plan, bool verbose = false);

}  // namespace frt
