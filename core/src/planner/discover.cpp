// Structural discovery: which regions of the host each catalog structure describes, read from the
// structure's match pattern (Note [Match patterns] in catalog.h). Matching uses module kinds,
// weight shapes and the dataflow of the observed forward (which tensors calls shared), never type
// or model names. A pattern recognised but out of boundary is an explicit refusal; a host a
// structure does not describe yields nothing.
#include <flashrt/errors.h>
#include <flashrt/plan.h>

#include <algorithm>
#include <cstdio>
#include <set>

namespace frt {
namespace {

std::string parent_of(const std::string& path) {
  const auto dot = path.rfind('.');
  return dot == std::string::npos ? "" : path.substr(0, dot);
}

std::string weight_shape(const HostModule& m) {
  return "[" + std::to_string(m.out_features) + "x" + std::to_string(m.in_features) + "]";
}

// "128 experts, gate/up [768x2048], down [2048x768], top-8": a bank as refusals and explain
// quote it (one expert's shapes; the host's own tensor names where they differ).
std::string bank_shape(const HostModule& m) {
  const ExpertFacts& e = m.experts;
  const std::string f = std::to_string(e.intermediate), d = std::to_string(e.hidden);
  std::string out = std::to_string(e.experts) + " experts, gate/up [" + f + "x" + d + "], down [" +
                    d + "x" + f + "]";
  if (e.top_k > 0) out += ", top-" + std::to_string(e.top_k);
  return out;
}

// The dims a function structure's node binds, from the module's facts (node_dims' order).
std::vector<int64_t> function_dims(const HostModule& m, NodeKind kind) {
  if (kind == NodeKind::recurrence) {
    const RecurrenceFacts& r = m.recurrence;
    return {r.k_heads, r.v_heads, r.k_dim, r.v_dim};
  }
  if (kind == NodeKind::norm) return {m.in_features};
  if (kind == NodeKind::attention) {
    const AttentionFacts& f = m.attention;
    return {f.heads, f.kv_heads, f.head_dim};
  }
  if (kind == NodeKind::rotary) return {m.rotary.heads, m.rotary.kv_heads, m.rotary.head_dim};
  if (kind == NodeKind::block) return {m.block.hidden};
  return {m.conv.channels, m.conv.taps};
}

// A function structure's one node is the seat's whole unit (catalog.cpp checks that it is one
// node); a norm node elsewhere is part of a region of projections.
// A block structure's one node is its whole unit too.
bool function_unit(const StructureSpec& spec) {
  return spec.kind == "function" || spec.kind == "block";
}

std::string eps_text(double eps) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", eps);
  return buf;
}

// "q/k 16x128, v 32x128" (heads x dim), "6144 channels x 4 taps" or "[1024] rms, eps 1e-06": a
// function seam as refusals and explain quote it.
std::string function_shape(const HostModule& m) {
  if (m.kind == ModuleKind::recurrence) {
    const RecurrenceFacts& r = m.recurrence;
    return "q/k " + std::to_string(r.k_heads) + "x" + std::to_string(r.k_dim) + ", v " +
           std::to_string(r.v_heads) + "x" + std::to_string(r.v_dim);
  }
  if (m.kind == ModuleKind::attention) {
    const AttentionFacts& f = m.attention;
    std::string s = std::to_string(f.heads) + " heads / " + std::to_string(f.kv_heads) + " kv of " +
                    std::to_string(f.head_dim);
    if (f.softcap > 0) s += ", softcap " + eps_text(f.softcap);
    if (f.sliding_window > 0) s += ", window " + std::to_string(f.sliding_window);
    return s;
  }
  if (m.kind == ModuleKind::rotary) {
    const RotaryFacts& f = m.rotary;
    return "q " + std::to_string(f.heads) + " / k " + std::to_string(f.kv_heads) + " heads of " +
           std::to_string(f.head_dim);
  }
  if (m.kind == ModuleKind::norm)
    return "[" + std::to_string(m.in_features) + "] " + name_of(m.norm.form) + ", eps " +
           eps_text(m.norm.eps);
  if (m.kind == ModuleKind::block) return "hidden " + std::to_string(m.block.hidden);
  return std::to_string(m.conv.channels) + " channels x " + std::to_string(m.conv.taps) + " taps";
}

// An attention node takes modules of its cache kind only: a structure for the keys and values each
// call hands never stands for a serving engine's pool of slots, nor the other way round.
bool attention_fits(const MatchNode& n, const HostModule& m) {
  return m.kind == ModuleKind::attention && m.attention.cache == n.cache;
}

// The observed calls by module path, built once per discovery: the matcher asks for them at
// every step of its search.
class CallIndex {
 public:
  explicit CallIndex(const HostGraph& g) {
    for (const HostCall& c : g.calls) by_path_[c.path].push_back(&c);
  }
  const std::vector<const HostCall*>& of(const std::string& path) const {
    static const std::vector<const HostCall*> kNone;
    const auto it = by_path_.find(path);
    return it == by_path_.end() ? kNone : it->second;
  }

 private:
  std::map<std::string, std::vector<const HostCall*>> by_path_;
};

bool shares_input(const CallIndex& g, const std::string& a, const std::string& b) {
  for (const HostCall* ca : g.of(a))
    for (const HostCall* cb : g.of(b))
      if (ca->input_id == cb->input_id) return true;
  return false;
}

bool feeds(const CallIndex& g, const std::string& producer, const std::string& consumer) {
  for (const HostCall* p : g.of(producer))
    for (const HostCall* c : g.of(consumer))
      if (p->output_id == c->input_id) return true;
  return false;
}

bool modulates(const CallIndex& g, const std::string& norm, const std::string& consumer) {
  for (const HostCall* n : g.of(norm))
    for (const HostCall* c : g.of(consumer))
      if (c->modulated_from != 0 && c->modulated_from == n->output_id) return true;
  return false;
}

bool holds(const CallIndex& g, const FlowEdge& e, const std::string& a, const std::string& b) {
  switch (e.kind) {
    case FlowKind::modulates:
      return modulates(g, a, b);
    case FlowKind::same_input:
      return shares_input(g, a, b);
    case FlowKind::feeds:
      return feeds(g, a, b);
    case FlowKind::not_feeds:
      return !feeds(g, a, b);
  }
  return false;
}

// One assignment of the pattern's nodes to host modules.
using Assignment = std::map<std::string, const HostModule*>;

class Matcher {
 public:
  Matcher(const HostGraph& g, const CallIndex& calls, const StructureSpec& spec,
          const std::set<std::string>& taken)
      : g_(g), calls_(calls), spec_(spec), taken_(taken) {}

  // The first complete assignment whose first node is `first`, preferring modules beside the
  // first node (siblings) so a region inside one module is found before a scattered one.
  bool find(const HostModule* first, Assignment& out) {
    out.clear();
    dims_.clear();
    return extend(0, first, out);
  }

  bool fits(const MatchNode& n, const HostModule& m) const {
    if (taken_.count(m.path) || calls_.of(m.path).empty()) return false;
    if (n.kind == NodeKind::activation) return m.kind == ModuleKind::activation;
    if (n.kind == NodeKind::norm) return m.kind == ModuleKind::norm;
    if (n.kind == NodeKind::experts) return m.kind == ModuleKind::experts;
    if (n.kind == NodeKind::recurrence) return m.kind == ModuleKind::recurrence;
    if (n.kind == NodeKind::conv) return m.kind == ModuleKind::conv;
    if (n.kind == NodeKind::attention) return attention_fits(n, m);
    if (n.kind == NodeKind::rotary) return m.kind == ModuleKind::rotary;
    if (n.kind == NodeKind::block) return m.kind == ModuleKind::block;
    return m.kind == ModuleKind::linear &&
           (!n.output_head || (!g_.output_head.empty() && m.path == g_.output_head));
  }

 private:
  bool bind_dim(const std::string& dim, int64_t value, std::vector<std::string>& bound) {
    const auto it = dims_.find(dim);
    if (it != dims_.end()) return it->second == value;
    dims_[dim] = value;
    bound.push_back(dim);
    return true;
  }

  bool extend(size_t i, const HostModule* first, Assignment& a) {
    const std::vector<MatchNode>& nodes = spec_.match.nodes;
    if (i == nodes.size()) return true;
    const MatchNode& n = nodes[i];
    std::vector<const HostModule*> candidates;
    if (i == 0) {
      candidates.push_back(first);
    } else {
      const std::string home = parent_of(a.at(nodes[0].name)->path);
      for (const HostModule& m : g_.modules)
        if (parent_of(m.path) == home) candidates.push_back(&m);
      if (!spec_.match.siblings)
        for (const HostModule& m : g_.modules)
          if (parent_of(m.path) != home) candidates.push_back(&m);
    }
    for (const HostModule* m : candidates) {
      if (!fits(n, *m)) continue;
      bool used = false;
      for (const auto& [_, other] : a) used |= other == m;
      if (used) continue;
      std::vector<std::string> bound;
      bool ok = true;
      if (n.kind == NodeKind::linear)
        ok = bind_dim(n.out_dim, m->out_features, bound) &&
             bind_dim(n.in_dim, m->in_features, bound);
      else if (n.kind == NodeKind::experts)
        ok = bind_dim(n.experts_dim, m->experts.experts, bound) &&
             bind_dim(n.out_dim, m->experts.intermediate, bound) &&
             bind_dim(n.in_dim, m->experts.hidden, bound);
      else if (function_unit(spec_)) {
        const std::vector<int64_t> values = function_dims(*m, n.kind);
        for (size_t j = 0; j < values.size() && ok; ++j)
          ok = bind_dim(node_dims(n.kind)[j], values[j], bound);
      }
      a[n.name] = m;
      for (const FlowEdge& e : spec_.match.flow) {
        if (!ok) break;
        if (a.count(e.a) && a.count(e.b) && (e.a == n.name || e.b == n.name))
          ok = holds(calls_, e, a.at(e.a)->path, a.at(e.b)->path);
      }
      if (ok && extend(i + 1, first, a)) return true;
      a.erase(n.name);
      for (const std::string& d : bound) dims_.erase(d);
    }
    // An optional node no module fits is left out of the region.
    return n.optional && extend(i + 1, first, a);
  }

  const HostGraph& g_;
  const CallIndex& calls_;
  const StructureSpec& spec_;
  const std::set<std::string>& taken_;
  std::map<std::string, int64_t> dims_;
};

// "gate/up [640x256], down [256x640]": linear nodes grouped by weight shape, in pattern order;
// a single projection is just its shape.
std::string shape_text(const StructureSpec& spec, const Assignment& a) {
  std::vector<std::pair<std::string, std::string>> groups;  // shape -> names
  size_t linears = 0;
  for (const MatchNode& n : spec.match.nodes)
    if (n.kind == NodeKind::experts && a.count(n.name)) return bank_shape(*a.at(n.name));
  for (const MatchNode& n : spec.match.nodes)
    if (function_unit(spec) && a.count(n.name)) return function_shape(*a.at(n.name));
  for (const MatchNode& n : spec.match.nodes) {
    if (n.kind != NodeKind::linear || !a.count(n.name)) continue;
    ++linears;
    const std::string shape = weight_shape(*a.at(n.name));
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& gr) { return gr.first == shape; });
    if (it == groups.end())
      groups.emplace_back(shape, n.name);
    else
      it->second += "/" + n.name;
  }
  if (linears == 1) return groups.front().first;
  std::string out;
  for (const auto& [shape, names] : groups) out += (out.empty() ? "" : ", ") + names + " " + shape;
  return out;
}

// Note [Enclosing site]: a `site: parent` region whose nodes sit in different modules (diffusers'
// FeedForward: the up projection inside the activation module, down beside it in a list) is
// still one seam when one module encloses them all and its every observed call reads the
// region's input and returns the region's output, the very tensors: that module computes the
// region and nothing else that reaches its output. The region's input is what its sources read
// (nodes no `feeds` edge points at), its output what its one sink returns (the node that feeds
// no other). The nearest enclosing module with observed calls is taken (a list that is never
// called is passed over); "" when no module qualifies or its calls show anything else.
std::string enclosing_site(const HostGraph& g, const CallIndex& calls, const StructureSpec& spec,
                           const Assignment& a) {
  std::set<std::string> fed, feeding;
  for (const FlowEdge& e : spec.match.flow)
    if (e.kind == FlowKind::feeds) feeding.insert(e.a), fed.insert(e.b);
  std::vector<std::string> sources, sinks;
  for (const MatchNode& n : spec.match.nodes) {
    if (!fed.count(n.name)) sources.push_back(a.at(n.name)->path);
    if (!feeding.count(n.name)) sinks.push_back(a.at(n.name)->path);
  }
  if (sinks.size() != 1 || sources.empty()) return "";
  // The deepest module strictly above every node.
  const auto above = [](const std::string& anc, const std::string& p) {
    return anc.empty() ? !p.empty()
                       : p.size() > anc.size() && p.compare(0, anc.size(), anc) == 0 &&
                             p[anc.size()] == '.';
  };
  std::string site = parent_of(a.begin()->second->path);
  for (;;) {
    bool all = true;
    for (const auto& [_, m] : a) all &= above(site, m->path);
    if (all || site.empty()) break;
    site = parent_of(site);
  }
  while (calls.of(site).empty() && !site.empty()) site = parent_of(site);
  const std::vector<const HostCall*>& outer = calls.of(site);
  if (outer.empty() || g.find(site) == nullptr || outer.size() != calls.of(sinks[0]).size())
    return "";
  for (const HostCall* c : outer) {
    bool out = false;
    for (const HostCall* s : calls.of(sinks[0])) out |= s->output_id == c->output_id;
    for (const std::string& src : sources) {
      bool in = false;
      for (const HostCall* s : calls.of(src)) in |= s->input_id == c->input_id;
      if (!in) return "";
    }
    if (!out) return "";
  }
  return site;
}

// "" when the matched region lies inside the structure's boundary, else the reason. `enclosed`:
// the nodes are split across modules but one module computes the region (Note [Enclosing site]).
std::string boundary_refusal(const StructureSpec& spec, const Assignment& a,
                             const std::map<std::string, int64_t>& dims, const std::string& shape,
                             bool enclosed) {
  bool biased = false;
  for (const MatchNode& n : spec.match.nodes)
    if (n.kind == NodeKind::linear && n.bias_slot.empty() && a.count(n.name) &&
        a.at(n.name)->has_bias)
      biased = true;
  if (biased) return "biased projections (" + shape + "); the boundary is bias-free";
  for (const MatchNode& n : spec.match.nodes) {
    if (n.kind != NodeKind::experts || !a.count(n.name)) continue;
    const HostModule& m = *a.at(n.name);
    const ExpertFacts& e = m.experts;
    if (e.gate_up.empty() && (e.gate.empty() || e.up.empty()))
      return "ungated experts in " + m.type_name + " (" + shape +
             "); the bank op computes down(act(gate x) * up x)";
    if (e.transposed)
      return "banks stored transposed or interleaved in " + m.type_name + " (" + shape +
             "); the bank op reads [experts, out, in], gate rows before up rows";
    if (e.has_bias)
      return "per-expert biases in " + m.type_name + " (" + shape + "); the bank op is bias-free";
    if (m.activation == Activation::unknown)
      return "the gated form of " + m.type_name +
             " is not act(gate x) * up x for any activation the kernels compute (measured on its "
             "calls: a clamped or otherwise different gate) (" +
             shape + ")";
    if (e.top_k > FRT_MAX_TOP_K)
      return "top-" + std::to_string(e.top_k) + " routing above the bank op's " +
             std::to_string(FRT_MAX_TOP_K) + " (" + shape + ")";
  }
  for (const MatchNode& n : spec.match.nodes) {
    if (n.kind != NodeKind::conv || !a.count(n.name)) continue;
    const ConvFacts& c = a.at(n.name)->conv;
    if (c.groups != c.channels)
      return "a convolution of " + std::to_string(c.groups) + " groups over " +
             std::to_string(c.channels) + " channels (" + shape + "); the op is depthwise";
    if (c.functions.empty())
      return "its weight was never handed to a convolution function in the observed forward (" +
             shape + ")";
  }
  for (const MatchNode& n : spec.match.nodes) {
    if (n.kind == NodeKind::linear || !a.count(n.name)) continue;
    const std::vector<std::string>& allowed = spec.attributes.at(n.attribute);
    const HostModule& m = *a.at(n.name);
    const std::string got =
        n.kind == NodeKind::norm         ? name_of(m.norm.form)
        : n.kind == NodeKind::recurrence ? name_of(m.recurrence.form)
        : n.kind == NodeKind::attention  ? name_of(m.attention.form)
        : n.kind == NodeKind::rotary     ? name_of(m.rotary.form)
        : n.kind == NodeKind::block      ? name_of(m.block.form)
        : n.kind == NodeKind::conv && !m.conv.activated
            ? std::string(kNoActivation)
            : name_of(n.kind == NodeKind::conv ? m.conv.activation : m.activation);
    if (std::find(allowed.begin(), allowed.end(), got) == allowed.end()) {
      std::string set;
      for (const std::string& v : allowed) set += (set.empty() ? "" : ", ") + v;
      std::string why = n.attribute + " '" + got + "' outside {" + set + "} (" + shape + ")";
      if (n.kind == NodeKind::recurrence && !m.recurrence.other.empty())
        why += ": " + m.recurrence.other;
      if (n.kind == NodeKind::attention && !m.attention.other.empty())
        why += ": " + m.attention.other;
      if (n.kind == NodeKind::rotary && !m.rotary.other.empty()) why += ": " + m.rotary.other;
      if (n.kind == NodeKind::block && !m.block.other.empty()) why += ": " + m.block.other;
      return why;
    }
  }
  for (const MatchNode& n : spec.match.nodes) {
    // A norm seat computes the module's own weight and epsilon: a norm seen only on its calls
    // (no weight of its own, its epsilon not read from the module) is not one it can stand for.
    if (n.kind != NodeKind::norm || !function_unit(spec) || !a.count(n.name)) continue;
    const NormFacts& f = a.at(n.name)->norm;
    if (!f.affine || f.eps <= 0)
      return "a norm without a weight of its own, its epsilon not read from the module (" + shape +
             ")";
  }
  for (const auto& [name, value] : dims) {
    const DimSpec* d = spec.dim(name);
    if (d == nullptr) continue;
    if (value < d->min || (d->max != -1 && value > d->max) || value % d->multiple_of != 0)
      return "dim " + name + " = " + std::to_string(value) + " outside the structure's bounds (" +
             shape + ")";
  }
  if (spec.match.site == SiteKind::parent && !enclosed) {
    std::map<std::string, std::vector<std::string>> homes;  // parent -> nodes
    for (const MatchNode& n : spec.match.nodes)
      if (a.count(n.name)) homes[parent_of(a.at(n.name)->path)].push_back(n.name);
    // A modulated norm whose modulation the door located: the region spans the norm's module,
    // the code that modulates its output and the projections' module.
    for (const MatchNode& n : spec.match.nodes) {
      if (n.kind != NodeKind::norm || !a.count(n.name) || homes.size() < 2) continue;
      const std::string& where = a.at(n.name)->norm.modulation;
      if (where.empty()) continue;
      std::string linears;
      for (const MatchNode& l : spec.match.nodes)
        if (l.kind == NodeKind::linear && a.count(l.name))
          linears += (linears.empty() ? "" : "/") + l.name;
      return "modulation of " + a.at(n.name)->path + " is computed " + where +
             "; no module boundary holds " + n.name + "\u2192modulation\u2192" + linears + " (" +
             shape + " in " + parent_of(a.at(spec.match.nodes.back().name)->path) +
             "), so its projections stay free for other structures";
    }
    if (homes.size() > 1) {
      std::string where;
      for (const auto& [home, names] : homes) {
        std::string list;
        for (const std::string& nm : names) list += (list.empty() ? "" : ", ") + nm;
        where +=
            (where.empty() ? "" : " and ") + (home.empty() ? "(root)" : home) + " (" + list + ")";
      }
      return "the region is split across modules " + where + " (" + shape +
             "); the boundary is one module, so its projections stay separate seams";
    }
  }
  return "";
}

Seam make_seam(const CallIndex& calls, const StructureSpec& spec, const Assignment& a,
               const std::string& site, const std::string& shape) {
  Seam s;
  s.site = site;
  s.structure = spec.name;
  s.shape = shape;
  const HostModule* first_linear = nullptr;  // the first weight node: a projection or a bank
  for (const MatchNode& n : spec.match.nodes) {
    if (!a.count(n.name)) continue;  // an optional node left out
    const HostModule& m = *a.at(n.name);
    s.nodes[n.name] = m.path;
    if (n.kind == NodeKind::activation) s.activation = m.activation;
    if (n.kind == NodeKind::experts) {
      const ExpertFacts& e = m.experts;
      if (first_linear == nullptr) first_linear = &m;
      s.activation = m.activation;
      for (const std::string& slot : n.bank_slots) s.slots[slot] = m.path;
      s.dims[n.experts_dim] = e.experts;
      s.dims[n.out_dim] = e.intermediate;
      s.dims[n.in_dim] = e.hidden;
      s.top_k = e.top_k;
      s.weight_count += 3 * e.experts * e.intermediate * e.hidden;
      continue;
    }
    if (function_unit(spec)) {
      first_linear = &m;
      if (n.kind == NodeKind::conv) s.activation = m.conv.activation;
      if (n.kind == NodeKind::norm) s.norm = m.norm;
      if (n.kind == NodeKind::attention) s.attention = m.attention;
      const std::vector<int64_t> values = function_dims(m, n.kind);
      for (size_t j = 0; j < values.size(); ++j) s.dims[node_dims(n.kind)[j]] = values[j];
      continue;
    }
    if (n.kind != NodeKind::linear) continue;
    if (first_linear == nullptr) first_linear = &m;
    s.slots[n.weight_slot] = m.path;
    if (m.has_bias && !n.bias_slot.empty()) s.slots[n.bias_slot] = m.path;
    s.dims[n.out_dim] = m.out_features;
    s.dims[n.in_dim] = m.in_features;
    s.weight_count += m.in_features * m.out_features;
  }
  s.weight_dtype = first_linear->weight_dtype;
  for (const HostCall* c : calls.of(first_linear->path)) {
    s.rows_seen.push_back(c->rows);
    s.act_dtype = c->dtype;
  }
  return s;
}

void discover_structure(const HostGraph& g, const CallIndex& calls, const StructureSpec& spec,
                        bool wanted, Discovery& out, std::set<std::string>& claimed) {
  const MatchSpec& match = spec.match;
  const MatchNode& lead = match.nodes.front();
  std::set<std::string> looked;  // modules a match or refusal already covered for this structure
  std::set<std::string> refused_sites;
  for (const HostModule& m : g.modules) {
    if (claimed.count(m.path) || looked.count(m.path)) continue;
    const bool kind_ok = lead.kind == NodeKind::linear       ? m.kind == ModuleKind::linear
                         : lead.kind == NodeKind::activation ? m.kind == ModuleKind::activation
                         : lead.kind == NodeKind::experts    ? m.kind == ModuleKind::experts
                         : lead.kind == NodeKind::recurrence ? m.kind == ModuleKind::recurrence
                         : lead.kind == NodeKind::conv       ? m.kind == ModuleKind::conv
                         : lead.kind == NodeKind::attention  ? attention_fits(lead, m)
                         : lead.kind == NodeKind::rotary     ? m.kind == ModuleKind::rotary
                         : lead.kind == NodeKind::block      ? m.kind == ModuleKind::block
                                                             : m.kind == ModuleKind::norm;
    if (!kind_ok || (lead.output_head && (g.output_head.empty() || m.path != g.output_head)))
      continue;
    // A single projection is the whole pattern: one the forward never called is named, since
    // nothing else could have claimed it.
    if (match.nodes.size() == 1 && calls.of(m.path).empty()) {
      if (match.always_claims) claimed.insert(m.path);
      if (wanted)
        out.refused.emplace_back(m.path,
                                 spec.name + ": " +
                                     (m.kind == ModuleKind::experts ? bank_shape(m)
                                      : function_unit(spec)         ? function_shape(m)
                                                                    : weight_shape(m)) +
                                     " never called in the observed forward, no form to qualify");
      continue;
    }
    Matcher matcher(g, calls, spec, claimed);
    Assignment a;
    if (!matcher.fits(lead, m) || !matcher.find(&m, a)) continue;
    for (const auto& [_, mod] : a) looked.insert(mod->path);
    const std::string shape = shape_text(spec, a);
    std::map<std::string, int64_t> dims;
    for (const MatchNode& n : match.nodes)
      if (n.kind == NodeKind::linear && a.count(n.name)) {
        dims[n.out_dim] = a.at(n.name)->out_features;
        dims[n.in_dim] = a.at(n.name)->in_features;
      } else if (n.kind == NodeKind::experts && a.count(n.name)) {
        dims[n.experts_dim] = a.at(n.name)->experts.experts;
        dims[n.out_dim] = a.at(n.name)->experts.intermediate;
        dims[n.in_dim] = a.at(n.name)->experts.hidden;
      } else if (function_unit(spec) && a.count(n.name)) {
        const std::vector<int64_t> values = function_dims(*a.at(n.name), n.kind);
        for (size_t j = 0; j < values.size(); ++j) dims[node_dims(n.kind)[j]] = values[j];
      }
    std::string site =
        match.site == SiteKind::node ? a.at(lead.name)->path : parent_of(a.at(lead.name)->path);
    bool split = false;
    for (const auto& [_, mod] : a) split |= parent_of(mod->path) != site;
    const std::string outer =
        match.site == SiteKind::parent && split ? enclosing_site(g, calls, spec, a) : "";
    const bool enclosed = !outer.empty();
    if (enclosed) site = outer;
    if (match.always_claims)
      for (const auto& [_, mod] : a) claimed.insert(mod->path);
    if (!wanted) continue;
    if (std::string why = boundary_refusal(spec, a, dims, shape, enclosed); !why.empty()) {
      // The region stays with the host as a whole; its modules remain free for other structures.
      if (refused_sites.insert(site).second) out.refused.emplace_back(site, spec.name + ": " + why);
      continue;
    }
    for (const auto& [_, mod] : a) claimed.insert(mod->path);
    Seam s = make_seam(calls, spec, a, site, shape);
    for (const MatchNode& n : match.nodes) {
      if (!n.output_head || !a.count(n.name)) continue;
      const HostModule* emb = g.find(g.input_embedding);
      s.tied = emb != nullptr && emb->weight_id == a.at(n.name)->weight_id;
      if (s.tied && !spec.tied_allowed) {
        out.refused.emplace_back(site, spec.name + ": weight tied to " + emb->path +
                                           "; the structure does not allow a tied weight");
        s.structure.clear();
      } else if (s.tied) {
        out.assumed.push_back(a.at(n.name)->path + ": weight tied to " + emb->path);
      }
    }
    if (!s.structure.empty()) out.seams.push_back(std::move(s));
  }
}

}  // namespace

Discovery discover(const HostGraph& g, const Catalog& catalog,
                   const std::vector<std::string>& structures) {
  for (const std::string& s : structures) catalog.get(s);  // throws, listing the known names
  std::vector<const StructureSpec*> specs;
  for (const std::string& name : catalog.names()) specs.push_back(&catalog.get(name));
  // Higher priority claims first; equal priorities in name order, so the result is stable.
  std::stable_sort(specs.begin(), specs.end(), [](const StructureSpec* a, const StructureSpec* b) {
    return a->match.priority > b->match.priority;
  });
  Discovery out;
  std::set<std::string> claimed;
  const CallIndex calls(g);
  for (const StructureSpec* spec : specs) {
    const bool wanted = structures.empty() || std::find(structures.begin(), structures.end(),
                                                        spec->name) != structures.end();
    if (wanted || spec->match.always_claims)
      discover_structure(g, calls, *spec, wanted, out, claimed);
  }
  return out;
}

}  // namespace frt
