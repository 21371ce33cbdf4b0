// The decode plan: a binding's slots resolved on the HostGraph, each piece checked against what
// the door measured (norm form, activation, rotary frequencies), every refusal naming the form.
#include <flashrt/decode_plan.h>
#include <flashrt/errors.h>

#include <algorithm>
#include <sstream>

#include "util/explain_groups.h"

namespace frt {
namespace {

// A value the binding does not list is not covered.
template <typename E>
bool covers(const std::vector<E>& allowed, E value) {
  return std::find(allowed.begin(), allowed.end(), value) != allowed.end();
}

template <typename E>
std::string names_of(const std::vector<E>& values) {
  if (values.empty()) return "none declared";
  std::string out;
  for (E v : values) out += (out.empty() ? "" : ", ") + std::string(name_of(v));
  return out;
}

std::string join_path(const std::string& a, const std::string& b) {
  return a.empty() ? b : a + "." + b;
}

class Planner {
 public:
  Planner(const HostGraph& g, const BindingSpec& b, DecodePlan& p) : g_(g), b_(b), p_(p) {}

  bool refuse(const std::string& site, const std::string& why) {
    p_.refused.emplace_back(site, why);
    return false;
  }

  // A norm over `width` that computes the binding's form.
  bool norm(const std::string& path, int64_t width, float* eps) {
    const HostModule* m = g_.find(path);
    if (m == nullptr || m->kind != ModuleKind::norm || m->in_features != width)
      return refuse(path, path + " is not an RMSNorm over " + std::to_string(width) +
                              " features with a weight and an epsilon");
    if (!covers(b_.norm_forms, m->norm.form))
      return refuse(path, path +
                              " does not compute x·w/rms(x) (a different norm form, e.g. "
                              "x·(1+w)); measured '" +
                              name_of(m->norm.form) + "', binding takes " +
                              names_of(b_.norm_forms));
    if (!(m->norm.eps > 0)) return refuse(path, path + " has no epsilon the door could read");
    if (eps != nullptr) *eps = static_cast<float>(m->norm.eps);
    return true;
  }

  // The path a layer slot names on this layer, whether or not the host has it (for messages).
  std::string slot_path(const std::string& layer, const std::string& slot) const {
    for (const BindingSlot& s : b_.layer)
      if (s.name == slot) return join_path(layer, s.path);
    return join_path(layer, slot);
  }

  // Every slot of `names` present on the layer, else a refusal naming the first one absent.
  bool present(const std::string& layer, const DecodeLayerPlan& L,
               std::initializer_list<const char*> names) {
    for (const char* name : names)
      if (!L.slots.count(name))
        return refuse(slot_path(layer, name),
                      "a required slot is absent on this host: " + slot_path(layer, name));
    return true;
  }

  // A gated feed-forward down(act(gate x) * up x) of `inner` features: one seated gated_ffn at
  // `module`, or the three projections and the activation the binding names (slot names in
  // order gate, up, down, act). Returns false after a refusal; *seated and *act say which.
  bool gated_ffn(const std::string& layer, const DecodeLayerPlan& L, const char* module,
                 std::array<const char*, 4> parts, int64_t inner, int64_t hidden, bool* seated,
                 Activation* act) {
    const HostModule* m = L.slots.count(module) ? g_.find(L.slots.at(module)) : nullptr;
    if (m != nullptr && m->seated == OpKind::gated_ffn) {
      *seated = true;
      ++p_.seated;
      return true;
    }
    if (!present(layer, L, {parts[0], parts[1], parts[2], parts[3]})) return false;
    if (!projection(L.slots.at(parts[0]), inner, hidden, false) ||
        !projection(L.slots.at(parts[1]), inner, hidden, false) ||
        !projection(L.slots.at(parts[2]), hidden, inner, false))
      return false;
    const std::string& at = L.slots.at(parts[3]);
    const HostModule* a = g_.find(at);
    *act = a != nullptr && a->kind == ModuleKind::activation ? a->activation : Activation::unknown;
    if (!covers(b_.activations, *act))
      return refuse(at, at + " activation '" + name_of(*act) + "' outside {" +
                            names_of(b_.activations) + "}");
    return true;
  }

  // A routed feed-forward (Note [Routed layers]): its bank and its router, then the rest.
  bool routed(const std::string& layer, DecodeLayerPlan& L, int64_t hidden);
  bool bank(DecodeLayerPlan& L, int64_t hidden);
  bool router(const std::string& layer, DecodeLayerPlan& L, int64_t hidden);

  // A projection [n x k]: the host's linear or a seat running the linear op.
  bool projection(const std::string& path, int64_t n, int64_t k, bool bias_ok) {
    const HostModule* m = g_.find(path);
    const bool seated = m != nullptr && m->seated == OpKind::linear;
    if (m == nullptr || (m->kind != ModuleKind::linear && !seated))
      return refuse(path, "projection " + path + " (" + (m ? m->type_name : "absent") +
                              ") is neither a linear nor a flashrt seat");
    if (m->out_features != n || m->in_features != k)
      return refuse(path, path + " is [" + std::to_string(m->out_features) + "x" +
                              std::to_string(m->in_features) + "], expected [" + std::to_string(n) +
                              "x" + std::to_string(k) + "]");
    if (m->has_bias && !bias_ok)
      return refuse(path, path + " has a bias; the loop's FFN is bias-free");
    p_.seated += seated;
    return true;
  }

 private:
  const HostGraph& g_;
  const BindingSpec& b_;
  DecodePlan& p_;
};

// Note [Routed layers]: a layer is routed when the host holds the binding's `experts` slot there,
// dense otherwise, so a stack may mix the two (Qwen3-MoE's mlp_only_layers, a sparse step). What
// the program computes of a routed layer is checked piece by piece against what the door
// measured: the bank is [experts, out, in] without biases, its gated form's activation measured
// on a call of its own; the router holds [experts, hidden] and, called on rows of its own,
// returned the top-k of softmax(x W^T) (renormalised or not: that is read from the call, not
// from a flag or a family); the shared expert, where the host has one, is a gated feed-forward
// beside a [1, hidden] gate. A child of the block outside these slots holding a weight is a
// part the program would not compute, so it refuses; how the block adds the shared expert
// (sigmoid(x g) * shared(x)) is its forward's, stated as an assumption the self-check holds.
bool Planner::bank(DecodeLayerPlan& L, int64_t hidden) {
  const std::string& path = L.slots.at("experts");
  const HostModule* m = g_.find(path);
  DecodeMoePlan& moe = L.moe;
  if (m->seated.has_value() && m->seated != OpKind::moe_ffn)
    return refuse(
        path, path + " is seated as " + name_of(*m->seated) + ", not as a bank of routed experts");
  moe.bank_seated = m->seated == OpKind::moe_ffn;
  if (!moe.bank_seated && m->kind != ModuleKind::experts)
    return refuse(path, path + " (" + m->type_name +
                            ") is not a bank of routed experts ([experts, out, in] tensors)");
  const ExpertFacts& e = m->experts;
  if (e.experts < 1) return refuse(path, "the door described no bank of experts at " + path);
  if (e.transposed || e.has_bias)
    return refuse(path, path + " (" + m->type_name + ", " + std::to_string(e.experts) +
                            " experts): banks stored " +
                            (e.transposed ? "transposed [experts, in, out]" : "") +
                            (e.transposed && e.has_bias ? " " : "") +
                            (e.has_bias ? "with per-expert biases" : "") +
                            "; the loop's bank takes [experts, out, in] banks without biases");
  if (e.gate_up.empty() && (e.gate.empty() || e.up.empty()))
    return refuse(
        path, path + " (" + m->type_name + ") holds no gate bank; the loop's experts are gated");
  if (e.hidden != hidden)
    return refuse(path, path + " reads " + std::to_string(e.hidden) +
                            " features; the stack's hidden width is " + std::to_string(hidden));
  moe.experts = e.experts;
  moe.intermediate = e.intermediate;
  moe.activation = m->activation;
  if (!covers(b_.activations, moe.activation))
    return refuse(path, path + " (" + m->type_name + "): act(gate x) * up x with none of {" +
                            names_of(b_.activations) + "} reproduced its call (measured '" +
                            name_of(moe.activation) + "')");
  return true;
}

bool Planner::router(const std::string& layer, DecodeLayerPlan& L, int64_t hidden) {
  const ExpertFacts& e = g_.find(L.slots.at("experts"))->experts;
  DecodeMoePlan& moe = L.moe;
  // Where the binding says the router is; absent, the door's located router is measured all
  // the same, so the refusal can say what it computes.
  const bool at_slot = L.slots.count("router") > 0;
  const std::string path = at_slot ? L.slots.at("router") : e.router;
  const HostModule* m = path.empty() ? nullptr : g_.find(path);
  std::string absent;
  if (!at_slot) {
    absent = "a required slot is absent on this host: " + slot_path(layer, "router");
    if (!path.empty()) absent += "; the bank's routing weight is held by " + path;
  }
  if (m == nullptr) return refuse(slot_path(layer, "router"), absent);
  const std::string named = path + " (" + m->type_name + ")";
  const RouterFacts& r = m->router;
  std::string why;
  if (m->seated.has_value())
    why = named + " is seated; the loop routes at the host's precision (it picks the experts)";
  else if (r.form == RouterForm::unknown)
    why = "the door measured no routing at " + named;
  else if (r.form == RouterForm::other)
    why = named + " does not route as the top-k of softmax(x W^T): " + r.other;
  else if (e.experts > 0 && (r.experts != e.experts || r.hidden != hidden))
    why = named + " routes over [" + std::to_string(r.experts) + "x" + std::to_string(r.hidden) +
          "]; the bank holds " + std::to_string(e.experts) + " experts of width " +
          std::to_string(hidden);
  else if (r.top_k < 1 || r.top_k > r.experts || r.top_k > FRT_MAX_TOP_K)
    why = named + " picks " + std::to_string(r.top_k) + " of " + std::to_string(r.experts) +
          " experts; the loop takes 1.." +
          std::to_string(std::min<int64_t>(r.experts, FRT_MAX_TOP_K));
  if (!at_slot) return refuse(slot_path(layer, "router"), absent + (why.empty() ? "" : "; " + why));
  if (!why.empty()) return refuse(path, why);
  moe.top_k = r.top_k;
  moe.renormalise = r.form == RouterForm::softmax_topk_renormalised;
  return true;
}

bool Planner::routed(const std::string& layer, DecodeLayerPlan& L, int64_t hidden) {
  L.routed = true;
  // The bank and the router are judged both, so a host wrong in each (GPT-OSS: transposed,
  // biased banks and a biased router) is told both.
  const bool bank_ok = bank(L, hidden);
  const bool router_ok = router(layer, L, hidden);
  if (!bank_ok || !router_ok) return false;
  DecodeMoePlan& moe = L.moe;
  p_.seated += moe.bank_seated;
  // The shared expert and its gate.
  if (L.slots.count("shared")) {
    moe.shared = true;
    const HostModule* up =
        L.slots.count("shared_up_proj") ? g_.find(L.slots.at("shared_up_proj")) : nullptr;
    moe.shared_intermediate = up != nullptr ? up->out_features : 0;
    if (!gated_ffn(layer, L, "shared",
                   {"shared_gate_proj", "shared_up_proj", "shared_down_proj", "shared_act"},
                   moe.shared_intermediate, hidden, &moe.shared_seated, &moe.shared_activation))
      return false;
    if (!present(layer, L, {"shared_expert_gate"}) ||
        !projection(L.slots.at("shared_expert_gate"), 1, hidden, true))
      return false;
    p_.assumed.push_back(L.slots.at("shared") + ": added as sigmoid(" +
                         L.slots.at("shared_expert_gate") + " x) * shared(x) to the routed " +
                         "experts' sum, as the block's forward does (the self-check holds it)");
  } else if (L.slots.count("shared_expert_gate")) {
    return refuse(L.slots.at("shared_expert_gate"),
                  L.slots.at("shared_expert_gate") +
                      " gates a shared expert the host does not hold at " +
                      slot_path(layer, "shared"));
  }
  // Nothing else in the block holds a weight the program would leave out.
  const HostModule* block = L.slots.count("mlp") ? g_.find(L.slots.at("mlp")) : nullptr;
  if (block != nullptr) {
    std::vector<std::string> known;
    for (const auto& [slot, path] : L.slots) known.push_back(path);
    for (const std::string& child : block->children) {
      if (std::find(known.begin(), known.end(), child) != known.end()) continue;
      for (const HostParam& hp : g_.params) {
        if (hp.module != child && hp.module.rfind(child + ".", 0) != 0) continue;
        std::string shape;
        for (int64_t d : hp.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
        return refuse(child, hp.module + "." + hp.name + " [" + shape +
                                 "] is part of the routed block " + block->path +
                                 " and no slot the loop computes");
      }
    }
  }
  return true;
}

}  // namespace

DecodePlan plan_decode(const HostGraph& g, const Catalog& catalog, const std::string& binding,
                       int64_t max_len) {
  const BindingSpec& b = catalog.binding(binding);
  // The program reads these slots by name: a binding lacking one, or marking one it always reads
  // optional, cannot drive it; a binding admitting a form the program does not compute would
  // build a program that computes something else.
  const auto require = [&](const auto& names, const std::vector<BindingSlot>& slots, bool always) {
    for (const char* name : names) {
      const auto it = std::find_if(slots.begin(), slots.end(),
                                   [&](const BindingSlot& s) { return s.name == name; });
      if (it == slots.end())
        throw InvalidArgument("binding '" + binding + "' has no slot '" + name +
                              "', which the decode program reads");
      if (always && !it->required)
        throw InvalidArgument("binding '" + binding + "': slot '" + name +
                              "' is read by every program, so it cannot be optional");
    }
  };
  require(kDecodeStackSlots, b.stack, true);
  require(kDecodeLayerSlots, b.layer, true);
  require(kDecodeFfnSlots, b.layer, false);
  // A binding that names a bank names its router; one that names a shared expert names all of
  // its slots. A binding without `experts` plans every layer dense.
  const auto names = [&](const char* slot) {
    return std::any_of(b.layer.begin(), b.layer.end(),
                       [&](const BindingSlot& s) { return s.name == slot; });
  };
  if (names("experts")) require(kDecodeMoeSlots, b.layer, false);
  if (names("shared")) require(kDecodeSharedSlots, b.layer, false);
  const auto admits_only = [&](const char* key, const auto& declared, const auto& computed) {
    if (declared.empty())
      throw InvalidArgument("binding '" + binding + "' declares no " + key + " it covers");
    for (const auto v : declared)
      if (std::find(computed.begin(), computed.end(), v) == computed.end())
        throw InvalidArgument("binding '" + binding + "': " + key + " '" + name_of(v) +
                              "' is not a form the decode program computes");
  };
  admits_only("norm_form", b.norm_forms, kDecodeNormForms);
  admits_only("activation", b.activations, kDecodeActivations);
  DecodePlan p;
  p.binding = binding;
  p.decode_package = b.decode_package;
  p.linear_package = b.linear_package;
  p.ffn_package = b.ffn_package;
  Planner pl(g, b, p);
  DecodeConfig& c = p.config;
  c.max_len = max_len;
  const auto refuse = [&](const std::string& site, const std::string& why) {
    p.refused.emplace_back(site, why);
    return p;
  };
  // The stack.
  for (const BindingSlot& s : b.stack) {
    if (g.find(s.path) != nullptr)
      p.stack[s.name] = s.path;
    else if (s.required)
      return refuse(s.path, "a required slot is absent on this host: " + s.path);
  }
  const HostModule* embed = g.find(g.input_embedding);
  const HostModule* head = g.find(g.output_head);
  if (embed == nullptr || head == nullptr || g.input_embedding.empty() || g.output_head.empty())
    return refuse("", "a required slot is absent on this host: input or output embedding");
  p.embed = embed->path;
  p.head = head->path;
  const HostConfig& host = g.config;
  if (embed->weight_dtype != DType::f32)
    return refuse(p.embed, std::string("host dtype ") + name_of(host.dtype) +
                               ": the loop computes in fp32 and would not reproduce the host's "
                               "arithmetic");
  if (host.sliding_window > 0)
    return refuse("", "sliding-window attention (window " + std::to_string(host.sliding_window) +
                          "); the loop attends over the whole static window");
  if (!covers(b.rope_kinds, host.rope))
    return refuse(
        "", "rotary form '" + host.rope_name + "' (supported: " + names_of(b.rope_kinds) + ")");
  if (host.partial_rotary_factor != 1.0) {
    std::ostringstream why;
    why << "partial rotary (factor " << host.partial_rotary_factor
        << "); the loop rotates the whole head";
    return refuse("", why.str());
  }
  const HostModule* rotary = p.stack.count("rotary") ? g.find(p.stack.at("rotary")) : nullptr;
  if (rotary == nullptr || rotary->rotary.inv_freq.empty())
    return refuse(rotary ? rotary->path : "", "the host's rotary module exposes no frequencies");

  c.hidden = embed->out_features;
  c.vocab = head->out_features;
  c.heads = host.heads;
  c.kv_heads = host.kv_heads > 0 ? host.kv_heads : c.heads;
  c.head_dim = host.head_dim;
  if (c.head_dim == 0 && c.heads > 0) c.head_dim = c.hidden / c.heads;
  c.intermediate = host.intermediate;
  c.inv_freq = rotary->rotary.inv_freq;
  c.attention_scaling = static_cast<float>(rotary->rotary.attention_scaling);
  if (c.heads <= 0 || c.head_dim <= 0)
    return refuse("", "the host declares no attention head count");

  // The layers: children of the binding's layer list, in order.
  std::vector<std::string> layer_paths;
  for (int64_t i = 0;; ++i) {
    const std::string path = join_path(b.layers, std::to_string(i));
    if (g.find(path) == nullptr) break;
    layer_paths.push_back(path);
  }
  if (layer_paths.empty())
    return refuse(b.layers, "a required slot is absent on this host: " + b.layers);
  c.layers = static_cast<int64_t>(layer_paths.size());
  const int64_t qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  bool qk_norm = true;
  for (const std::string& where : layer_paths) {
    DecodeLayerPlan L;
    for (const auto& [fused, what] : b.fused_forms)
      if (g.find(join_path(where, fused)) != nullptr)
        return refuse(join_path(where, fused), join_path(where, fused) + " is a " + what +
                                                   "; the loop takes the binding's separate slots");
    for (const BindingSlot& s : b.layer) {
      const std::string path = join_path(where, s.path);
      if (g.find(path) != nullptr)
        L.slots[s.name] = path;
      else if (s.required)
        return refuse(path, "a required slot is absent on this host: " + path);
    }
    float eps = 0;
    if (!pl.norm(L.slots.at("input_norm"), c.hidden, &eps) ||
        !pl.norm(L.slots.at("post_norm"), c.hidden, nullptr))
      return p;
    c.eps = eps;
    const bool has_qk = L.slots.count("q_norm") && L.slots.count("k_norm");
    qk_norm &= has_qk;
    if (has_qk && (!pl.norm(L.slots.at("q_norm"), c.head_dim, nullptr) ||
                   !pl.norm(L.slots.at("k_norm"), c.head_dim, nullptr)))
      return p;
    if (!pl.projection(L.slots.at("q"), qd, c.hidden, true) ||
        !pl.projection(L.slots.at("k"), kvd, c.hidden, true) ||
        !pl.projection(L.slots.at("v"), kvd, c.hidden, true) ||
        !pl.projection(L.slots.at("o"), c.hidden, qd, true))
      return p;
    // Routed or dense, from what the layer holds (Note [Routed layers]).
    if (L.slots.count("experts")
            ? !pl.routed(where, L, c.hidden)
            : !pl.gated_ffn(where, L, "mlp", {"gate", "up", "down", "act"}, c.intermediate,
                            c.hidden, &L.mlp_seated, &L.activation))
      return p;
    p.layers.push_back(std::move(L));
  }
  c.qk_norm = qk_norm;
  float unused = 0;
  if (!pl.norm(p.stack.at("final_norm"), c.hidden, &unused)) return p;
  if (!pl.projection(p.head, c.vocab, c.hidden, false)) {
    p.refused.back().second =
        "the output head has a bias or another form: " + p.refused.back().second;
    return p;
  }
  return p;
}

std::string explain(const DecodePlan& p, bool verbose) {
  std::ostringstream s;
  const DecodeConfig& c = p.config;
  s << "flashrt decode plan: binding " << p.binding << ", " << c.layers << " layers, hidden "
    << c.hidden << ", heads " << c.heads << "/" << c.kv_heads << " x " << c.head_dim << ", vocab "
    << c.vocab << ", window " << c.max_len << ", " << p.seated << " seated, "
    << (p.ok() ? "buildable" : "refused") << "\n";
  // Grouped like a Plan's entries (Note [Explain groups]); a "" site is the host itself.
  std::vector<detail::ExplainEntry> routed, refused, assumed;
  for (const DecodeLayerPlan& L : p.layers) {
    if (!L.routed) continue;
    const DecodeMoePlan& m = L.moe;
    const std::string site = L.slots.count("mlp") ? L.slots.at("mlp") : L.slots.at("experts");
    std::string text = "  " + site + "  " + std::to_string(m.experts) + " experts (" +
                       name_of(m.activation) + "), top-" + std::to_string(m.top_k) + " of softmax" +
                       (m.renormalise ? " renormalised" : "") + ", bank " +
                       (m.bank_seated ? "seated" : "at host precision");
    if (m.shared)
      text += std::string(", shared expert ") + (m.shared_seated ? "seated" : "at host precision");
    routed.push_back({site, text + "\n"});
  }
  for (const auto& [site, why] : p.refused)
    refused.push_back(
        {site, "  " + (site.empty() ? std::string("(host)") : site) + "  " + why + "\n"});
  for (const std::string& a : p.assumed)
    assumed.push_back({a.substr(0, a.find_first_of(": ")), "  " + a + "\n"});
  bool merged = false;
  for (const auto& [title, entries] :
       {std::pair{"routed", &routed}, {"refused", &refused}, {"assumed", &assumed}}) {
    if (entries->empty()) continue;
    s << "\n" << title << ":\n";
    bool m = false;
    if (verbose)
      for (const detail::ExplainEntry& e : *entries) s << e.text;
    else
      s << detail::group_entries(*entries, &m);
    merged = merged || m;
  }
  if (merged) s << detail::kGroupedNote;
  return s.str();
}

}  // namespace frt
