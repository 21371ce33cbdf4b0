// The neutral description of a host the door hands the planner: its module tree, slot tensors
// and what one real forward showed. Nothing here names a framework; discovery matches on shapes,
// kinds and observed dataflow, never on type or model names.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace frt {

struct HostModule {
  std::string path;       // "model.layers.0.mlp.gate_proj"; "" is the root
  std::string kind;       // "linear", "embedding", "activation" or "module"
  std::string type_name;  // shown by explain(); never matched on
  // linear / embedding
  int64_t in_features = 0, out_features = 0;
  bool has_bias = false;
  std::string weight_dtype;  // "f32", "bf16", or the host's name for anything else
  std::string weight_device;
  int64_t weight_id = 0;  // storage identity: equal for tied weights
  // activation: what the door measured the module to compute ("silu", "gelu_tanh", "gelu",
  // "relu", or "unknown")
  std::string activation;
  std::vector<std::string> children;  // direct children's paths
};

// One call of a module seen during the observed forward, in call order.
struct HostCall {
  std::string path;
  int64_t rows = 0;                     // leading dimensions flattened
  int64_t width = 0;                    // last dimension of the input
  std::string dtype;                    // input dtype
  int64_t input_id = 0, output_id = 0;  // tensor identities: equal ids are the same tensor
};

struct HostGraph {
  std::vector<HostModule> modules;
  std::vector<HostCall> calls;
  std::string output_head;      // the module that produces the logits, "" if none
  std::string input_embedding;  // the token embedding, "" if none

  const HostModule* find(const std::string& path) const;
  std::vector<const HostCall*> calls_of(const std::string& path) const;
};

}  // namespace frt
