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
    const HostModule* mlp = L.slots.count("mlp") ? g.find(L.slots.at("mlp")) : nullptr;
    if (mlp != nullptr && mlp->seated == OpKind::gated_ffn) {
      L.mlp_seated = true;
      ++p.seated;
    } else {
      for (const char* name : {"gate", "up", "down", "act"})
        if (!L.slots.count(name))
          return refuse(join_path(where, name),
                        "a required slot is absent on this host: " + join_path(where, name));
      if (!pl.projection(L.slots.at("gate"), c.intermediate, c.hidden, false) ||
          !pl.projection(L.slots.at("up"), c.intermediate, c.hidden, false) ||
          !pl.projection(L.slots.at("down"), c.hidden, c.intermediate, false))
        return p;
      const HostModule* act = g.find(L.slots.at("act"));
      L.activation = act != nullptr && act->kind == ModuleKind::activation ? act->activation
                                                                           : Activation::unknown;
      if (!covers(b.activations, L.activation))
        return refuse(L.slots.at("act"), L.slots.at("act") + " activation '" +
                                             name_of(L.activation) + "' outside {" +
                                             names_of(b.activations) + "}");
    }
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
  std::vector<detail::ExplainEntry> refused, assumed;
  for (const auto& [site, why] : p.refused)
    refused.push_back(
        {site, "  " + (site.empty() ? std::string("(host)") : site) + "  " + why + "\n"});
  for (const std::string& a : p.assumed)
    assumed.push_back({a.substr(0, a.find_first_of(": ")), "  " + a + "\n"});
  bool merged = false;
  for (const auto& [title, entries] : {std::pair{"refused", &refused}, {"assumed", &assumed}}) {
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
