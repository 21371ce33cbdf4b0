// The decode plan: a binding's slots resolved on the HostGraph, each piece checked against what
// the door measured (norm form, activation, rotary frequencies), every refusal naming the form.
#include <flashrt/decode_plan.h>
#include <flashrt/errors.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <string_view>

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

  // A norm over `width` that computes one of the binding's forms, the same form as every other
  // norm of the plan (the program applies one form throughout).
  bool norm(const std::string& path, int64_t width, float* eps) {
    const HostModule* m = g_.find(path);
    if (m == nullptr || m->kind != ModuleKind::norm || m->in_features != width)
      return refuse(path, path + " is not an RMSNorm over " + std::to_string(width) +
                              " features with a weight and an epsilon");
    if (!covers(b_.norm_forms, m->norm.form))
      return refuse(path, path + " computes the norm form '" + name_of(m->norm.form) +
                              "' (measured); binding " + b_.name + " takes " +
                              names_of(b_.norm_forms));
    if (!(m->norm.eps > 0)) return refuse(path, path + " has no epsilon the door could read");
    if (form_ == NormForm::unknown) {
      form_ = m->norm.form;
      p_.config.norm_plus_one = form_ == NormForm::rms_one_plus;
    } else if (m->norm.form != form_) {
      return refuse(path, path + " computes '" + name_of(m->norm.form) +
                              "' where the stack's other norms compute '" + name_of(form_) +
                              "'; the loop applies one form");
    }
    if (eps_ == 0) {
      eps_ = m->norm.eps;
    } else if (m->norm.eps != eps_) {
      std::ostringstream why;
      why << path << " has epsilon " << m->norm.eps << " where the stack's other norms have "
          << eps_ << "; the loop applies one";
      return refuse(path, why.str());
    }
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
    if (std::string_view(module) == "mlp" && L.slots.count("gate_up")) {
      // One fused projection [gate; up] (Phi-3): its rows hold both halves.
      if (!present(layer, L, {parts[2], parts[3]}) ||
          !projection(L.slots.at("gate_up"), 2 * inner, hidden, false) ||
          !projection(L.slots.at(parts[2]), hidden, inner, false))
        return false;
    } else if (!present(layer, L, {parts[0], parts[1], parts[2], parts[3]}) ||
               !projection(L.slots.at(parts[0]), inner, hidden, false) ||
               !projection(L.slots.at(parts[1]), inner, hidden, false) ||
               !projection(L.slots.at(parts[2]), hidden, inner, false)) {
      return false;
    }
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
  NormForm form_ = NormForm::unknown;
  double eps_ = 0;
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
  // A bank of 0 experts was refused by bank(); the router is judged against its own count then.
  const std::string why =
      m->seated.has_value()
          ? named + " is seated; the loop routes at the host's precision (it picks the experts)"
          : router_refusal(*m, e.experts > 0 ? e.experts : r.experts, hidden);
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
  return true;
}

}  // namespace

namespace {

// The binding's slots are the program's: it names each it reads, marks those it reads always
// required, and names no slot the program does not read. A binding admitting a form the program
// does not compute would build a program that computes something else.
void check_binding(const BindingSpec& b) {
  const auto find = [&](const std::vector<BindingSlot>& slots, const char* name) {
    const auto it = std::find_if(slots.begin(), slots.end(),
                                 [&](const BindingSlot& s) { return s.name == name; });
    return it == slots.end() ? nullptr : &*it;
  };
  const auto require = [&](const auto& names, const std::vector<BindingSlot>& slots) {
    for (const char* name : names) {
      const BindingSlot* s = find(slots, name);
      if (s == nullptr)
        throw InvalidArgument("binding '" + b.name + "' has no slot '" + name +
                              "', which the decode program reads");
      if (!s->required)
        throw InvalidArgument("binding '" + b.name + "': slot '" + name +
                              "' is read by every program, so it cannot be optional");
    }
  };
  require(kDecodeStackSlots, b.stack);
  require(kDecodeLayerSlots, b.layer);
  for (const BindingSlot& s : b.stack)
    if (std::find_if(kDecodeStackSlots.begin(), kDecodeStackSlots.end(),
                     [&](const char* n) { return s.name == n; }) == kDecodeStackSlots.end())
      throw InvalidArgument("binding '" + b.name + "' names stack slot '" + s.name +
                            "', which the decode program does not read");
  for (const BindingSlot& s : b.layer) {
    const auto in = [&](const auto& names) {
      return std::any_of(names.begin(), names.end(), [&](const char* n) { return s.name == n; });
    };
    const bool known = in(kDecodeLayerSlots) || in(kDecodeAttentionSlots) || in(kDecodeNormSlots) ||
                       in(kDecodeFfnSlots) || in(kDecodeMoeSlots) || in(kDecodeSharedSlots);
    if (!known)
      throw InvalidArgument("binding '" + b.name + "' names layer slot '" + s.name +
                            "', which the decode program does not read");
  }
  const auto has = [&](const char* name) { return find(b.layer, name) != nullptr; };
  if (!has("qkv") && !(has("q") && has("k") && has("v")))
    throw InvalidArgument("binding '" + b.name + "' names neither q, k and v nor a fused qkv");
  if (!has("attn_in_norm") && !has("attn_out_norm"))
    throw InvalidArgument("binding '" + b.name + "' names no norm around attention");
  if (!has("ffn_in_norm") && !has("ffn_out_norm"))
    throw InvalidArgument("binding '" + b.name + "' names no norm around the feed-forward");
  if (!has("gate_up") && !(has("gate") && has("up")))
    throw InvalidArgument("binding '" + b.name + "' names neither gate and up nor a fused gate_up");
  if (!has("down") || !has("act"))
    throw InvalidArgument("binding '" + b.name +
                          "' has no slot 'down' or 'act', which the "
                          "decode program reads");
  // A binding that names a bank names its router; one that names a shared expert names all of
  // its slots.
  const auto all = [&](const auto& names) {
    for (const char* name : names)
      if (!has(name))
        throw InvalidArgument("binding '" + b.name + "' has no slot '" + name +
                              "', which the decode program reads");
  };
  if (has("experts")) all(kDecodeMoeSlots);
  if (has("shared")) all(kDecodeSharedSlots);
  const auto admits_only = [&](const char* key, const auto& declared, const auto& computed) {
    if (declared.empty())
      throw InvalidArgument("binding '" + b.name + "' declares no " + key + " it covers");
    for (const auto v : declared)
      if (std::find(computed.begin(), computed.end(), v) == computed.end())
        throw InvalidArgument("binding '" + b.name + "': " + key + " '" + name_of(v) +
                              "' is not a form the decode program computes");
  };
  admits_only("norm_form", b.norm_forms, kDecodeNormForms);
  admits_only("activation", b.activations, kDecodeActivations);
}

bool holds_weight(const HostModule& m) {
  return m.seated.has_value() || m.kind == ModuleKind::linear || m.kind == ModuleKind::norm ||
         m.kind == ModuleKind::experts || m.kind == ModuleKind::embedding;
}

// Note [Every weight is a slot]: a layer's weights are what the program computes from, so each
// must be a slot the binding names: a norm, projection or bank anywhere under the layer, and any
// parameter of two or more dims, that is neither a slot nor inside one, is a part the program
// would leave out (OLMo 2's post-feed-forward norm under Llama's binding, a router's bias
// table), and the binding does not describe the host. The containers (mlp, a shared expert)
// hold the feed-forward's slots, so what is inside them counts only while they are seated.
std::string unclaimed_weight(const HostGraph& g, const std::string& layer,
                             const DecodeLayerPlan& L) {
  // A bank's router where the binding does not look for it is judged by the router's own check,
  // which says what it computes (Planner::router).
  const HostModule* bank = L.slots.count("experts") ? g.find(L.slots.at("experts")) : nullptr;
  const std::string router = bank != nullptr ? bank->experts.router : "";
  const auto claimed = [&](const std::string& path) {
    if (!router.empty() && path == router) return true;
    for (const auto& [slot, at] : L.slots) {
      if (path == at) return true;
      const bool container = slot == "mlp" || slot == "shared";
      const HostModule* m = container ? g.find(at) : nullptr;
      if (path.rfind(at + ".", 0) == 0 && (!container || (m != nullptr && m->seated))) return true;
    }
    return false;
  };
  const std::string prefix = layer + ".";
  for (const HostModule& m : g.modules)
    if (m.path.rfind(prefix, 0) == 0 && holds_weight(m) && !claimed(m.path))
      return m.path + " (" + m.type_name + ") holds a weight and is no slot the loop computes";
  for (const HostParam& hp : g.params) {
    if (hp.module.rfind(prefix, 0) != 0 || claimed(hp.module)) continue;
    std::string shape;
    for (int64_t d : hp.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    return hp.module + "." + hp.name + " [" + shape + "] is part of " + layer +
           " and no slot the loop computes";
  }
  return "";
}

// What the configuration declares that the program applies as declared (no module shows it):
// each is stated, and the self-check against the host holds it.
std::vector<std::string> declared_scalars(const HostConfig& host) {
  std::vector<std::string> out;
  const auto add = [&](const char* name, double value) {
    if (value <= 0) return;
    std::ostringstream s;
    s << name << " " << value << ": as the configuration declares it (the self-check holds it)";
    out.push_back(s.str());
  };
  add("embedding_multiplier", host.embedding_multiplier);
  add("residual_multiplier", host.residual_multiplier);
  add("attention_multiplier", host.attention_multiplier);
  add("logits_scaling", host.logits_scaling);
  add("query_pre_attn_scalar", host.query_pre_attn_scalar);
  add("attn_logit_softcapping", host.attn_logit_softcapping);
  add("final_logit_softcapping", host.final_logit_softcapping);
  if (std::count(host.rope_layers.begin(), host.rope_layers.end(), 0) > 0)
    out.push_back(
        "no_rope_layers: the layers it marks 0 apply no rotary, as declared (the "
        "self-check holds it)");
  return out;
}

DecodePlan plan_with(const HostGraph& g, const BindingSpec& b, int64_t max_len) {
  check_binding(b);
  DecodePlan p;
  p.binding = b.name;
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
  // The structure first: the stack's slots, the layers, each layer's slots and weights.
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
  std::vector<std::string> layer_paths;
  for (int64_t i = 0;; ++i) {
    const std::string path = join_path(b.layers, std::to_string(i));
    if (g.find(path) == nullptr) break;
    layer_paths.push_back(path);
  }
  if (layer_paths.empty())
    return refuse(b.layers, "a required slot is absent on this host: " + b.layers);
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
    if (!L.slots.count("qkv") && !pl.present(where, L, {"q", "k", "v"})) return p;
    if (std::string why = unclaimed_weight(g, where, L); !why.empty()) return refuse(where, why);
    p.layers.push_back(std::move(L));
  }
  p.fits = true;

  // Then the forms.
  const HostConfig& host = g.config;
  if (embed->weight_dtype != DType::f32)
    return refuse(p.embed, std::string("host dtype ") + name_of(host.dtype) +
                               ": the loop computes in fp32 and would not reproduce the host's "
                               "arithmetic");
  if (host.clip_qkv > 0) {
    std::ostringstream why;
    why << "the configuration clamps q, k and v to +-" << host.clip_qkv
        << " (clip_qkv); the loop does not clamp";
    return refuse("", why.str());
  }
  if (!covers(b.rope_kinds, host.rope))
    return refuse(
        "", "rotary form '" + host.rope_name + "' (supported: " + names_of(b.rope_kinds) + ")");
  // Note [Rotary tables]: the loop rotates by the module's own table, fixed at plan time. YaRN's
  // and the scaled forms' tables are fixed; LongRoPE's module holds its short factors and
  // switches to its long ones once a position passes the pretraining length, so a window within
  // that length is a fixed table and a longer one is not.
  if (host.rope == RopeKind::longrope && host.rope_original_max <= 0)
    return refuse("",
                  "longrope without a declared original_max_position_embeddings: where it "
                  "switches to its long factors is unknown");
  if (host.rope == RopeKind::longrope && max_len > host.rope_original_max)
    return refuse("", "longrope switches to its long factors past " +
                          std::to_string(host.rope_original_max) +
                          " positions; the loop's table is fixed (a window of at most " +
                          std::to_string(host.rope_original_max) + " takes the short one)");
  c.hidden = embed->out_features;
  c.vocab = head->out_features;
  c.heads = host.heads;
  c.kv_heads = host.kv_heads > 0 ? host.kv_heads : c.heads;
  c.head_dim = host.head_dim;
  if (c.head_dim == 0 && c.heads > 0) c.head_dim = c.hidden / c.heads;
  c.intermediate = host.intermediate;
  if (c.heads <= 0 || c.head_dim <= 0)
    return refuse("", "the host declares no attention head count");
  c.layers = static_cast<int64_t>(p.layers.size());
  if (!(embed->embed_scale > 0))
    return refuse(p.embed, p.embed + " (" + embed->type_name +
                               ") does not return its rows times one constant on its call");
  if (embed->embed_scale != 1.0 && host.embedding_multiplier > 0 &&
      host.embedding_multiplier != 1.0)
    return refuse(p.embed, p.embed + " scales its rows and the stack multiplies them again");
  c.embed_scale = static_cast<float>(embed->embed_scale != 1.0       ? embed->embed_scale
                                     : host.embedding_multiplier > 0 ? host.embedding_multiplier
                                                                     : 1.0);
  if (host.residual_multiplier > 0) c.residual_scale = static_cast<float>(host.residual_multiplier);
  if (host.logits_scaling > 0) c.logits_divisor = static_cast<float>(host.logits_scaling);
  if (host.attention_multiplier > 0 && host.query_pre_attn_scalar > 0)
    return refuse("",
                  "the configuration sets both attention_multiplier and "
                  "query_pre_attn_scalar");
  if (host.attention_multiplier > 0)
    c.attention_scale = static_cast<float>(host.attention_multiplier);
  else if (host.query_pre_attn_scalar > 0)
    c.attention_scale = static_cast<float>(std::pow(host.query_pre_attn_scalar, -0.5));
  c.attention_softcap = static_cast<float>(host.attn_logit_softcapping);
  c.final_softcap = static_cast<float>(host.final_logit_softcapping);
  for (std::string& a : declared_scalars(host)) p.assumed.push_back(std::move(a));

  // Rotary: the module's own tables (one, or one per layer type); the rotated width is theirs.
  const HostModule* rotary = g.find(p.stack.at("rotary"));
  const RotaryFacts& rf = rotary->rotary;
  std::vector<std::string> table_types;  // "" for the module's single table
  if (!rf.inv_freq.empty() && rf.inv_freq_of.empty()) {
    c.rotaries.push_back({rf.inv_freq, static_cast<float>(rf.attention_scaling)});
    table_types.push_back("");
  }
  for (const auto& [type, freq] : rf.inv_freq_of) {
    const auto sc = rf.attention_scaling_of.find(type);
    c.rotaries.push_back(
        {freq, static_cast<float>(sc == rf.attention_scaling_of.end() ? 1.0 : sc->second)});
    table_types.push_back(type);
  }
  if (c.rotaries.empty())
    return refuse(rotary->path, "the host's rotary module exposes no frequencies");
  c.rotary_dim = 2 * static_cast<int64_t>(c.rotaries.front().inv_freq.size());
  for (const DecodeRotary& r : c.rotaries)
    if (2 * static_cast<int64_t>(r.inv_freq.size()) != c.rotary_dim)
      return refuse(rotary->path, rotary->path + " holds tables of different widths");
  if (c.rotary_dim > c.head_dim)
    return refuse(rotary->path, rotary->path + " rotates " + std::to_string(c.rotary_dim) +
                                    " dims of a " + std::to_string(c.head_dim) + "-dim head");
  if (c.rotary_dim < c.head_dim) {
    std::ostringstream a;
    a << "partial rotary: the leading " << c.rotary_dim << " of each head's " << c.head_dim
      << " dims rotate, their halves paired (the self-check's keys hold the layout)";
    p.assumed.push_back(a.str());
  }

  const int64_t qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  const auto& types = host.layer_types;
  if (!types.empty() && static_cast<int64_t>(types.size()) != c.layers)
    return refuse("", "the configuration declares " + std::to_string(types.size()) +
                          " layer types for " + std::to_string(c.layers) + " layers");
  if (!host.rope_layers.empty() && static_cast<int64_t>(host.rope_layers.size()) != c.layers)
    return refuse("", "the configuration marks rotary on " +
                          std::to_string(host.rope_layers.size()) + " layers of " +
                          std::to_string(c.layers));
  for (int64_t i = 0; i < c.layers; ++i) {
    DecodeLayerPlan& L = p.layers[i];
    const std::string& where = layer_paths[i];
    DecodeLayerConfig lc;
    // The attention this layer computes: full, or over a sliding window (declared per layer,
    // or for every layer by a window without layer types, as Mistral's).
    const std::string type = types.empty() ? "" : types[i];
    if (type == "sliding_attention" || (type.empty() && host.sliding_window > 0)) {
      if (host.sliding_window <= 0)
        return refuse(where, where + " is a sliding-window layer without a declared window");
      lc.window = host.sliding_window;
    } else if (!type.empty() && type != "full_attention") {
      return refuse(where, where + " is a '" + type +
                               "' layer; the loop computes full and sliding-window attention");
    }
    // Its rotary table, or none.
    if (!host.rope_layers.empty() && host.rope_layers[i] == 0) {
      lc.rotary = -1;
    } else {
      const std::string want =
          rf.inv_freq_of.empty() ? "" : (type.empty() ? "full_attention" : type);
      const auto it = std::find(table_types.begin(), table_types.end(), want);
      if (it == table_types.end())
        return refuse(rotary->path, rotary->path + " holds no frequencies for '" + want +
                                        "' layers (" + where + ")");
      lc.rotary = static_cast<int32_t>(it - table_types.begin());
    }
    // Its norms, each measured.
    float eps = 0;
    for (const char* slot : kDecodeNormSlots)
      if (L.slots.count(slot) && !pl.norm(L.slots.at(slot), c.hidden, &eps)) return p;
    c.eps = eps;
    if (L.slots.count("q_norm") != L.slots.count("k_norm"))
      return refuse(where, where + " normalises one of q and k");
    if (L.slots.count("q_norm")) {
      const HostModule* qn = g.find(L.slots.at("q_norm"));
      const bool whole = qn != nullptr && qn->in_features == qd && qd != c.head_dim;
      lc.qk_norm = whole ? QkNorm::whole : QkNorm::per_head;
      if (!pl.norm(L.slots.at("q_norm"), whole ? qd : c.head_dim, nullptr) ||
          !pl.norm(L.slots.at("k_norm"), whole ? kvd : c.head_dim, nullptr))
        return p;
    }
    if (L.slots.count("qkv")) {
      if (!pl.projection(L.slots.at("qkv"), qd + 2 * kvd, c.hidden, true)) return p;
    } else if (!pl.projection(L.slots.at("q"), qd, c.hidden, true) ||
               !pl.projection(L.slots.at("k"), kvd, c.hidden, true) ||
               !pl.projection(L.slots.at("v"), kvd, c.hidden, true)) {
      return p;
    }
    if (!pl.projection(L.slots.at("o"), c.hidden, qd, true)) return p;
    // Routed or dense, from what the layer holds (Note [Routed layers]).
    if (L.slots.count("experts")
            ? !pl.routed(where, L, c.hidden)
            : !pl.gated_ffn(where, L, "mlp", {"gate", "up", "down", "act"}, c.intermediate,
                            c.hidden, &L.mlp_seated, &L.activation))
      return p;
    c.layer.push_back(lc);
  }
  float unused = 0;
  if (!pl.norm(p.stack.at("final_norm"), c.hidden, &unused)) return p;
  if (!pl.projection(p.head, c.vocab, c.hidden, false)) {
    p.refused.back().second =
        "the output head has a bias or another form: " + p.refused.back().second;
    return p;
  }
  return p;
}

}  // namespace

// Note [Choosing a binding]: each binding describes one family's structure (where its norms sit,
// fused or separate projections). Without a binding named, every shipped one is planned and the
// first that plans whole is taken; else the first that fits the structure (Note [Every weight is
// a slot]), whose refusal names a form; else a refusal that says what each binding found.
// Bindings are exclusive by construction: each claims every weight of a layer, so two families'
// bindings cannot both fit one host.
DecodePlan plan_decode(const HostGraph& g, const Catalog& catalog, const std::string& binding,
                       int64_t max_len, int64_t sequences, const std::string& kv_cache) {
  const std::optional<DType> cache = parse_dtype(kv_cache);
  if (!cache || (*cache != DType::f32 && *cache != DType::bf16)) {
    DecodePlan p;
    p.binding = binding;
    p.refused.emplace_back("", "a KV cache of '" + kv_cache + "'; the loop keeps f32 or bf16");
    return p;
  }
  if (max_len < 1) {
    DecodePlan p;
    p.binding = binding;
    p.refused.emplace_back("", "a static window of " + std::to_string(max_len) + " positions");
    return p;
  }
  if (sequences < 1 || sequences > FRT_MAX_ROWS) {
    DecodePlan p;
    p.binding = binding;
    p.refused.emplace_back("", "a batch of " + std::to_string(sequences) +
                                   " sequences; the loop runs 1.." + std::to_string(FRT_MAX_ROWS) +
                                   " (the kernels' row band)");
    return p;
  }
  if (!binding.empty()) {
    DecodePlan p = plan_with(g, catalog.binding(binding), max_len);
    p.config.sequences = sequences;
    p.config.cache_dtype = *cache;
    return p;
  }
  std::optional<DecodePlan> fitting;
  std::string why;
  for (const auto& [name, spec] : catalog.bindings()) {
    DecodePlan p = plan_with(g, spec, max_len);
    p.config.sequences = sequences;
    p.config.cache_dtype = *cache;
    if (p.ok()) return p;
    if (p.fits && !fitting)
      fitting = std::move(p);
    else if (!p.fits)
      why += (why.empty() ? "" : "; ") + name + ": " + p.refused.front().second;
  }
  if (fitting) return *fitting;
  DecodePlan none;
  none.refused.emplace_back("", "no decode binding describes this host (" + why + ")");
  return none;
}

namespace {

// Layer indices as ranges: "0, 2-4, 7".
std::string ranges(const std::vector<int64_t>& xs) {
  std::string out;
  for (size_t i = 0; i < xs.size();) {
    size_t j = i;
    while (j + 1 < xs.size() && xs[j + 1] == xs[j] + 1) ++j;
    out += (out.empty() ? "" : ", ") + std::to_string(xs[i]) +
           (j > i ? "-" + std::to_string(xs[j]) : "");
    i = j + 1;
  }
  return out;
}

// What the program computes for a buildable plan: each primitive the family needs, chosen.
void explain_program(std::ostringstream& s, const DecodePlan& p) {
  const DecodeConfig& c = p.config;
  if (!p.ok() || p.layers.empty() || c.layer.size() != p.layers.size()) return;
  const DecodeLayerPlan& L0 = p.layers.front();
  const auto has = [&](const char* slot) { return L0.slots.count(slot) > 0; };
  const auto where = [&](const char* in, const char* out) {
    return std::string(has(in) && has(out) ? "before and after" : has(in) ? "before" : "after");
  };
  s << "\nprogram:\n  norms " << (c.norm_plus_one ? "x·(1+w)/rms(x)" : "x·w/rms(x)") << " "
    << where("attn_in_norm", "attn_out_norm") << " attention, "
    << where("ffn_in_norm", "ffn_out_norm") << " the feed-forward\n";
  s << "  q/k/v " << (has("qkv") ? "one fused projection" : "three projections");
  const QkNorm qk = c.layer.front().qk_norm;
  s << (qk == QkNorm::per_head ? ", q/k norms per head"
        : qk == QkNorm::whole  ? ", q/k norms over the whole projection"
                               : "");
  s << (L0.slots.count("gate_up") ? "; gate/up one fused projection" : "") << "\n";
  std::vector<int64_t> full, sliding, plain;
  for (int64_t i = 0; i < static_cast<int64_t>(c.layer.size()); ++i) {
    (c.layer[i].window > 0 ? sliding : full).push_back(i);
    if (c.layer[i].rotary < 0) plain.push_back(i);
  }
  s << "  rotary: " << c.rotaries.size() << (c.rotaries.size() == 1 ? " table" : " tables")
    << " over " << c.rotary_dim << " of " << c.head_dim << " dims";
  if (!plain.empty()) s << "; none on layers " << ranges(plain);
  s << "\n  attention: ";
  if (!full.empty()) s << "full on layers " << ranges(full);
  if (!sliding.empty())
    s << (full.empty() ? "" : "; ") << "a sliding window of " << c.layer[sliding[0]].window
      << " on layers " << ranges(sliding);
  if (c.attention_softcap > 0) s << "; scores softcapped at " << c.attention_softcap;
  s << "\n";
  std::ostringstream scalars;
  if (c.embed_scale != 1.0f) scalars << " embedding x" << c.embed_scale << ";";
  if (c.residual_scale != 1.0f) scalars << " residuals x" << c.residual_scale << ";";
  if (c.attention_scale > 0) scalars << " q·k x" << c.attention_scale << ";";
  if (c.logits_divisor != 1.0f) scalars << " logits /" << c.logits_divisor << ";";
  if (c.final_softcap > 0) scalars << " logits softcapped at " << c.final_softcap << ";";
  if (!scalars.str().empty()) {
    std::string text = scalars.str();
    s << "  scalars:" << text.substr(0, text.size() - 1) << "\n";
  }
}

}  // namespace

std::string explain(const DecodePlan& p, bool verbose) {
  std::ostringstream s;
  const DecodeConfig& c = p.config;
  s << "flashrt decode plan: binding " << (p.binding.empty() ? "(none)" : p.binding) << ", "
    << c.layers << " layers, hidden " << c.hidden << ", heads " << c.heads << "/" << c.kv_heads
    << " x " << c.head_dim << ", vocab " << c.vocab << ", window " << c.max_len
    << (c.sequences > 1 ? " x " + std::to_string(c.sequences) + " sequences" : "")
    << (c.cache_dtype != DType::f32 ? std::string(", ") + name_of(c.cache_dtype) + " KV cache" : "")
    << ", " << p.seated << " seated, " << (p.ok() ? "buildable" : "refused") << "\n";
  explain_program(s, p);
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
