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
// The stack's and the layer's are read always (a binding must mark them required); the
// feed-forward's only when the layer's feed-forward is not one seat; q_norm and k_norm are
// optional (per-head norms, when the host has them).
inline constexpr std::array<const char*, 2> kDecodeStackSlots = {"final_norm", "rotary"};
inline constexpr std::array<const char*, 7> kDecodeLayerSlots = {
    "input_norm", "post_norm", "q", "k", "v", "o", "mlp"};
inline constexpr std::array<const char*, 4> kDecodeFfnSlots = {"gate", "up", "down", "act"};
// What the program computes: a binding may only admit these (checked when it is planned).
inline constexpr std::array<NormForm, 1> kDecodeNormForms = {NormForm::rms};
inline constexpr std::array<Activation, 2> kDecodeActivations = {Activation::silu,
                                                                 Activation::gelu_tanh};

struct DecodeLayerPlan {
  std::map<std::string, std::string> slots;  // binding slot -> module path (present slots only)
  bool mlp_seated = false;                   // the feed-forward is one seated gated_ffn
  Activation activation = Activation::unknown;
};

struct DecodePlan {
  std::string binding;
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
DecodePlan plan_decode(const HostGraph& graph, const Catalog& catalog, const std::string& binding,
                       int64_t max_len);

// Grouped by index like a Plan's explain() unless verbose.
std::string explain(const DecodePlan& plan, bool verbose = false);

}  // namespace frt
