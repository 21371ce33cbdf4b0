// The catalog: structure specifications loaded from catalog/<name>.yaml. A structure is the
// definition layer of DESIGN §3: what one kind of seam looks like (boundary tensors in symbolic
// dims, weight slots, calibration points, gates, the reference formula), independent of any host
// family or impl. The loader validates every file and fails loudly, naming the file and field:
// a declaration nobody checks is a comment (DESIGN §10).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace frt {

// One symbolic dim. When decode_band is set, [min, max] is the band of rows an impl may be
// qualified for: outside it the host serves the call (a band dispatch), it is not refused.
struct DimSpec {
  std::string name;
  int64_t min = 1;
  int64_t max = -1;  // -1: unbounded
  int64_t multiple_of = 1;
  bool decode_band = false;
};

// A boundary tensor or weight slot. Shape entries are names of declared dims.
struct TensorSpec {
  std::string name;
  std::vector<std::string> shape;
  std::vector<std::string> dtypes;  // subset of {f32, bf16}
  bool required = true;
  // Set on an output whose dtype must equal that input's (a seat never changes the host's dtype);
  // dtypes then holds that input's allowed dtypes.
  std::string dtype_of;
};

struct GateSpec {
  std::string kind;  // "values" (cosine) | "distribution" (teacher-forced top-1 agreement)
  double pass = 0.0;
  double warn = 0.0;
  double min_speedup = 0.0;
};

struct StructureSpec {
  std::string name;
  int version = 0;
  std::string kind;  // "region"
  std::string description;
  std::vector<DimSpec> dims;
  std::vector<TensorSpec> inputs, outputs, slots;
  // Host attributes the structure distinguishes, each with its allowed values.
  std::map<std::string, std::vector<std::string>> attributes;
  std::vector<std::pair<std::string, std::string>> points;  // (name, "input"|"output"|"internal")
  GateSpec gate;
  std::vector<std::string> boundary_excludes;
  std::string reference;  // one-line formula: the gates' ground truth
  bool tied_allowed = false;
  // First 16 hex chars of SHA-256 over a canonical form of the parsed spec: comments, layout
  // and key order do not move it; any value does.
  std::string digest;

  const DimSpec* dim(std::string_view name) const;
  const TensorSpec* slot(std::string_view name) const;
};

class Catalog {
 public:
  // Loads and validates every *.yaml in dir (other files are ignored). Throws InvalidArgument
  // naming the file and field on the first problem; an empty or missing dir is an error.
  static Catalog load(const std::string& dir);

  std::vector<std::string> names() const;  // sorted
  // Throws InvalidArgument listing the known names.
  const StructureSpec& get(const std::string& name) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::map<std::string, StructureSpec> specs_;
};

}  // namespace frt
