#include "flashrt/catalog.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "catalog/yaml_fields.h"
#include "flashrt/errors.h"
#include "flashrt/utf8.h"
#include "hub/sha256.h"

namespace frt {
namespace {

namespace fs = std::filesystem;
using detail::child;
using detail::YamlFields;

// The dtypes a boundary or slot may declare. A new one is a core change (every impl's contract
// check must learn it), not a catalog edit.
// i64: index tensors at a boundary (a router's choice of experts).
constexpr std::array<std::string_view, 3> kDtypes = {"f32", "bf16", "i64"};
constexpr std::array<std::string_view, 3> kPointSides = {"input", "output", "internal"};
// Only regions so far; a stage pipeline has a different shape and would need its own parser.
constexpr std::array<std::string_view, 3> kKinds = {"region", "function", "block"};

template <size_t N>
bool one_of(const std::array<std::string_view, N>& allowed, std::string_view value) {
  return std::find(allowed.begin(), allowed.end(), value) != allowed.end();
}

template <size_t N>
std::string join(const std::array<std::string_view, N>& items) {
  return detail::join(std::vector<std::string>(items.begin(), items.end()));
}

// Parses one spec file. Every error names the file and the dotted field path, so a catalog
// edit that breaks fails at load with the line to fix, never later inside a planner.
class SpecParser : YamlFields {
 public:
  SpecParser(std::string file, std::string stem)
      : YamlFields(std::move(file)), stem_(std::move(stem)) {}

  StructureSpec parse(const YAML::Node& root) {
    if (!root.IsMap()) fail("(top level)", "expected a mapping of spec fields");
    check_keys(root, "",
               {"name", "version", "kind", "description", "dims", "boundary", "slots", "attributes",
                "points", "gates", "match", "boundary_excludes", "reference", "tied_allowed"});
    StructureSpec s;
    s.name = text(require(root, "", "name"), "name");
    // The file name is how a host or a receipt finds the spec; letting them differ would make
    // two spellings of one structure.
    if (s.name != stem_) {
      fail("name", "'" + s.name + "' does not match the file name (expected '" + stem_ + "')");
    }
    const int64_t version = integer(require(root, "", "version"), "version");
    if (version < 1 || version > std::numeric_limits<int>::max()) {
      fail("version", "must be an integer >= 1, got " + std::to_string(version));
    }
    s.version = static_cast<int>(version);
    s.kind = text(require(root, "", "kind"), "kind");
    if (!one_of(kKinds, s.kind)) {
      fail("kind", "'" + s.kind + "' is not supported (known: " + join(kKinds) + ")");
    }
    s.description = text(require(root, "", "description"), "description");
    parse_dims(require(root, "", "dims"), s);
    parse_boundary(require(root, "", "boundary"), s);
    s.slots = tensors(require(root, "", "slots"), "slots", s, /*allow_empty=*/true,
                      /*dtype_sources=*/nullptr);
    for (const TensorSpec& t : s.slots)
      for (DType d : t.dtypes)
        if (d == DType::i64) fail("slots." + t.name + ".dtypes", "a weight slot holds f32 or bf16");
    check_unique_tensor_names(s);
    if (const YAML::Node a = root["attributes"]) parse_attributes(a, s);
    parse_points(require(root, "", "points"), s);
    parse_gates(require(root, "", "gates"), s);
    parse_match(require(root, "", "match"), s);
    if (const YAML::Node b = root["boundary_excludes"]) {
      s.boundary_excludes = string_list(b, "boundary_excludes", /*allow_empty=*/true);
    }
    s.reference = text(require(root, "", "reference"), "reference");
    if (s.reference.find('\n') != std::string::npos) {
      fail("reference", "must be a one-line formula");
    }
    if (const YAML::Node t = root["tied_allowed"]) s.tied_allowed = boolean(t, "tied_allowed");
    return s;
  }

 private:
  void parse_dims(const YAML::Node& node, StructureSpec& s) const {
    expect_map(node, "dims", /*allow_empty=*/false);
    for (const auto& kv : node) {
      const std::string field = child("dims", kv.first.Scalar());
      DimSpec d;
      d.name = kv.first.Scalar();
      const YAML::Node& v = kv.second;
      if (!v.IsMap() && !v.IsNull()) fail(field, "expected a mapping of constraints");
      if (v.IsMap()) {
        check_keys(v, field, {"min", "max", "multiple_of", "decode_band"});
        if (const YAML::Node n = v["min"]) d.min = integer(n, child(field, "min"));
        if (const YAML::Node n = v["max"]) d.max = integer(n, child(field, "max"));
        if (const YAML::Node n = v["multiple_of"]) {
          d.multiple_of = integer(n, child(field, "multiple_of"));
        }
        if (const YAML::Node n = v["decode_band"])
          d.decode_band = boolean(n, child(field, "decode_band"));
        if (v["max"] && d.max < 1)
          fail(child(field, "max"), "must be >= 1 (omit it for unbounded)");
      }
      if (d.min < 1) fail(child(field, "min"), "must be >= 1, got " + std::to_string(d.min));
      if (d.max != -1 && d.max < d.min) {
        fail(child(field, "max"),
             "is below min (" + std::to_string(d.max) + " < " + std::to_string(d.min) + ")");
      }
      if (d.multiple_of < 1) fail(child(field, "multiple_of"), "must be >= 1");
      // A band is a qualification range; without an upper end nothing would go to the host.
      if (d.decode_band && d.max == -1) fail(child(field, "max"), "a decode band needs a max");
      s.dims.push_back(std::move(d));
    }
  }

  void parse_boundary(const YAML::Node& node, StructureSpec& s) const {
    if (!node.IsMap()) fail("boundary", "expected a mapping with inputs and outputs");
    check_keys(node, "boundary", {"inputs", "outputs"});
    s.inputs = tensors(require(node, "boundary", "inputs"), "boundary.inputs", s,
                       /*allow_empty=*/false, nullptr);
    s.outputs = tensors(require(node, "boundary", "outputs"), "boundary.outputs", s,
                        /*allow_empty=*/false, &s.inputs);
  }

  // dtype_sources is set for boundary outputs only: they may take their dtype from an input.
  std::vector<TensorSpec> tensors(const YAML::Node& node, const std::string& field,
                                  const StructureSpec& s, bool allow_empty,
                                  const std::vector<TensorSpec>* dtype_sources) const {
    expect_map(node, field, allow_empty);
    std::vector<TensorSpec> out;
    for (const auto& kv : node) {
      const std::string tfield = child(field, kv.first.Scalar());
      const YAML::Node& v = kv.second;
      if (!v.IsMap()) fail(tfield, "expected a mapping with shape and dtypes");
      if (dtype_sources != nullptr) {
        check_keys(v, tfield, {"shape", "dtypes", "dtype_of", "required"});
      } else {
        check_keys(v, tfield, {"shape", "dtypes", "required"});
      }
      TensorSpec t;
      t.name = kv.first.Scalar();
      t.shape = string_list(require(v, tfield, "shape"), child(tfield, "shape"),
                            /*allow_empty=*/false);
      for (size_t i = 0; i < t.shape.size(); ++i) {
        if (s.dim(t.shape[i]) == nullptr) {
          std::vector<std::string> declared;
          for (const DimSpec& d : s.dims) declared.push_back(d.name);
          fail(child(tfield, "shape") + "[" + std::to_string(i) + "]",
               "'" + t.shape[i] + "' is not a declared dim (dims: " + detail::join(declared) + ")");
        }
      }
      if (v["dtypes"] && v["dtype_of"]) fail(tfield, "give dtypes or dtype_of, not both");
      if (const YAML::Node d = v["dtype_of"]) {
        t.dtype_of = text(d, child(tfield, "dtype_of"));
        const auto src = std::find_if(dtype_sources->begin(), dtype_sources->end(),
                                      [&](const TensorSpec& in) { return in.name == t.dtype_of; });
        if (src == dtype_sources->end()) {
          fail(child(tfield, "dtype_of"), "'" + t.dtype_of + "' is not a boundary input");
        }
        t.dtypes = src->dtypes;
      } else {
        const std::string dfield = child(tfield, "dtypes");
        const std::vector<std::string> names =
            string_list(require(v, tfield, "dtypes"), dfield, /*allow_empty=*/false);
        for (size_t i = 0; i < names.size(); ++i) {
          if (!one_of(kDtypes, names[i])) {
            fail(dfield + "[" + std::to_string(i) + "]",
                 "unknown dtype '" + names[i] + "' (known: " + join(kDtypes) + ")");
          }
          t.dtypes.push_back(*parse_dtype(names[i]));
        }
      }
      if (const YAML::Node r = v["required"]) t.required = boolean(r, child(tfield, "required"));
      out.push_back(std::move(t));
    }
    return out;
  }

  // Points and bindings name tensors by name alone, so one name must mean one tensor.
  void check_unique_tensor_names(const StructureSpec& s) const {
    std::map<std::string, std::string> where;
    const auto add = [&](const std::vector<TensorSpec>& ts, const std::string& field) {
      for (const TensorSpec& t : ts) {
        const auto [it, inserted] = where.emplace(t.name, field);
        if (!inserted) {
          fail(child(field, t.name),
               "duplicate name '" + t.name + "' (also in " + it->second + ")");
        }
      }
    };
    add(s.inputs, "boundary.inputs");
    add(s.outputs, "boundary.outputs");
    add(s.slots, "slots");
  }

  void parse_attributes(const YAML::Node& node, StructureSpec& s) const {
    expect_map(node, "attributes", /*allow_empty=*/true);
    for (const auto& kv : node) {
      const std::string& key = kv.first.Scalar();
      s.attributes[key] = string_list(kv.second, child("attributes", key), /*allow_empty=*/false);
    }
  }

  // A point names a place in the seam's dataflow; input and output points must be boundary
  // tensors of that side so calibration can find them without a binding.
  void parse_points(const YAML::Node& node, StructureSpec& s) const {
    expect_map(node, "points", /*allow_empty=*/true);
    const auto has = [](const std::vector<TensorSpec>& ts, const std::string& name) {
      return std::any_of(ts.begin(), ts.end(), [&](const TensorSpec& t) { return t.name == name; });
    };
    for (const auto& kv : node) {
      const std::string& name = kv.first.Scalar();
      const std::string field = child("points", name);
      std::string side = text(kv.second, field);
      if (!one_of(kPointSides, side)) {
        fail(field, "unknown side '" + side + "' (known: " + join(kPointSides) + ")");
      }
      if (side == "input" && !has(s.inputs, name))
        fail(field, "'" + name + "' is not a boundary input");
      if (side == "output" && !has(s.outputs, name)) {
        fail(field, "'" + name + "' is not a boundary output");
      }
      if (side == "internal" &&
          (has(s.inputs, name) || has(s.outputs, name) || has(s.slots, name))) {
        fail(field, "an internal point must not reuse the tensor name '" + name + "'");
      }
      s.points.emplace_back(name, std::move(side));
    }
  }

  void parse_gates(const YAML::Node& node, StructureSpec& s) const {
    if (!node.IsMap()) fail("gates", "expected a mapping with parity and latency");
    check_keys(node, "gates", {"parity", "latency"});
    const YAML::Node parity = require(node, "gates", "parity");
    if (!parity.IsMap()) fail("gates.parity", "expected a mapping with output, pass, warn");
    check_keys(parity, "gates.parity", {"output", "pass", "warn"});
    GateSpec& g = s.gate;
    g.kind = named(require(parity, "gates.parity", "output"), "gates.parity.output", "output kind",
                   parse_output_kind, known_output_kinds());
    g.pass = number(require(parity, "gates.parity", "pass"), "gates.parity.pass");
    g.warn = number(require(parity, "gates.parity", "warn"), "gates.parity.warn");
    for (const auto& [key, value] : {std::pair{"pass", g.pass}, std::pair{"warn", g.warn}}) {
      if (!(value > 0.0 && value <= 1.0)) {
        std::ostringstream os;
        os << "must be in (0, 1], got " << value;
        fail(child("gates.parity", key), os.str());
      }
    }
    if (g.pass < g.warn) {
      std::ostringstream os;
      os << "pass (" << g.pass << ") is below warn (" << g.warn << ")";
      fail("gates.parity.pass", os.str());
    }
    const YAML::Node latency = require(node, "gates", "latency");
    if (!latency.IsMap()) fail("gates.latency", "expected a mapping with min_speedup");
    check_keys(latency, "gates.latency", {"min_speedup"});
    g.min_speedup =
        number(require(latency, "gates.latency", "min_speedup"), "gates.latency.min_speedup");
    // Below 1 a unit would activate while slower than the host.
    if (g.min_speedup < 1.0) fail("gates.latency.min_speedup", "must be >= 1");
  }

  // See Note [Match patterns] in catalog.h.
  void parse_match(const YAML::Node& node, StructureSpec& s) const {
    if (!node.IsMap()) fail("match", "expected a mapping with nodes");
    check_keys(
        node, "match",
        {"priority", "always_claims", "site", "siblings", "yields_unformed", "nodes", "flow"});
    MatchSpec& m = s.match;
    if (const YAML::Node p = node["priority"]) {
      const int64_t v = integer(p, "match.priority");
      if (v < -1000 || v > 1000) fail("match.priority", "must be in -1000..1000");
      m.priority = static_cast<int>(v);
    }
    if (const YAML::Node a = node["always_claims"])
      m.always_claims = boolean(a, "match.always_claims");
    if (const YAML::Node site = node["site"]) {
      const std::string v = text(site, "match.site");
      if (v != "node" && v != "parent") fail("match.site", "'" + v + "' is not node or parent");
      m.site = v == "node" ? SiteKind::node : SiteKind::parent;
    }
    if (const YAML::Node sib = node["siblings"]) m.siblings = boolean(sib, "match.siblings");
    if (const YAML::Node y = node["yields_unformed"])
      m.yields_unformed = boolean(y, "match.yields_unformed");
    const YAML::Node nodes = require(node, "match", "nodes");
    expect_map(nodes, "match.nodes", /*allow_empty=*/false);
    // The attribute a node's measured value must take: declared, and each allowed value one the
    // core names (an activation, or a norm form).
    // (a recurrence form for a recurrence node; "none" also for a conv node, called without one).
    enum class Values { activation, norm, recurrence, conv, attention, rotary, block };
    const auto node_attribute = [&](const YAML::Node& node, const std::string& field, Values kind) {
      const std::string a = text(require(node, field, "attribute"), child(field, "attribute"));
      if (!s.attributes.count(a))
        fail(child(field, "attribute"), "'" + a + "' is not a declared attribute");
      const std::vector<std::string>& values = s.attributes.at(a);
      for (size_t i = 0; i < values.size(); ++i) {
        const std::string& v = values[i];
        const bool known =
            kind == Values::norm         ? parse_norm_form(v).has_value()
            : kind == Values::recurrence ? parse_recurrence_form(v).has_value()
            : kind == Values::attention  ? parse_attention_form(v).has_value()
            : kind == Values::block      ? parse_block_form(v).has_value()
            : kind == Values::rotary
                ? parse_rotary_form(v).has_value()
                : parse_activation(v).has_value() || (kind == Values::conv && v == kNoActivation);
        if (known) continue;
        const std::string what = kind == Values::norm         ? "norm form"
                                 : kind == Values::recurrence ? "recurrence form"
                                 : kind == Values::attention  ? "attention form"
                                 : kind == Values::block      ? "block form"
                                 : kind == Values::rotary     ? "rotary form"
                                                              : "activation";
        const std::string list = kind == Values::norm         ? known_norm_forms()
                                 : kind == Values::recurrence ? known_recurrence_forms()
                                 : kind == Values::attention  ? known_attention_forms()
                                 : kind == Values::block      ? known_block_forms()
                                 : kind == Values::rotary     ? known_rotary_forms()
                                                              : known_activations();
        fail("attributes." + a + "[" + std::to_string(i) + "]",
             "unknown " + what + " '" + v + "' (known: " + list + ")");
      }
      return a;
    };
    const auto has_no_weight = [&](const YAML::Node& node, const std::string& field,
                                   const std::string& what) {
      for (const char* k : {"weight", "bias", "output_head"})
        if (node[k]) fail(child(field, k), what + " has none");
    };
    for (const auto& kv : nodes) {
      const std::string field = child("match.nodes", kv.first.Scalar());
      if (!kv.second.IsMap()) fail(field, "expected a mapping with kind");
      check_keys(kv.second, field,
                 {"kind", "weight", "bias", "output_head", "attribute", "optional", "gate", "up",
                  "down", "cache"});
      MatchNode n;
      n.name = kv.first.Scalar();
      if (const YAML::Node o = kv.second["optional"]) {
        n.optional = boolean(o, child(field, "optional"));
        if (n.optional && m.nodes.empty()) fail(child(field, "optional"), "the first node is not");
      }
      const std::string kind = text(require(kv.second, field, "kind"), child(field, "kind"));
      if (kv.second["cache"] && kind != "attention")
        fail(child(field, "cache"), "only an attention node has one");
      if (kind == "linear") {
        n.kind = NodeKind::linear;
        n.weight_slot = text(require(kv.second, field, "weight"), child(field, "weight"));
        const TensorSpec* w = s.slot(n.weight_slot);
        if (w == nullptr) fail(child(field, "weight"), "'" + n.weight_slot + "' is not a slot");
        if (w->shape.size() != 2)
          fail(child(field, "weight"), "slot '" + n.weight_slot + "' is not [out, in]");
        n.out_dim = w->shape[0];
        n.in_dim = w->shape[1];
        if (const YAML::Node b = kv.second["bias"]) {
          n.bias_slot = text(b, child(field, "bias"));
          const TensorSpec* bs = s.slot(n.bias_slot);
          if (bs == nullptr) fail(child(field, "bias"), "'" + n.bias_slot + "' is not a slot");
          if (bs->shape.size() != 1 || bs->shape[0] != n.out_dim)
            fail(child(field, "bias"), "slot '" + n.bias_slot + "' is not [" + n.out_dim + "]");
        }
        if (const YAML::Node h = kv.second["output_head"])
          n.output_head = boolean(h, child(field, "output_head"));
        if (kv.second["attribute"]) fail(child(field, "attribute"), "a linear node has none");
      } else if (kind == "activation") {
        n.kind = NodeKind::activation;
        n.attribute = node_attribute(kv.second, field, Values::activation);
        has_no_weight(kv.second, field, "an activation node");
      } else if (kind == "norm") {
        // A norm without affine parameters; its measured form ("layer", "rms") must be one of
        // the attribute's values.
        n.kind = NodeKind::norm;
        n.attribute = node_attribute(kv.second, field, Values::norm);
        has_no_weight(kv.second, field, "a norm node");
        // Alone in a function structure it is the seat's whole unit and binds its width.
        if (s.kind == "function")
          for (const std::string& dim : node_dims(n.kind))
            if (s.dim(dim) == nullptr)
              fail(field, "a norm node binds dim '" + dim + "', which dims does not declare");
      } else if (kind == "experts") {
        // A bank of routed experts: gate and up [experts, intermediate, hidden], down [experts,
        // hidden, intermediate], and the activation of its gated form.
        n.kind = NodeKind::experts;
        for (const char* k : {"gate", "up", "down"}) {
          const std::string slot = text(require(kv.second, field, k), child(field, k));
          const TensorSpec* t = s.slot(slot);
          if (t == nullptr) fail(child(field, k), "'" + slot + "' is not a slot");
          if (t->shape.size() != 3)
            fail(child(field, k), "slot '" + slot + "' is not [experts, out, in]");
          n.bank_slots.push_back(slot);
        }
        const std::vector<std::string>& gate = s.slot(n.bank_slots[0])->shape;
        const std::vector<std::string>& up = s.slot(n.bank_slots[1])->shape;
        const std::vector<std::string>& down = s.slot(n.bank_slots[2])->shape;
        if (up != gate || down[0] != gate[0] || down[1] != gate[2] || down[2] != gate[1])
          fail(child(field, "down"),
               "banks do not chain: gate and up [experts, inner, hidden], down [experts, hidden, "
               "inner]");
        n.experts_dim = gate[0];
        n.out_dim = gate[1];
        n.in_dim = gate[2];
        n.weight_slot = n.bank_slots[0];
        n.attribute = node_attribute(kv.second, field, Values::activation);
        has_no_weight(kv.second, field, "an experts node");
      } else if (kind == "recurrence" || kind == "conv" || kind == "attention" ||
                 kind == "rotary") {
        // A module whose function the seat replaces; the dims it binds are its kind's own.
        n.kind = kind == "recurrence"  ? NodeKind::recurrence
                 : kind == "conv"      ? NodeKind::conv
                 : kind == "attention" ? NodeKind::attention
                                       : NodeKind::rotary;
        n.attribute = node_attribute(kv.second, field,
                                     kind == "recurrence"  ? Values::recurrence
                                     : kind == "conv"      ? Values::conv
                                     : kind == "attention" ? Values::attention
                                                           : Values::rotary);
        has_no_weight(kv.second, field, "a " + kind + " node");
        for (const std::string& dim : node_dims(n.kind))
          if (s.dim(dim) == nullptr)
            fail(field, "a " + kind + " node binds dim '" + dim + "', which dims does not declare");
        if (s.kind != "function")
          fail(field, "a " + kind + " node belongs to a function structure");
        // An attention node reads the keys and values the host's cache hands each call (cache:
        // dense, the default), a serving engine's pool of slots through its slot table (cache:
        // paged), or the whole sequence each call hands (cache: none).
        if (const YAML::Node c = kv.second["cache"]) {
          const std::string cache = text(c, child(field, "cache"));
          const std::optional<AttentionCache> parsed = parse_attention_cache(cache);
          if (!parsed)
            fail(child(field, "cache"),
                 "'" + cache + "' is not one of " + known_attention_caches());
          n.cache = parsed.value_or(AttentionCache::dense);
        }
      } else if (kind == "block") {
        // A decoder layer whose sublayers' seats the block seat runs in turn (kind block).
        n.kind = NodeKind::block;
        n.attribute = node_attribute(kv.second, field, Values::block);
        has_no_weight(kv.second, field, "a block node");
        for (const std::string& dim : node_dims(n.kind))
          if (s.dim(dim) == nullptr)
            fail(field, "a block node binds dim '" + dim + "', which dims does not declare");
        if (s.kind != "block") fail(field, "a block node belongs to a block structure");
      } else {
        fail(child(field, "kind"),
             "'" + kind +
                 "' is not linear, activation, norm, experts, recurrence, conv, attention, "
                 "rotary or block");
      }
      if (n.kind != NodeKind::experts)
        for (const char* k : {"gate", "up", "down"})
          if (kv.second[k]) fail(child(field, k), "only an experts node names banks");
      m.nodes.push_back(std::move(n));
    }
    if (m.site == SiteKind::node && m.nodes.size() != 1)
      fail("match.site", "site 'node' needs exactly one node");
    // A region is seated through its weights: a pattern without a weight node (a projection or a
    // bank) has nothing to pack, and its weight dtype and rows come from the first one. A
    // function structure is one recurrence, conv or norm node at its site.
    if (s.kind == "block") {
      if (m.nodes.size() != 1 || m.nodes[0].kind != NodeKind::block)
        fail("match.nodes", "a block structure is one block node");
    } else if (s.kind == "function") {
      if (m.nodes.size() != 1 ||
          (m.nodes[0].kind != NodeKind::recurrence && m.nodes[0].kind != NodeKind::conv &&
           m.nodes[0].kind != NodeKind::norm && m.nodes[0].kind != NodeKind::attention &&
           m.nodes[0].kind != NodeKind::rotary))
        fail("match.nodes",
             "a function structure is one recurrence, conv, norm, attention or rotary node");
    } else if (std::none_of(m.nodes.begin(), m.nodes.end(), [](const MatchNode& n) {
                 return n.kind == NodeKind::linear || n.kind == NodeKind::experts;
               })) {
      fail("match.nodes", "needs at least one linear or experts node");
    }
    if (const YAML::Node flow = node["flow"]) {
      if (!flow.IsSequence()) fail("match.flow", "expected a list of relations");
      for (size_t i = 0; i < flow.size(); ++i) {
        const std::string field = "match.flow[" + std::to_string(i) + "]";
        if (!flow[i].IsMap() || flow[i].size() != 1)
          fail(field, "expected one relation: {same_input|feeds|not_feeds|modulates: [a, b]}");
        const auto kv = *flow[i].begin();
        FlowEdge e;
        const std::string rel = kv.first.Scalar();
        if (rel == "same_input")
          e.kind = FlowKind::same_input;
        else if (rel == "feeds")
          e.kind = FlowKind::feeds;
        else if (rel == "not_feeds")
          e.kind = FlowKind::not_feeds;
        else if (rel == "modulates")
          e.kind = FlowKind::modulates;
        else
          fail(field,
               "unknown relation '" + rel + "' (known: same_input, feeds, not_feeds, modulates)");
        const std::vector<std::string> ends =
            string_list(kv.second, child(field, rel), /*allow_empty=*/false);
        if (ends.size() != 2) fail(child(field, rel), "names two nodes");
        for (const std::string& end : ends)
          if (m.node(end) == nullptr) fail(child(field, rel), "'" + end + "' is not a node");
        e.a = ends[0];
        e.b = ends[1];
        if (e.kind == FlowKind::modulates && m.node(e.a)->kind != NodeKind::norm)
          fail(child(field, rel), "'" + e.a + "' is not a norm node");
        m.flow.push_back(e);
      }
    }
  }

  std::string stem_;
};

// Note [Spec digest]: the digest is taken over the parsed spec, not the file bytes, so comments,
// whitespace, quoting and mapping order do not move it while any value does. nlohmann::json's
// object is a std::map, which gives sorted keys; doubles are written round-trip exact.
std::string canonical(const StructureSpec& s) {
  using nlohmann::json;
  const auto tensors = [](const std::vector<TensorSpec>& ts) {
    json out = json::object();
    for (const TensorSpec& t : ts) {
      std::vector<std::string> dtypes;
      for (DType d : t.dtypes) dtypes.push_back(name_of(d));
      out[t.name] = {{"shape", t.shape},
                     {"dtypes", dtypes},
                     {"required", t.required},
                     {"dtype_of", t.dtype_of}};
    }
    return out;
  };
  json dims = json::object();
  for (const DimSpec& d : s.dims) {
    dims[d.name] = {{"min", d.min},
                    {"max", d.max},
                    {"multiple_of", d.multiple_of},
                    {"decode_band", d.decode_band}};
  }
  json points = json::object();
  for (const auto& [name, side] : s.points) points[name] = side;
  json nodes = json::object();
  for (const MatchNode& n : s.match.nodes) {
    nodes[n.name] = {{"kind", static_cast<int>(n.kind)},
                     {"weight", n.weight_slot},
                     {"bias", n.bias_slot},
                     {"output_head", n.output_head},
                     {"attribute", n.attribute}};
    if (n.optional) nodes[n.name]["optional"] = true;  // absent when unset: digests stay put
    if (!n.bank_slots.empty()) nodes[n.name]["banks"] = n.bank_slots;
    if (n.cache != AttentionCache::dense) nodes[n.name]["cache"] = name_of(n.cache);
  }
  json flow = json::array();
  for (const FlowEdge& e : s.match.flow) flow.push_back({static_cast<int>(e.kind), e.a, e.b});
  const json j = {
      {"name", s.name},
      {"version", s.version},
      {"kind", s.kind},
      {"description", s.description},
      {"dims", dims},
      {"inputs", tensors(s.inputs)},
      {"outputs", tensors(s.outputs)},
      {"slots", tensors(s.slots)},
      {"attributes", s.attributes},
      {"points", points},
      {"gate",
       {{"kind", name_of(s.gate.kind)},
        {"pass", s.gate.pass},
        {"warn", s.gate.warn},
        {"min_speedup", s.gate.min_speedup}}},
      {"match",
       {{"priority", s.match.priority},
        {"always_claims", s.match.always_claims},
        {"site", static_cast<int>(s.match.site)},
        {"nodes", nodes},
        {"flow", flow}}},
      {"boundary_excludes", s.boundary_excludes},
      {"reference", s.reference},
      {"tied_allowed", s.tied_allowed},
  };
  json out = j;
  if (s.match.siblings) out["match"]["siblings"] = true;
  if (s.match.yields_unformed) out["match"]["yields_unformed"] = true;
  return out.dump();
}

StructureSpec load_file(const fs::path& path) {
  const YAML::Node root = detail::load_yaml_file(path.string());
  const std::string file = escape_invalid_utf8(path.string());
  StructureSpec spec;
  try {
    spec = SpecParser(file, path.stem().string()).parse(root);
  } catch (const YAML::Exception& e) {
    // The parser checks types before converting; this only guards a yaml-cpp surprise.
    throw InvalidArgument(file + ": " + escape_invalid_utf8(e.what()));
  }
  spec.digest = detail::sha256_hex(canonical(spec)).substr(0, 16);
  return spec;
}

}  // namespace

const DimSpec* StructureSpec::dim(std::string_view dim_name) const {
  for (const DimSpec& d : dims) {
    if (d.name == dim_name) return &d;
  }
  return nullptr;
}

const std::vector<std::string>& node_dims(NodeKind kind) {
  static const std::vector<std::string> kRecurrence = {"k_heads", "v_heads", "k_dim", "v_dim"},
                                        kConv = {"channels", "taps"}, kNorm = {"width"},
                                        kAttention = {"heads", "kv_heads", "head_dim"},
                                        kBlock = {"hidden"}, kNone = {};
  return kind == NodeKind::recurrence                              ? kRecurrence
         : kind == NodeKind::conv                                  ? kConv
         : kind == NodeKind::norm                                  ? kNorm
         : kind == NodeKind::attention || kind == NodeKind::rotary ? kAttention
         : kind == NodeKind::block                                 ? kBlock
                                                                   : kNone;
}

const MatchNode* MatchSpec::node(std::string_view node_name) const {
  for (const MatchNode& n : nodes)
    if (n.name == node_name) return &n;
  return nullptr;
}

const TensorSpec* StructureSpec::slot(std::string_view slot_name) const {
  for (const TensorSpec& t : slots) {
    if (t.name == slot_name) return &t;
  }
  return nullptr;
}

Catalog Catalog::load(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    throw InvalidArgument("catalog dir '" + dir + "' does not exist or is not a directory");
  }
  const fs::path structures = fs::path(dir) / "structures";
  std::vector<fs::path> files;
  if (fs::is_directory(structures, ec))
    for (const fs::directory_entry& e : fs::directory_iterator(structures)) {
      if (e.is_regular_file() && e.path().extension() == ".yaml") files.push_back(e.path());
    }
  if (files.empty())
    throw InvalidArgument("catalog dir '" + dir + "' holds no .yaml specs under structures/");
  // Sorted, so the first error reported does not depend on directory order.
  std::sort(files.begin(), files.end());
  Catalog c;
  c.dir_ = dir;
  for (const fs::path& f : files) {
    StructureSpec spec = load_file(f);
    const std::string name = spec.name;
    if (!c.specs_.emplace(name, std::move(spec)).second) {
      throw InvalidArgument(escape_invalid_utf8(f.string()) + ": name: duplicate structure '" +
                            name + "'");
    }
  }
  detail::load_policy(c, dir);
  return c;
}

std::vector<std::string> Catalog::names() const {
  std::vector<std::string> out;
  for (const auto& kv : specs_) out.push_back(kv.first);
  return out;
}

const StructureSpec& Catalog::get(const std::string& name) const {
  const auto it = specs_.find(name);
  if (it == specs_.end()) {
    throw InvalidArgument("unknown structure '" + name + "' (known: " + detail::join(names()) +
                          ") in catalog '" + dir_ + "'");
  }
  return it->second;
}

}  // namespace frt
