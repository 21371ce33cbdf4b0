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

#include "flashrt/errors.h"
#include "hub/sha256.h"

namespace frt {
namespace {

namespace fs = std::filesystem;

// The dtypes a boundary or slot may declare. A new one is a core change (every impl's contract
// check must learn it), not a catalog edit.
constexpr std::array<std::string_view, 2> kDtypes = {"f32", "bf16"};
constexpr std::array<std::string_view, 3> kPointSides = {"input", "output", "internal"};
constexpr std::array<std::string_view, 2> kGateKinds = {"values", "distribution"};
// Only regions so far; a stage pipeline has a different shape and would need its own parser.
constexpr std::array<std::string_view, 1> kKinds = {"region"};

template <typename Range>
std::string join(const Range& items, std::string_view sep = ", ") {
  std::string out;
  for (const auto& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

template <size_t N>
bool one_of(const std::array<std::string_view, N>& allowed, std::string_view value) {
  return std::find(allowed.begin(), allowed.end(), value) != allowed.end();
}

std::string child(const std::string& field, std::string_view key) {
  return field.empty() ? std::string(key) : field + "." + std::string(key);
}

// Parses one spec file. Every error names the file and the dotted field path, so a catalog
// edit that breaks fails at load with the line to fix, never later inside a planner.
class SpecParser {
 public:
  SpecParser(std::string file, std::string stem) : file_(std::move(file)), stem_(std::move(stem)) {}

  StructureSpec parse(const YAML::Node& root) {
    if (!root.IsMap()) fail("(top level)", "expected a mapping of spec fields");
    check_keys(root, "",
               {"name", "version", "kind", "description", "dims", "boundary", "slots", "attributes",
                "points", "gates", "boundary_excludes", "reference", "tied_allowed"});
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
    check_unique_tensor_names(s);
    if (const YAML::Node a = root["attributes"]) parse_attributes(a, s);
    parse_points(require(root, "", "points"), s);
    parse_gates(require(root, "", "gates"), s);
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
  [[noreturn]] void fail(const std::string& field, const std::string& what) const {
    throw InvalidArgument(file_ + ": " + field + ": " + what);
  }

  YAML::Node require(const YAML::Node& map, const std::string& field, std::string_view key) const {
    const YAML::Node node = map[std::string(key)];
    if (!node) fail(child(field, key), "missing required field");
    return node;
  }

  // Unknown keys are errors, not ignored: a misspelt `requried: false` must not silently keep
  // the default. yaml-cpp keeps duplicate keys and answers lookups with the first, so a second
  // definition would be dropped unseen; refuse it instead.
  void check_keys(const YAML::Node& map, const std::string& field,
                  std::initializer_list<std::string_view> allowed) const {
    std::set<std::string> seen;
    for (const auto& kv : map) {
      const std::string key = kv.first.Scalar();
      if (!seen.insert(key).second)
        fail(field.empty() ? "(top level)" : field, "duplicate key '" + key + "'");
      if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
        fail(child(field, key), "unknown field (allowed: " + join(allowed) + ")");
      }
    }
  }

  void expect_map(const YAML::Node& node, const std::string& field, bool allow_empty) const {
    if (!node.IsMap()) fail(field, "expected a mapping");
    if (!allow_empty && node.size() == 0) fail(field, "must not be empty");
    std::set<std::string> seen;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) fail(field, "keys must be plain names");
      if (!seen.insert(kv.first.Scalar()).second) {
        fail(field, "duplicate name '" + kv.first.Scalar() + "'");
      }
    }
  }

  std::string text(const YAML::Node& node, const std::string& field) const {
    if (!node.IsScalar()) fail(field, "expected a string");
    if (node.Scalar().empty()) fail(field, "must not be empty");
    return node.Scalar();
  }

  int64_t integer(const YAML::Node& node, const std::string& field) const {
    int64_t value = 0;
    if (!node.IsScalar() || !YAML::convert<int64_t>::decode(node, value)) {
      fail(field, "expected an integer" + got(node));
    }
    return value;
  }

  double number(const YAML::Node& node, const std::string& field) const {
    double value = 0;
    if (!node.IsScalar() || !YAML::convert<double>::decode(node, value) || !std::isfinite(value)) {
      fail(field, "expected a finite number" + got(node));
    }
    return value;
  }

  bool boolean(const YAML::Node& node, const std::string& field) const {
    bool value = false;
    if (!node.IsScalar() || !YAML::convert<bool>::decode(node, value)) {
      fail(field, "expected true or false" + got(node));
    }
    return value;
  }

  static std::string got(const YAML::Node& node) {
    return node.IsScalar() ? ", got '" + node.Scalar() + "'" : "";
  }

  std::vector<std::string> string_list(const YAML::Node& node, const std::string& field,
                                       bool allow_empty) const {
    if (!node.IsSequence()) fail(field, "expected a list");
    if (!allow_empty && node.size() == 0) fail(field, "must not be empty");
    std::vector<std::string> out;
    for (size_t i = 0; i < node.size(); ++i) {
      const std::string item_field = field + "[" + std::to_string(i) + "]";
      std::string item = text(node[i], item_field);
      if (std::find(out.begin(), out.end(), item) != out.end()) {
        fail(item_field, "duplicate entry '" + item + "'");
      }
      out.push_back(std::move(item));
    }
    return out;
  }

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
               "'" + t.shape[i] + "' is not a declared dim (dims: " + join(declared) + ")");
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
        t.dtypes = string_list(require(v, tfield, "dtypes"), dfield, /*allow_empty=*/false);
        for (size_t i = 0; i < t.dtypes.size(); ++i) {
          if (!one_of(kDtypes, t.dtypes[i])) {
            fail(dfield + "[" + std::to_string(i) + "]",
                 "unknown dtype '" + t.dtypes[i] + "' (known: " + join(kDtypes) + ")");
          }
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
    g.kind = text(require(parity, "gates.parity", "output"), "gates.parity.output");
    if (!one_of(kGateKinds, g.kind)) {
      fail("gates.parity.output",
           "unknown output kind '" + g.kind + "' (known: " + join(kGateKinds) + ")");
    }
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

  std::string file_;
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
      out[t.name] = {{"shape", t.shape},
                     {"dtypes", t.dtypes},
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
       {{"kind", s.gate.kind},
        {"pass", s.gate.pass},
        {"warn", s.gate.warn},
        {"min_speedup", s.gate.min_speedup}}},
      {"boundary_excludes", s.boundary_excludes},
      {"reference", s.reference},
      {"tied_allowed", s.tied_allowed},
  };
  return j.dump();
}

StructureSpec load_file(const fs::path& path) {
  const std::string file = path.string();
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(file + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::ParserException& e) {
    throw InvalidArgument(file + ": YAML syntax error at line " + std::to_string(e.mark.line + 1) +
                          ", column " + std::to_string(e.mark.column + 1) + ": " + e.msg);
  }
  if (root.IsNull()) throw InvalidArgument(file + ": empty spec");
  StructureSpec spec;
  try {
    spec = SpecParser(file, path.stem().string()).parse(root);
  } catch (const YAML::Exception& e) {
    // The parser checks types before converting; this only guards a yaml-cpp surprise.
    throw InvalidArgument(file + ": " + e.what());
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
  std::vector<fs::path> files;
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".yaml") files.push_back(e.path());
  }
  if (files.empty()) throw InvalidArgument("catalog dir '" + dir + "' holds no .yaml specs");
  // Sorted, so the first error reported does not depend on directory order.
  std::sort(files.begin(), files.end());
  Catalog c;
  c.dir_ = dir;
  for (const fs::path& f : files) {
    StructureSpec spec = load_file(f);
    const std::string name = spec.name;
    if (!c.specs_.emplace(name, std::move(spec)).second) {
      throw InvalidArgument(f.string() + ": name: duplicate structure '" + name + "'");
    }
  }
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
    throw InvalidArgument("unknown structure '" + name + "' (known: " + join(names()) +
                          ") in catalog '" + dir_ + "'");
  }
  return it->second;
}

}  // namespace frt
