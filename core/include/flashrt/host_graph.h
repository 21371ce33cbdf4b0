// The neutral description of a host the door hands the planner: its module tree, slot tensors
// and what one real forward showed. Nothing here names a framework; discovery matches on shapes,
// kinds and observed dataflow, never on type or model names.
#pragma once

#include <flashrt/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace frt {

enum class ModuleKind : int32_t {
  linear,      // y = x W^T (+ b), weight [out, in]
  embedding,   // a lookup table [rows, width]
  activation,  // a parameter-free elementwise nonlinearity; `activation` says which
  norm,        // a 1-D-weighted normalisation over the last dim; attributes say which form
  module,      // anything else (a container)
};

struct HostModule {
  std::string path;  // "model.layers.0.mlp.gate_proj"; "" is the root
  ModuleKind kind = ModuleKind::module;
  std::string type_name;  // shown by explain(); never matched on
  // linear / embedding / norm (in_features is a norm's width)
  int64_t in_features = 0, out_features = 0;
  bool has_bias = false;
  DType weight_dtype = DType::f32;
  std::string weight_device;
  int64_t weight_id = 0;  // storage identity: equal for tied weights
  // activation: what the door measured the module to compute.
  Activation activation = Activation::unknown;
  // What the door measured or read of the module, e.g. a norm's "form" ("rms", "rms_one_plus",
  // "other") and "eps"; read by bindings (decode_loop), never by structure discovery.
  std::map<std::string, std::string> attributes;
  std::vector<float> values;          // a module's measured vector (the rotary frequencies)
  std::vector<std::string> children;  // direct children's paths
};

// One call of a module seen during the observed forward, in call order.
struct HostCall {
  std::string path;
  int64_t rows = 0;                     // leading dimensions flattened
  int64_t width = 0;                    // last dimension of the input
  DType dtype = DType::f32;             // input dtype
  int64_t input_id = 0, output_id = 0;  // tensor identities: equal ids are the same tensor
  // The output_id of a norm call whose output this call's input is a per-channel affine
  // function of (x = n*scale + shift, fitted by the door over the observed rows); 0 if none.
  int64_t modulated_from = 0;
};

struct HostGraph {
  std::vector<HostModule> modules;
  std::vector<HostCall> calls;
  std::string output_head;      // the module that produces the logits, "" if none
  std::string input_embedding;  // the token embedding, "" if none
  // The host's configuration as the door read it (head counts, rotary form, sliding window).
  std::map<std::string, std::string> attributes;

  const HostModule* find(const std::string& path) const;
  std::vector<const HostCall*> calls_of(const std::string& path) const;
};

}  // namespace frt
