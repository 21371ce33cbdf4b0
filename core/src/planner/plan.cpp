// Qualification: for every seam, the scheme picks a weight form (or keeps the seam at host
// precision, with a reason), then the structure's ladder is walked until an impl qualifies: its
// package loads and its op takes the described form (supports_op, asked here at plan time).
// Every step aside is recorded; a seam no impl takes is refused with the form and the shape.
#include <flashrt/decisions.h>
#include <flashrt/errors.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/plan.h>

#include <algorithm>
#include <optional>
#include <set>
#include <sstream>

#include "util/explain_groups.h"

namespace frt {
namespace {

constexpr const char* kAuto = "auto";

bool usable(const SchemeSpec& s, KernelHub& hub) {
  for (const std::string& pkg : s.requires_packages)
    if (hub.resolve(pkg).table == nullptr) return false;
  return true;
}

Scheme resolve_scheme(const std::string& name, const Catalog& catalog, KernelHub& hub) {
  const SchemePolicy& policy = catalog.schemes();
  std::string chosen = name;
  if (name == kAuto) {
    for (const std::string& candidate : policy.auto_order)
      if (usable(policy.schemes.at(candidate), hub)) {
        chosen = candidate;
        break;
      }
  }
  const auto it = policy.schemes.find(chosen);
  if (it == policy.schemes.end()) {
    std::string known = kAuto;
    for (const auto& kv : policy.schemes) known += ", " + kv.first;
    throw InvalidArgument("unknown scheme '" + name + "'; known: " + known);
  }
  Scheme s;
  s.name = chosen;
  for (const auto& [structure, form] : it->second.formats)
    s.formats[structure] = policy.forms.at(form);
  s.statistics = it->second.statistics;
  s.calibration_rows = it->second.calibration_rows;
  return s;
}

// The band of rows a seat of this structure is qualified for: its decode-band dim.
const DimSpec* band_of(const StructureSpec& spec) {
  for (const DimSpec& d : spec.dims)
    if (d.decode_band) return &d;
  return nullptr;
}

std::string dtype_list(const std::vector<DType>& ds) {
  std::string out;
  for (DType d : ds) out += (out.empty() ? "" : ", ") + std::string(name_of(d));
  return out;
}

bool allows(const std::vector<DType>& ds, DType d) {
  return std::find(ds.begin(), ds.end(), d) != ds.end();
}

// One seat the rung would build, before the package is asked.
struct Candidate {
  SeatPlan seat;
  frt_op_desc desc{};
};

SlotTensor weight_of(const std::string& module) { return {module, "weight"}; }
SlotTensor bias_of(const std::string& module) { return {module, "bias"}; }

frt_op_desc base_desc(OpKind op, const WeightForm& form, DType act, int64_t rows_max) {
  frt_op_desc d{};
  d.op = static_cast<int32_t>(op);
  d.wformat = static_cast<int32_t>(form.format);
  d.group = form.group;
  d.scale_dtype = abi_dtype(form.scale_dtype);
  d.x_dtype = d.y_dtype = abi_dtype(act);
  d.rows_max = rows_max;
  return d;
}

// The seats a rung builds for a seam: one per linear node (per_node), or one for the region.
std::vector<Candidate> candidates(const HostGraph& g, const StructureSpec& spec, const Seam& seam,
                                  const Rung& rung, const WeightForm& form, DType act,
                                  const DimSpec& band, const PlanOptions& options) {
  std::vector<Candidate> out;
  SeatPlan base;
  base.seam = seam;
  base.package = rung.package;
  base.op = rung.op;
  base.form = form;
  base.impl = rung.impl + "_" + form.tag;
  base.band_min = band.min;
  base.band_max = band.max;
  base.activation = seam.activation;
  base.act_dtype = act;
  if (rung.op == OpKind::linear && rung.packed) {
    // One linear over the nodes' weights stacked along the output, in the order the host calls
    // them (the first called computes all; the door hands the others their columns).
    std::vector<std::pair<size_t, const HostModule*>> members;
    for (const MatchNode& n : spec.match.nodes) {
      if (n.kind != NodeKind::linear || !seam.nodes.count(n.name)) continue;
      const HostModule* m = g.find(seam.nodes.at(n.name));
      size_t first = g.calls.size();
      for (size_t i = 0; i < g.calls.size() && first == g.calls.size(); ++i)
        if (g.calls[i].path == m->path) first = i;
      members.emplace_back(first, m);
    }
    std::stable_sort(members.begin(), members.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    Candidate c{base, base_desc(OpKind::linear, form, act, band.max)};
    c.seat.site = seam.site;
    for (const auto& [_, m] : members) {
      c.seat.replaces.push_back(m->path);
      for (const MatchNode& n : spec.match.nodes) {
        if (!seam.nodes.count(n.name) || seam.nodes.at(n.name) != m->path) continue;
        c.seat.slots[n.weight_slot] = weight_of(m->path);
        if (m->has_bias) c.seat.slots[n.bias_slot] = bias_of(m->path);
      }
      c.desc.n += m->out_features;
      c.desc.k = m->in_features;
      c.desc.has_bias |= m->has_bias;
    }
    out.push_back(std::move(c));
    return out;
  }
  if (rung.op == OpKind::linear) {
    for (const MatchNode& n : spec.match.nodes) {
      if (n.kind != NodeKind::linear || !seam.nodes.count(n.name)) continue;
      const HostModule* m = g.find(seam.nodes.at(n.name));
      // An adopted projection keeps its own form (a region's may differ, seated per node).
      const auto own = options.source_forms.find(m->path);
      const WeightForm& f = own == options.source_forms.end() ? form : own->second;
      Candidate c{base, base_desc(OpKind::linear, f, act, band.max)};
      c.seat.form = f;
      c.seat.impl = rung.impl + "_" + f.tag;
      c.seat.site = rung.per_node ? m->path : seam.site;
      c.seat.replaces = {c.seat.site};
      c.seat.slots["weight"] = weight_of(m->path);
      if (m->has_bias) c.seat.slots["bias"] = bias_of(m->path);
      c.desc.n = m->out_features;
      c.desc.k = m->in_features;
      c.desc.has_bias = m->has_bias;
      out.push_back(std::move(c));
    }
    return out;
  }
  // A region op: its operands are the structure's slots of the same names (checked at load).
  Candidate c{base, base_desc(rung.op, form, act, band.max)};
  c.seat.site = seam.site;
  c.seat.replaces = {seam.site};
  const std::vector<std::string>& operands = op_weight_operands(rung.op);
  const HostModule* first = g.find(seam.slots.at(operands.front()));
  if (first->kind == ModuleKind::experts) {
    // A bank: each operand is one of the module's 3-D tensors, gate and up halves of one
    // [experts, 2F, D] tensor where the host fuses them.
    const ExpertFacts& e = first->experts;
    const bool fused = !e.gate_up.empty();
    c.seat.slots["gate"] =
        fused ? SlotTensor{first->path, e.gate_up, 0, 2} : SlotTensor{first->path, e.gate, 0, 1};
    c.seat.slots["up"] =
        fused ? SlotTensor{first->path, e.gate_up, 1, 2} : SlotTensor{first->path, e.up, 0, 1};
    c.seat.slots["down"] = SlotTensor{first->path, e.down, 0, 1};
    c.desc.k = c.desc.n = e.hidden;
    c.desc.inner = e.intermediate;
    c.desc.experts = e.experts;
    c.desc.top_k = static_cast<int32_t>(e.top_k);
    c.desc.act = static_cast<int32_t>(seam.activation);
    out.push_back(std::move(c));
    return out;
  }
  for (const auto& [slot, module] : seam.slots) {
    const bool is_bias = spec.slot(slot) != nullptr && spec.slot(slot)->shape.size() == 1;
    c.seat.slots[slot] = is_bias ? bias_of(module) : weight_of(module);
    c.desc.has_bias |= is_bias;
  }
  // The op's operands in the ABI's order: the first reads x ([inner x k]), the last writes y
  // ([n x inner]); the catalog load checked that linear nodes fill each of them.
  const HostModule* last = g.find(seam.slots.at(operands.back()));
  c.desc.k = first->in_features;
  c.desc.inner = first->out_features;
  c.desc.n = last->out_features;
  c.desc.act = static_cast<int32_t>(seam.activation);
  out.push_back(std::move(c));
  return out;
}

// The package of a ladder rung, or nullptr with the step aside recorded (and, once per package,
// its loader's report in the plan). A rung measured to pay on some builds only passes over the
// others, naming the build this machine resolved.
const frt_kernel_table* rung_table(KernelHub& hub, const Rung& rung, const std::string& impl,
                                   std::vector<std::string>& steps,
                                   std::set<std::string>& unavailable_noted, Plan& p) {
  const PackageResolution& r = hub.resolve(rung.package);
  if (r.table != nullptr && !rung.builds.empty()) {
    const std::string build = r.chosen.substr(r.chosen.rfind('-') + 1);
    if (std::find(rung.builds.begin(), rung.builds.end(), build) == rung.builds.end()) {
      std::string listed;
      for (const std::string& b : rung.builds) listed += (listed.empty() ? "" : ", ") + b;
      steps.push_back(impl + ": " + rung.package + "'s build here is " + r.chosen +
                      "; this rung pays on its " + listed + " build only (a portable path " +
                      "slower than the host's own)");
      return nullptr;
    }
  }
  if (r.table != nullptr) return r.table;
  steps.push_back(impl + ": kernel package " + rung.package + " unavailable");
  if (unavailable_noted.insert(rung.package).second)
    for (const UnavailableEntry& e : hub.unavailable_report())
      if (e.repo == rung.package) p.kernel_unavailable.push_back(e);
  return nullptr;
}

// A function seam (kind function: the gated delta rule, a causal convolution): no weight form,
// so no scheme decides it; it is seated at the host's precision wherever the ladder's package
// takes its dims and dtype, and serves every token count (a prompt and a decode step alike).
void plan_function_seam(const Catalog& catalog, const StructureSpec& spec, const Seam& seam,
                        KernelHub& hub, std::set<std::string>& unavailable_noted, Plan& p) {
  const std::string where = seam.structure + " " + seam.shape;
  const DType act = seam.act_dtype.value_or(seam.weight_dtype);
  const std::vector<DType>& act_dtypes = spec.inputs.front().dtypes;
  if (!allows(act_dtypes, act)) {
    p.refused.emplace_back(seam.site, where + ": activations " + std::string(name_of(act)) +
                                          " in the observed forward; impls take " +
                                          dtype_list(act_dtypes));
    return;
  }
  WeightForm form;
  form.name = "host";
  form.host = true;
  form.tag = name_of(act);
  SeatPlan base;
  base.seam = seam;
  base.site = seam.site;
  base.replaces = {seam.site};
  base.form = form;
  base.band_min = 1;
  base.band_max = kUnboundedRows;
  base.activation = seam.activation;
  base.act_dtype = act;
  frt_op_desc d{};
  d.x_dtype = d.y_dtype = abi_dtype(act);
  const auto dim = [&](const char* name) {
    const auto it = seam.dims.find(name);
    return it == seam.dims.end() ? int64_t{0} : it->second;
  };
  std::vector<std::string> steps;
  for (const Rung& rung : catalog.ladder(seam.structure)) {
    const std::string impl = rung.impl + "_" + form.tag;
    const frt_kernel_table* table = rung_table(hub, rung, impl, steps, unavailable_noted, p);
    if (table == nullptr) continue;
    d.op = static_cast<int32_t>(rung.op);
    if (rung.op == OpKind::gated_delta) {
      d.k = dim("k_dim");
      d.n = dim("v_dim");
    } else if (rung.op == OpKind::rmsnorm) {
      d.k = d.n = dim("width");
    } else if (rung.op == OpKind::attention || rung.op == OpKind::paged_attention ||
               rung.op == OpKind::sequence_attention || rung.op == OpKind::rotary) {
      d.k = d.n = dim("head_dim");
    } else {
      d.n = dim("channels");
      d.k = dim("taps");
      d.act = seam.activation == Activation::unknown ? -1 : static_cast<int32_t>(seam.activation);
    }
    if (std::string why = form_refusal(*table, d); !why.empty()) {
      steps.push_back(impl + ": " + why);
      continue;
    }
    SeatPlan seat = base;
    seat.package = rung.package;
    seat.op = rung.op;
    // A norm's seat reads the module's own weight (copied at bind); a function's reads no weight.
    if (rung.op == OpKind::rmsnorm) seat.slots["weight"] = weight_of(seam.site);
    // Attention serves decode rows, one query token per sequence; a prompt's call is the host's.
    if (rung.op == OpKind::attention || rung.op == OpKind::paged_attention) seat.band_max = 1;
    seat.impl = impl;
    seat.ladder = steps;
    p.seats.push_back(std::move(seat));
    return;
  }
  std::string why = where + ": no impl qualifies";
  if (catalog.ladder(seam.structure).empty()) why += "; the catalog declares no ladder";
  for (const std::string& step : steps) why += "; " + step;
  p.refused.emplace_back(seam.site, why);
}

// Note [Decoder block assembly]: a decoder layer is seated as one block only where every part
// of it already has a seat of this plan: its two norms, its feed-forward, its attention, the
// attention module's q/k/v (one pack in the order q, k, v, or a linear seat each) and o
// projections, its per-head q/k norms where it has them, and the rotary module whose tables its
// call carried. The block seat then runs those seats in turn (runtime/block_seat.cpp), so it
// holds no weight of its own and its band is the narrowest of theirs; any part left with the
// host (kept, refused, not asked for) keeps the layer with the host's forward, whose sublayers
// keep their own seats: a keep-at-host naming that part, never a refusal of the layer's weights.
// Note [Routed decoder block]: a layer whose feed-forward is routed (Qwen3-MoE, Mixtral) is a
// block too when that module holds exactly a seated bank of experts and the router that
// picks its rows' experts, and the door measured the router to be the top-k of softmax(x W^T),
// renormalised or not (RouterFacts, observe/routing.py; router_refusal() judges them, as it
// does decode_loop's routers). The block then runs the router itself
// (its weight copied, logits on the dense op, the choice in choose_experts(), as decode_loop
// does) and the bank's seat with that choice, so the layer's whole decode step is two calls into
// the core. A shared expert beside the bank (Qwen2-MoE's `shared_expert` and its sigmoid
// `shared_expert_gate`) is part of the block when the expert has a feed-forward seat of this
// plan and its gate is a [1, hidden] fp32 projection without bias: the block copies the gate's
// weight as it copies the router's and adds sigmoid(x g) * shared(x) to the bank's sum, the
// composition decode_loop assumes too (Note [Routed layers] in decode/plan_decode.cpp). Any
// other weight in the module (a second shared expert, a gate with a bias, a router with a
// bias) keeps the layer with the host's forward, the reason naming it; the bank keeps its own
// seat there. The block's first decode call is checked against the host's layer like any
// block's (block_seats.py), which catches a composition the measurement did not show (a
// router whose choice its module uses some other way, a shared expert mixed in otherwise).
struct RoutedParts {
  RouterFacts router;
  std::string router_path;
  std::string shared_gate;  // the shared expert's gate, "" without a shared expert
};

// Why the weights of `ffn` outside its bank and router are not a shared expert the block adds
// as sigmoid(x g) * shared(x); "" when the module holds no other weight, or exactly such an
// expert. On "" with a shared expert, `shared` is its seat and `gate` its gate's path.
std::string shared_expert_refusal(const HostGraph& g, const std::string& ffn,
                                  const std::string& bank, const std::string& router,
                                  int64_t hidden, const Plan& p, const SeatPlan*& shared,
                                  std::string& gate) {
  const auto below = [](const std::string& path, const std::string& root) {
    return path == root || path.rfind(root + ".", 0) == 0;
  };
  // The direct child of ffn that `path` lies in ("" for ffn itself).
  const auto child_of_ffn = [&](const std::string& path) -> std::string {
    if (path.size() <= ffn.size()) return "";
    const size_t dot = path.find('.', ffn.size() + 1);
    return dot == std::string::npos ? path : path.substr(0, dot);
  };
  for (const HostParam& w : g.params) {
    if (!below(w.module, ffn) || below(w.module, bank) || below(w.module, router)) continue;
    const std::string child = child_of_ffn(w.module);
    const HostModule* m = g.find(w.module);
    const bool gate_like = m != nullptr && w.module == child && m->kind == ModuleKind::linear &&
                           w.name == "weight" && m->out_features == 1 && m->in_features == hidden;
    if (gate_like && gate.empty()) {
      if (m->has_bias || m->weight_dtype != DType::f32)
        return "its shared expert's gate " + w.module + " [1, " + std::to_string(hidden) + "] " +
               (m->has_bias ? "has a bias" : "holds " + std::string(name_of(m->weight_dtype))) +
               "; the block mixes a shared expert by sigmoid(x g), g fp32 without bias";
      gate = w.module;
      continue;
    }
    if (gate_like || child.empty())
      return "it holds " + w.module + "." + w.name + " beside its router, bank and shared expert";
    if (shared != nullptr && shared->site == child) continue;
    const auto seat = std::find_if(p.seats.begin(), p.seats.end(), [&](const SeatPlan& s) {
      return s.site == child && s.replaces.size() == 1 &&
             (s.op == OpKind::gated_ffn || s.op == OpKind::ffn);
    });
    if (shared != nullptr || seat == p.seats.end())
      return "it holds " + w.module + "." + w.name + " beside its router and bank" +
             (shared != nullptr ? " and its shared expert " + shared->site
                                : ", in no feed-forward seat of this plan (a shared expert is "
                                  "in the block as a seated feed-forward)");
    shared = &*seat;
  }
  if ((shared == nullptr) != gate.empty())
    return shared != nullptr
               ? "its shared expert " + shared->site + " has no [1, " + std::to_string(hidden) +
                     "] gate beside it (the block mixes it by sigmoid(x g))"
               : "it holds the [1, " + std::to_string(hidden) + "] projection " + gate +
                     " but no shared expert for it to gate";
  return "";
}

bool routed_ffn(const HostGraph& g, const std::string& ffn, const Plan& p,
                std::vector<std::pair<std::string, const SeatPlan*>>& parts, RoutedParts& out,
                std::string& missing) {
  const std::string prefix = ffn + ".";
  const SeatPlan* bank = nullptr;
  for (const SeatPlan& s : p.seats)
    if (s.op == OpKind::moe_ffn && s.replaces.size() == 1 && s.site.rfind(prefix, 0) == 0 &&
        s.site.find('.', prefix.size()) == std::string::npos)
      bank = &s;
  if (bank == nullptr) return false;
  const HostModule* bm = g.find(bank->site);
  const HostModule* rm =
      bm != nullptr && !bm->experts.router.empty() ? g.find(bm->experts.router) : nullptr;
  std::string why;
  const SeatPlan* shared = nullptr;
  std::string gate;
  if (rm == nullptr) {
    why = "no router located beside its bank " + bank->site;
  } else if (why = router_refusal(*rm, bm->experts.experts, bm->experts.hidden); !why.empty()) {
    why = "its router: " + why;
  } else if (rm->weight_dtype != DType::f32) {
    why = "its router " + rm->path + " holds " + name_of(rm->weight_dtype) +
          " weights; the block routes in fp32 as an fp32 host does";
  } else {
    why = shared_expert_refusal(g, ffn, bank->site, rm->path, bm->experts.hidden, p, shared, gate);
  }
  if (!why.empty()) {
    missing += (missing.empty() ? "" : ", ") + std::string("ffn ") + ffn + ": " + why;
    return true;
  }
  parts.emplace_back("bank", bank);
  if (shared != nullptr) parts.emplace_back("shared", shared);
  out.router = rm->router;
  out.router_path = rm->path;
  out.shared_gate = gate;
  return true;
}

void plan_block_seam(const Catalog& catalog, const Seam& seam, const HostGraph& g, Plan& p) {
  const HostModule* layer = g.find(seam.site);
  const BlockFacts& f = layer->block;
  const std::string where = seam.structure + " " + seam.shape;
  const auto seat_at = [&](const std::string& path) -> const SeatPlan* {
    for (const SeatPlan& s : p.seats)
      if (s.site == path && s.replaces.size() == 1) return &s;
    return nullptr;
  };
  std::vector<std::pair<std::string, const SeatPlan*>> parts;
  std::string missing;
  const auto need = [&](const char* role, const std::string& path, std::vector<OpKind> ops) {
    if (path.empty()) return;
    const SeatPlan* s = seat_at(path);
    if (s == nullptr || std::find(ops.begin(), ops.end(), s->op) == ops.end()) {
      missing += (missing.empty() ? "" : ", ") + std::string(role) + " " + path;
      return;
    }
    parts.emplace_back(role, s);
  };
  need("input_norm", f.input_norm, {OpKind::rmsnorm});
  need("post_norm", f.post_norm, {OpKind::rmsnorm});
  RoutedParts routed;
  if (const SeatPlan* dense = seat_at(f.ffn);
      dense != nullptr || !routed_ffn(g, f.ffn, p, parts, routed, missing))
    need("ffn", f.ffn, {OpKind::gated_ffn, OpKind::ffn});
  need("attention", f.attention, {OpKind::attention});
  need("o", f.o, {OpKind::linear});
  need("q_norm", f.q_norm, {OpKind::rmsnorm});
  need("k_norm", f.k_norm, {OpKind::rmsnorm});
  need("rotary", f.rotary, {OpKind::rotary});
  const std::vector<std::string> qkv = {f.q, f.k, f.v};
  const auto pack = std::find_if(p.seats.begin(), p.seats.end(),
                                 [&](const SeatPlan& s) { return s.replaces == qkv; });
  if (pack != p.seats.end() && pack->op == OpKind::linear) {
    parts.emplace_back("qkv", &*pack);
  } else {
    need("q", f.q, {OpKind::linear});
    need("k", f.k, {OpKind::linear});
    need("v", f.v, {OpKind::linear});
  }
  if (!missing.empty()) {
    p.keep_host.emplace_back(seam.site, where + ": not every part has a seat (" + missing +
                                            "); the layer runs its own forward, its sublayers "
                                            "their own seats");
    return;
  }
  // The block norms q and k head by head; a norm over the whole projection (OLMo 2, OLMoE) is
  // another form, which its own seat serves in the host's layer.
  const HostModule* attention = g.find(f.attention);
  const int64_t head_dim = attention != nullptr ? attention->attention.head_dim : 0;
  for (const auto& [role, s] : parts) {
    if (role != "q_norm" && role != "k_norm") continue;
    const auto width = s->seam.dims.find("width");
    if (width != s->seam.dims.end() && width->second != head_dim) {
      p.keep_host.emplace_back(
          seam.site, where + ": its " + role + " " + s->site + " norms " +
                         std::to_string(width->second) + " values at once, the whole projection; " +
                         "the block norms each head of " + std::to_string(head_dim) +
                         " (the layer runs its own forward, its sublayers their own seats)");
      return;
    }
  }
  SeatPlan b;
  b.seam = seam;
  b.site = seam.site;
  b.replaces = {seam.site};
  if (!routed.router_path.empty()) {
    b.seam.nodes["moe"] = f.ffn;  // the host's routed module, which a fallback runs
    b.seam.nodes["router"] = routed.router_path;
    b.seam.router = routed.router;
    b.seam.top_k = routed.router.top_k;
  }
  if (!routed.shared_gate.empty())
    b.seam.nodes["shared_gate"] = routed.shared_gate;  // copied by the block, as the router is
  b.impl = "block_f32";
  b.op = OpKind::block;
  b.form.name = "host";
  b.form.host = true;
  b.form.tag = "f32";
  b.act_dtype = DType::f32;
  b.band_min = 1;
  b.band_max = kUnboundedRows;
  for (const auto& [role, s] : parts) {
    // A pack is reached through its first projection (where the door's lead seat stands).
    b.seam.nodes[role] = s->replaces.size() > 1 ? s->replaces.front() : s->site;
    b.band_min = std::max(b.band_min, s->band_min);
    // Attention's band counts query tokens per sequence, not rows: every decode row has one.
    if (s->op != OpKind::attention) b.band_max = std::min(b.band_max, s->band_max);
    if (s->op == OpKind::attention) b.seam.attention = s->seam.attention;
  }
  if (const DimSpec* band = band_of(catalog.get(seam.structure)); band != nullptr) {
    b.band_min = std::max(b.band_min, band->min);
    b.band_max = std::min(b.band_max, band->max);
  }
  if (b.band_min > b.band_max) {
    p.keep_host.emplace_back(seam.site, where + ": its parts' row bands do not overlap");
    return;
  }
  if (!routed.shared_gate.empty())
    p.assumed.push_back(b.seam.nodes.at("shared") + ": added as sigmoid(" + routed.shared_gate +
                        " x) * shared(x) to the routed experts' sum, as the layer's feed-forward "
                        "does (the block's self-check holds it)");
  p.seats.push_back(std::move(b));
}

// What an adopted checkpoint says of one seam: its linear nodes' own forms, or its bank's.
struct SourceVerdict {
  std::optional<WeightForm> form;  // the first node's form (all of them when !mixed)
  bool mixed = false;
  std::string refusal;      // a node in a block type no kernel reads
  std::string unquantised;  // the nodes the checkpoint holds unquantised, when no form
};

// A bank's operands by their keys in source_forms / source_refusals: "<module>/<slot>" for one
// operand ("layers.0.mlp.experts/gate"), else the module's own key for all three.
template <typename T>
const T* bank_source(const std::map<std::string, T>& m, const std::string& module,
                     const std::string& slot) {
  if (const auto it = m.find(module + "/" + slot); it != m.end()) return &it->second;
  if (const auto it = m.find(module); it != m.end()) return &it->second;
  return nullptr;
}

// An experts node: the bank's gate, up and down as the checkpoint holds them. One bank op runs
// one form, so a bank whose operands differ in form is refused (there is no per-expert rung).
void bank_verdict(const MatchNode& n, const std::string& module, const PlanOptions& options,
                  SourceVerdict& v) {
  std::vector<std::pair<std::string, const WeightForm*>> forms;
  for (const std::string& slot : n.bank_slots) {
    const std::string key = module + "/" + slot;
    if (const std::string* r = bank_source(options.source_refusals, module, slot)) {
      v.refusal += (v.refusal.empty() ? "" : "; ") + key + ": " + *r;
      continue;
    }
    const WeightForm* f = bank_source(options.source_forms, module, slot);
    if (f == nullptr)
      v.unquantised += (v.unquantised.empty() ? "" : ", ") + key;
    else
      forms.emplace_back(slot, f);
  }
  if (forms.empty()) return;
  const bool same = std::all_of(forms.begin(), forms.end(), [&](const auto& f) {
    return f.second->name == forms.front().second->name;
  });
  if (!same && v.refusal.empty()) {
    std::string held;
    for (const auto& [slot, f] : forms) held += (held.empty() ? "" : ", ") + slot + " " + f->name;
    const std::string source = options.source.empty() ? "" : options.source + " ";
    v.refusal = module + ": the " + source + "checkpoint holds the bank's " + held +
                "; one bank op runs one form";
  }
  if (!v.form) v.form = *forms.front().second;
  v.mixed |= !same;
}

SourceVerdict source_verdict(const StructureSpec& spec, const Seam& seam,
                             const PlanOptions& options) {
  SourceVerdict v;
  for (const MatchNode& n : spec.match.nodes) {
    if (n.kind == NodeKind::experts && seam.nodes.count(n.name)) {
      bank_verdict(n, seam.nodes.at(n.name), options, v);
      continue;
    }
    if (n.kind != NodeKind::linear || !seam.nodes.count(n.name)) continue;
    const std::string& module = seam.nodes.at(n.name);
    if (const auto r = options.source_refusals.find(module); r != options.source_refusals.end()) {
      v.refusal += (v.refusal.empty() ? "" : "; ") + module + ": " + r->second;
      continue;
    }
    const auto f = options.source_forms.find(module);
    if (f == options.source_forms.end()) {
      v.unquantised += (v.unquantised.empty() ? "" : ", ") + module;
      continue;
    }
    if (!v.form)
      v.form = f->second;
    else if (f->second.name != v.form->name)
      v.mixed = true;
  }
  // A region seats only when every projection has a form; one held unquantised keeps it whole.
  if (!v.unquantised.empty()) v.form.reset();
  return v;
}

// Router module -> the bank of experts it routes for.
std::map<std::string, std::string> routers(const HostGraph& g) {
  std::map<std::string, std::string> out;
  for (const HostModule& m : g.modules)
    if (m.kind == ModuleKind::experts && !m.experts.router.empty()) out[m.experts.router] = m.path;
  return out;
}

std::string router_reason(const std::string& bank) {
  return "router of " + bank +
         ": stays at host precision (its top-k picks the experts; a quantised router changes the "
         "choice)";
}

bool within(const std::string& path, const std::string& site) {
  return path == site || (!site.empty() && path.size() > site.size() &&
                          path.compare(0, site.size(), site) == 0 && path[site.size()] == '.');
}

std::string dims_text(const std::vector<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) out += (out.empty() ? "" : "x") + std::to_string(d);
  return "[" + out + "]";
}

// Note [Every weight accounted]: discovery sees the modules a structure's pattern describes, so
// a weight no pattern reaches (a bank of experts before the catalog described one, a router, a
// framework's own layer) would be neither seated, kept nor refused: silent. A plan over every
// structure therefore names each parameter of at least `account_weights` elements, outside the
// token embedding's lookup, that no decision already covers (a decision at a module covers the
// module's subtree): a bank's router is kept at host precision with the reason, anything else
// refused as described by no structure, with the holding module's type and the shape.
// `weight_sites`: where a structure of weights (a region) had a seam, which may be a module that
// is also an attention or recurrence node (a DiT's q/k/v pack stands at its attention module).
void account_weights(const HostGraph& g, const std::set<std::string>& weight_sites,
                     int64_t min_elements, Plan& p) {
  // A decision about a module's recurrence or attention function is not one about its
  // projections: it covers no weight below it, unless a structure of weights decided there too.
  const auto decides_weights = [&](const std::string& site) {
    const HostModule* m = g.find(site);
    return m == nullptr || weight_sites.count(site) > 0 ||
           (m->kind != ModuleKind::recurrence && m->kind != ModuleKind::attention &&
            m->kind != ModuleKind::block);
  };
  std::vector<std::string> covered;
  for (const SeatPlan& s : p.seats) {
    if (function_op(s.op) || s.op == OpKind::block) continue;  // its seat holds no weight
    covered.push_back(s.site);
    covered.insert(covered.end(), s.replaces.begin(), s.replaces.end());
    for (const auto& [_, slot] : s.slots) covered.push_back(slot.module);
  }
  for (const auto& [site, _] : p.keep_host)
    if (decides_weights(site)) covered.push_back(site);
  for (const auto& [site, _] : p.refused)
    if (decides_weights(site)) covered.push_back(site);
  const std::map<std::string, std::string> bank_of_router = routers(g);
  for (const HostParam& w : g.params) {
    if (w.elements < min_elements) continue;
    if (!g.input_embedding.empty() && within(w.module, g.input_embedding)) continue;
    if (std::any_of(covered.begin(), covered.end(),
                    [&](const std::string& site) { return within(w.module, site); }))
      continue;
    const std::string what = w.name + " " + dims_text(w.shape);
    if (const auto bank = bank_of_router.find(w.module); bank != bank_of_router.end()) {
      p.keep_host.emplace_back(w.module, what + ": " + router_reason(bank->second));
      continue;
    }
    const HostModule* m = g.find(w.module);
    p.refused.emplace_back(w.module, what + " in " + (m != nullptr ? m->type_name : "?") +
                                         ": no catalog structure describes it; it stays with "
                                         "the host");
  }
}

}  // namespace

std::vector<std::string> scheme_names(const Catalog& catalog) {
  std::vector<std::string> out = {kAuto};
  for (const auto& kv : catalog.schemes().schemes) out.push_back(kv.first);
  return out;
}

Plan plan(const HostGraph& graph, const Catalog& catalog, const PlanOptions& options,
          KernelHub& hub) {
  Plan p;
  const bool adopting = !options.source_forms.empty() || !options.source_refusals.empty();
  if (adopting)
    p.scheme.name = "adopt " + options.source;
  else
    p.scheme = resolve_scheme(options.scheme, catalog, hub);
  const int64_t min_weights = options.min_seat_weights.value_or(catalog.schemes().min_seat_weights);
  // A structure that yields where it has no form (a pack of projections) is not looked for
  // then, so its modules stay with the structures below it.
  std::vector<std::string> wanted = options.structures;
  if (wanted.empty()) wanted = catalog.names();
  for (const std::string& name : wanted) catalog.get(name);  // throws, naming the known ones
  std::vector<std::string> looked_for;
  for (const std::string& name : wanted) {
    if (!catalog.get(name).match.yields_unformed || p.scheme.formats.count(name))
      looked_for.push_back(name);
    else if (!options.structures.empty())  // asked for by name: say why it found nothing
      p.assumed.push_back(name + ": scheme '" + p.scheme.name +
                          "' gives it no form; its modules go to the structures below it");
  }
  Discovery d = looked_for.empty() ? Discovery{} : discover(graph, catalog, looked_for);
  p.refused = d.refused;
  p.assumed.insert(p.assumed.end(), d.assumed.begin(), d.assumed.end());  // after any said above
  const MachineDecisions decisions = options.decisions_path.empty()
                                         ? MachineDecisions{}
                                         : read_decisions(options.decisions_path, hub.cpu());
  if (!decisions.ignored.empty())
    p.assumed.push_back("decisions file " + decisions.path + " ignored: " + decisions.ignored +
                        "; the catalog's bands apply");
  std::set<std::string> decided_noted;
  p.seams_found = static_cast<int64_t>(d.seams.size());
  std::set<std::string> unavailable_noted;
  const std::map<std::string, std::string> bank_of_router = routers(graph);
  std::vector<const Seam*> blocks;
  for (Seam& seam : d.seams) {
    const StructureSpec& spec = catalog.get(seam.structure);
    const std::string where = seam.structure + " " + seam.shape;
    // A projection that routes a bank (Llama 4's router is an nn.Linear) stays at host precision.
    if (const auto r = bank_of_router.find(seam.site); r != bank_of_router.end()) {
      p.keep_host.emplace_back(seam.site, where + ": " + router_reason(r->second));
      continue;
    }
    // A pack of sibling modules stands at each of them, so each is kept under its own name.
    const auto keep = [&](const std::string& why) {
      if (!spec.match.siblings) {
        p.keep_host.emplace_back(seam.site, why);
        return;
      }
      for (const MatchNode& n : spec.match.nodes)
        if (seam.nodes.count(n.name)) p.keep_host.emplace_back(seam.nodes.at(n.name), why);
    };
    if (spec.kind == "block") {  // after every other seam (Note [Decoder block assembly])
      blocks.push_back(&seam);
      continue;
    }
    if (spec.kind == "function") {
      // No form of its own: seated under any scheme that seats something (a scheme giving no
      // structure a form, the host-only baseline, seats nothing).
      if (!adopting && p.scheme.formats.empty())
        keep("scheme '" + p.scheme.name + "' seats nothing; " + where + " stays with the host");
      else
        plan_function_seam(catalog, spec, seam, hub, unavailable_noted, p);
      continue;
    }
    std::optional<WeightForm> source_form;
    bool mixed_source = false;
    if (adopting) {
      const SourceVerdict v = source_verdict(spec, seam, options);
      if (!v.refusal.empty()) {
        p.refused.emplace_back(seam.site, where + ": " + v.refusal);
        continue;
      }
      if (!v.form) {
        keep(where + ": the " + options.source + " checkpoint holds " + v.unquantised +
             " unquantised; it stays with the host");
        continue;
      }
      source_form = v.form;
      mixed_source = v.mixed;
    }
    auto form_it = p.scheme.formats.find(seam.structure);
    if (!adopting && form_it == p.scheme.formats.end()) {
      keep("scheme '" + p.scheme.name + "' keeps " + where + " at host precision");
      continue;
    }
    if (seam.weight_count < min_weights) {
      keep(where + ": " + std::to_string(seam.weight_count) + " weights, below the " +
           std::to_string(min_weights) + " where a seat pays for its call");
      continue;
    }
    const MatchNode& lead =
        *std::find_if(spec.match.nodes.begin(), spec.match.nodes.end(), [](const MatchNode& n) {
          return n.kind == NodeKind::linear || n.kind == NodeKind::experts;
        });
    const std::vector<DType>& weight_dtypes = spec.slot(lead.weight_slot)->dtypes;
    if (!allows(weight_dtypes, seam.weight_dtype)) {
      p.refused.emplace_back(seam.site, where + ": weight dtype " + name_of(seam.weight_dtype) +
                                            "; impls take " + dtype_list(weight_dtypes));
      continue;
    }
    const std::vector<DType>& act_dtypes = spec.inputs.front().dtypes;
    if (seam.act_dtype && !allows(act_dtypes, *seam.act_dtype)) {
      p.refused.emplace_back(seam.site, where + ": activations " + name_of(*seam.act_dtype) +
                                            " in the observed forward; impls take " +
                                            dtype_list(act_dtypes));
      continue;
    }
    WeightForm form = adopting ? *source_form : form_it->second;
    if (form.rows_min > kDecisionsDecodeRows) {
      if (const std::optional<int64_t> rows = decisions.rows_min_for(form.name)) {
        if (decided_noted.insert(form.name).second)
          p.assumed.push_back(form.name + ": rows from " + std::to_string(*rows) +
                              ", measured on this machine (" + decisions.path +
                              "); the catalog's default is " + std::to_string(form.rows_min));
        form.rows_min = *rows;
      }
    }
    std::vector<std::string> steps;
    if (!adopting && is_group_format(form.format)) {
      const int64_t multiple = width_multiple(form.format, form.group);
      bool divides = true;
      for (const MatchNode& n : spec.match.nodes) {
        // A bank's down reads the intermediate width: both of its widths are inputs.
        if ((n.kind == NodeKind::linear || n.kind == NodeKind::experts) &&
            seam.dims.count(n.in_dim) && seam.dims.at(n.in_dim) % multiple != 0)
          divides = false;
        if (n.kind == NodeKind::experts && seam.dims.count(n.out_dim) &&
            seam.dims.at(n.out_dim) % multiple != 0)
          divides = false;
      }
      const std::string& fallback = catalog.schemes().schemes.at(p.scheme.name).indivisible;
      if (!divides && !fallback.empty()) {
        const WeightForm& instead = catalog.schemes().forms.at(fallback);
        steps.push_back(form.describe() + " needs widths divisible by " + std::to_string(multiple) +
                        " (" + seam.shape + "): " +
                        instead.describe().substr(0, instead.describe().find(' ')) + " instead");
        form = instead;
      }
    }
    // A calibrated form rounds each projection against its input's recorded moments; without
    // enough rows there is nothing to round against, and an uncalibrated seat in its place would
    // be a silent change of form.
    if (form.calibrated) {
      std::string missing;
      for (const auto& [slot, module] : seam.slots) {
        const TensorSpec* ts = spec.slot(slot);
        if (ts == nullptr || ts->shape.size() != 2) continue;  // biases, norms' vectors
        const HostModule* m = graph.find(module);
        const int64_t rows = m != nullptr ? m->calibration_rows : 0;
        if (rows < p.scheme.calibration_rows)
          missing += (missing.empty() ? "" : ", ") + module + " (" + std::to_string(rows) + ")";
      }
      if (!missing.empty()) {
        std::string stats;
        for (Statistic st : p.scheme.statistics)
          stats += (stats.empty() ? "" : ", ") + std::string(name_of(st));
        p.refused.emplace_back(
            seam.site, where + ": " + form.describe() + " needs " + stats + " of at least " +
                           std::to_string(p.scheme.calibration_rows) +
                           " input rows per projection; recorded rows: " + missing +
                           " (more tokens in the forward, or calibration=...)");
        continue;
      }
    }
    // The rows the seat serves: the form's own band where it declares one (a GEMM form for many
    // rows), else the structure's decode band.
    DimSpec form_band;
    const DimSpec* band = band_of(spec);
    if (form.rows_min > 0) {
      form_band.min = form.rows_min;
      form_band.max = form.rows_max == -1 ? kUnboundedRows : form.rows_max;
      band = &form_band;
    }
    if (band == nullptr) {
      p.refused.emplace_back(seam.site, where + ": the structure declares no row band");
      continue;
    }
    // Every observed call below the band: a seat would only ever hand its calls back.
    if (!seam.rows_seen.empty() && std::all_of(seam.rows_seen.begin(), seam.rows_seen.end(),
                                               [&](int64_t r) { return r < band->min; })) {
      keep(where + ": observed only calls of " +
           std::to_string(*std::max_element(seam.rows_seen.begin(), seam.rows_seen.end())) +
           " rows or fewer; " + form.describe() + " serves rows from " + std::to_string(band->min));
      continue;
    }
    if (!seam.rows_seen.empty() && std::all_of(seam.rows_seen.begin(), seam.rows_seen.end(),
                                               [&](int64_t r) { return r > band->max; }))
      p.assumed.push_back(seam.site + ": observed only " + std::to_string(seam.rows_seen.front()) +
                          "-row calls; seated for decode rows " + std::to_string(band->min) + ".." +
                          std::to_string(band->max) +
                          ", larger calls run the host (band dispatch)");
    const DType act = seam.act_dtype.value_or(seam.weight_dtype);
    bool seated = false;
    for (const Rung& rung : catalog.ladder(seam.structure)) {
      const std::string impl = rung.impl + "_" + form.tag;
      const frt_kernel_table* table = rung_table(hub, rung, impl, steps, unavailable_noted, p);
      if (table == nullptr) continue;
      if (mixed_source && rung.op != OpKind::linear) {
        steps.push_back(impl +
                        ": the checkpoint holds the region's projections in different forms");
        continue;
      }
      std::vector<Candidate> cs = candidates(graph, spec, seam, rung, form, act, *band, options);
      std::string why;
      for (size_t i = 0; i < cs.size() && why.empty(); ++i) {
        why = form_refusal(*table, cs[i].desc);
        if (why.empty() || !mixed_source || !rung.per_node) continue;
        // A region the checkpoint holds in different forms, seated per node: a projection this
        // rung's package does not take goes to the first later per-node rung that takes its
        // form (a layer's int8-activation Q4_K gate and up on flashrt/gemm, a Q8_0 down beside
        // them on flashrt/linear), with the rungs it passed on its own ladder.
        const std::vector<Rung>& ladder = catalog.ladder(seam.structure);
        auto later =
            std::find_if(ladder.begin(), ladder.end(), [&](const Rung& x) { return &x == &rung; });
        if (later == ladder.end()) continue;
        std::vector<std::string> passed{cs[i].seat.impl + ": " + why};
        for (++later; later < ladder.end() && !why.empty(); ++later) {
          if (!later->per_node || later->op != OpKind::linear) continue;
          std::vector<Candidate> alt =
              candidates(graph, spec, seam, *later, form, act, *band, options);
          if (alt.size() != cs.size() || alt[i].seat.site != cs[i].seat.site) continue;
          const frt_kernel_table* other =
              rung_table(hub, *later, alt[i].seat.impl, passed, unavailable_noted, p);
          if (other == nullptr) continue;
          if (std::string no = form_refusal(*other, alt[i].desc); !no.empty()) {
            passed.push_back(alt[i].seat.impl + ": " + no);
            continue;
          }
          alt[i].seat.ladder = std::move(passed);
          cs[i] = std::move(alt[i]);
          why.clear();
        }
      }
      if (!why.empty()) {
        steps.push_back(impl + ": " + why);
        continue;
      }
      for (Candidate& c : cs) {
        c.seat.ladder.insert(c.seat.ladder.begin(), steps.begin(), steps.end());
        p.seats.push_back(std::move(c.seat));
      }
      seated = true;
      break;
    }
    if (!seated) {
      std::string why = where + ": no impl qualifies";
      if (catalog.ladder(seam.structure).empty()) why += "; the catalog declares no ladder";
      for (const std::string& step : steps) why += "; " + step;
      p.refused.emplace_back(seam.site, why);
    }
  }
  for (const Seam* seam : blocks) {
    if (!adopting && p.scheme.formats.empty())
      p.keep_host.emplace_back(seam->site, "scheme '" + p.scheme.name + "' seats nothing; " +
                                               seam->structure + " " + seam->shape +
                                               " stays with the host");
    else
      plan_block_seam(catalog, *seam, graph, p);
  }
  if (options.structures.empty()) {
    std::set<std::string> weight_sites;
    for (const Seam& seam : d.seams)
      if (const std::string& kind = catalog.get(seam.structure).kind;
          kind != "function" && kind != "block")
        weight_sites.insert(seam.site);
    account_weights(graph, weight_sites,
                    options.account_weights.value_or(catalog.schemes().account_weights), p);
  }
  return p;
}

std::string explain(const Plan& p, bool verbose) {
  using detail::ExplainEntry;
  std::vector<ExplainEntry> seats, keep, refused, assumed;
  for (const SeatPlan& seat : p.seats) {
    std::ostringstream s;
    s << "  " << seat.site << "  " << seat.seam.structure << " " << seat.seam.shape << " -> "
      << seat.impl << " (" << seat.form.describe() << ", rows " << seat.band_min << ".."
      << (seat.band_max >= kUnboundedRows ? "" : std::to_string(seat.band_max)) << ", "
      << seat.package << ")\n";
    if (seat.replaces.size() > 1) {
      s << "      one GEMM for";
      for (size_t i = 0; i < seat.replaces.size(); ++i)
        s << (i == 0 ? " " : ", ") << seat.replaces[i];
      s << " (the first called computes all)\n";
    }
    for (const std::string& step : seat.ladder) s << "      ladder: " << step << "\n";
    seats.push_back({seat.site, s.str()});
  }
  for (const auto& [site, why] : p.keep_host)
    keep.push_back({site, "  " + site + "  " + why + "\n"});
  for (const auto& [site, why] : p.refused)
    refused.push_back({site, "  " + site + "  " + why + "\n"});
  // An assumption starts with the site it is about ("blocks.0.ff: observed only ...").
  for (const std::string& a : p.assumed)
    assumed.push_back({a.substr(0, a.find_first_of(": ")), "  " + a + "\n"});

  bool merged = false;
  const auto section = [&](const char* title, const std::vector<ExplainEntry>& entries) {
    if (entries.empty()) return std::string();
    if (verbose) {
      std::string out = std::string("\n") + title + ":\n";
      for (const ExplainEntry& e : entries) out += e.text;
      return out;
    }
    bool m = false;
    std::string out = std::string("\n") + title + ":\n" + detail::group_entries(entries, &m);
    merged = merged || m;
    return out;
  };
  std::ostringstream s;
  s << "flashrt plan: scheme " << p.scheme.name << ", " << p.seams_found << " seams found, "
    << p.seats.size() << " seated, " << p.keep_host.size() << " kept at host, " << p.refused.size()
    << " refused\n";
  s << section("seated", seats) << section("kept at host", keep) << section("refused", refused)
    << section("assumed", assumed);
  for (const UnavailableEntry& e : p.kernel_unavailable)
    s << "\nkernel unavailable: " << e.repo << " " << e.version << ": " << e.error << ": "
      << e.detail << "\n";
  if (merged) s << detail::kGroupedNote;
  return s.str();
}

}  // namespace frt
