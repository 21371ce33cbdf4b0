// Structural discovery: which regions of the host each structure describes. Matching uses module
// kinds, slot shapes and the dataflow of the observed forward (which tensors calls shared),
// never type or model names. A pattern recognised but out of boundary is an explicit refusal; a
// host a structure does not describe yields nothing.
#include <flashrt/errors.h>
#include <flashrt/plan.h>

#include <algorithm>
#include <set>
#include <sstream>

namespace frt {
namespace {

std::string shape_text(const HostModule& m) {
  return "[" + std::to_string(m.out_features) + "x" + std::to_string(m.in_features) + "]";
}

bool shares_input(const HostGraph& g, const std::string& a, const std::string& b) {
  for (const HostCall* ca : g.calls_of(a))
    for (const HostCall* cb : g.calls_of(b))
      if (ca->input_id == cb->input_id) return true;
  return false;
}

bool feeds(const HostGraph& g, const std::string& producer, const std::string& consumer) {
  for (const HostCall* p : g.calls_of(producer))
    for (const HostCall* c : g.calls_of(consumer))
      if (p->output_id == c->input_id) return true;
  return false;
}

Seam seam_from_linear(const HostGraph& g, const HostModule& m, const std::string& structure) {
  Seam s;
  s.site = m.path;
  s.structure = structure;
  s.slots = {{"weight", m.path}};
  if (m.has_bias) s.slots["bias"] = m.path;
  s.in_features = m.in_features;
  s.out_features = m.out_features;
  s.weight_dtype = m.weight_dtype;
  for (const HostCall* c : g.calls_of(m.path)) {
    s.rows_seen.push_back(c->rows);
    s.act_dtype = c->dtype;
  }
  return s;
}

// A gated feed-forward: inside one module, two projections of the same input (same shapes), an
// activation module consuming exactly one of the two outputs (the gate), and a third projection
// mapping their width back.
struct FfnMatch {
  const HostModule *gate = nullptr, *up = nullptr, *down = nullptr, *act = nullptr;
};

std::vector<FfnMatch> match_ffns(const HostGraph& g, const HostModule& parent) {
  std::vector<const HostModule*> linears, acts;
  for (const std::string& c : parent.children) {
    const HostModule* m = g.find(c);
    if (m == nullptr || g.calls_of(c).empty()) continue;
    if (m->kind == "linear") linears.push_back(m);
    if (m->kind == "activation") acts.push_back(m);
  }
  std::vector<FfnMatch> out;
  for (const HostModule* a : linears)
    for (const HostModule* b : linears) {
      if (a >= b || a->in_features != b->in_features || a->out_features != b->out_features ||
          !shares_input(g, a->path, b->path))
        continue;
      for (const HostModule* d : linears) {
        if (d == a || d == b || d->in_features != a->out_features ||
            d->out_features != a->in_features)
          continue;
        FfnMatch m{nullptr, nullptr, d, nullptr};
        for (const HostModule* act : acts) {
          if (feeds(g, a->path, act->path) && !feeds(g, b->path, act->path)) m = {a, b, d, act};
          if (feeds(g, b->path, act->path) && !feeds(g, a->path, act->path)) m = {b, a, d, act};
        }
        // Without an activation on exactly one branch this is not the pattern at all (an
        // attention block's q/k/v/o has the same shapes): nothing to refuse, nothing to claim.
        if (m.gate != nullptr) out.push_back(m);
      }
    }
  return out;
}

void discover_ffns(const HostGraph& g, Discovery& out, std::set<std::string>& claimed) {
  std::set<std::string> refused_sites;
  for (const HostModule& parent : g.modules) {
    if (parent.kind != "module") continue;
    for (const FfnMatch& m : match_ffns(g, parent)) {
      const std::string site = parent.path;
      if (claimed.count(m.up->path) || claimed.count(m.down->path)) continue;
      const std::string shapes = "gate/up " + shape_text(*m.up) + ", down " + shape_text(*m.down);
      std::string why;
      if (m.gate->has_bias || m.up->has_bias || m.down->has_bias) {
        why = "biased projections (" + shapes + "); the boundary is bias-free";
      } else if (m.act->activation != "silu" && m.act->activation != "gelu_tanh") {
        why = "activation '" + m.act->activation + "' outside {silu, gelu_tanh} (" + shapes + ")";
      }
      if (!why.empty()) {
        // The region stays with the host as a whole; its projections remain linear_proj seams.
        if (refused_sites.insert(site).second)
          out.refused.emplace_back(site, "decoder_ffn: " + why);
        continue;
      }
      claimed.insert({m.gate->path, m.up->path, m.down->path});
      Seam s;
      s.site = site;
      s.structure = "decoder_ffn";
      s.slots = {{"gate", m.gate->path}, {"up", m.up->path}, {"down", m.down->path}};
      s.activation = m.act->activation;
      s.in_features = m.gate->in_features;
      s.out_features = m.down->out_features;
      s.intermediate = m.gate->out_features;
      s.weight_dtype = m.gate->weight_dtype;
      for (const HostCall* c : g.calls_of(m.gate->path)) {
        s.rows_seen.push_back(c->rows);
        s.act_dtype = c->dtype;
      }
      out.seams.push_back(std::move(s));
    }
  }
}

}  // namespace

Discovery discover(const HostGraph& g, const std::vector<std::string>& structures) {
  const std::set<std::string> known = {"linear_proj", "decoder_ffn", "lm_head"};
  for (const std::string& s : structures)
    if (!known.count(s))
      throw InvalidArgument("unknown structure '" + s +
                            "'; known: decoder_ffn, linear_proj, lm_head");
  auto wanted = [&](const char* s) {
    return std::find(structures.begin(), structures.end(), s) != structures.end();
  };
  Discovery out;
  std::set<std::string> claimed;
  // The head first: it is a projection too, but a distribution-valued one with its own gate.
  if (!g.output_head.empty()) {
    const HostModule* head = g.find(g.output_head);
    if (head != nullptr && head->kind == "linear") {
      claimed.insert(head->path);
      if (wanted("lm_head")) {
        if (head->has_bias) {
          out.refused.emplace_back(head->path, "lm_head: biased head " + shape_text(*head) +
                                                   "; the boundary is bias-free");
        } else {
          Seam s = seam_from_linear(g, *head, "lm_head");
          const HostModule* emb = g.find(g.input_embedding);
          s.tied = emb != nullptr && emb->weight_id == head->weight_id;
          if (s.tied) out.assumed.push_back(head->path + ": weight tied to " + emb->path);
          out.seams.push_back(std::move(s));
        }
      }
    }
  }
  if (wanted("decoder_ffn")) discover_ffns(g, out, claimed);
  if (wanted("linear_proj")) {
    for (const HostModule& m : g.modules) {
      if (m.kind != "linear" || claimed.count(m.path)) continue;
      if (g.calls_of(m.path).empty()) {
        out.refused.emplace_back(m.path, "linear_proj: " + shape_text(m) +
                                             " never called in the observed forward, no form to "
                                             "qualify");
        continue;
      }
      out.seams.push_back(seam_from_linear(g, m, "linear_proj"));
    }
  }
  return out;
}

}  // namespace frt
