// The planner: discovery of seams on a HostGraph, qualification of impls per seam, schemes and
// ladders, into a Plan that is explained before anything is swapped (DESIGN §4). Every structure,
// scheme, form and ladder comes from the catalog; the planner knows node kinds, flow relations
// and op kinds, never a structure's name. The door executes a plan; it decides nothing.
#pragma once

#include <flashrt/catalog.h>
#include <flashrt/host_graph.h>
#include <flashrt/hub.h>
#include <flashrt/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace frt {

// One region a structure describes, as found on the host.
struct Seam {
  std::string site;                             // module path of the region
  std::string structure;                        // a catalog structure's name
  std::map<std::string, std::string> nodes;     // match node -> module path
  std::map<std::string, std::string> slots;     // weight / bias slot -> module path holding it
  std::map<std::string, int64_t> dims;          // the structure's dims bound on this host
  Activation activation = Activation::unknown;  // when the pattern has an activation node
  DType weight_dtype = DType::f32;
  std::optional<DType> act_dtype;  // from the observed forward
  std::vector<int64_t> rows_seen;
  bool tied = false;  // an output head sharing the input embedding's weight
  std::string shape;  // "gate/up [640x256], down [256x640]": what refusals and explain quote
  int64_t weight_count = 0;
  int64_t top_k = 0;         // a bank of experts: the experts each row is routed to
  NormFacts norm;            // a norm seam (a function structure's norm node): its form and epsilon
  AttentionFacts attention;  // an attention seam: what its calls showed (scale, softcap)
  RouterFacts router;        // a routed decoder block: how its router chooses, as measured
};

using SiteReason = std::pair<std::string, std::string>;

struct Discovery {
  std::vector<Seam> seams;
  std::vector<SiteReason> refused;  // recognised, but outside the boundary
  std::vector<std::string> assumed;
};

// Finds the seams of `structures` (catalog names; empty = every structure) on the host. Throws
// InvalidArgument for a name the catalog does not hold.
Discovery discover(const HostGraph& graph, const Catalog& catalog,
                   const std::vector<std::string>& structures);

// A tensor of the host a seat reads: `tensor` ("weight", "bias", "gate_up_proj") of the module at
// `module`; of a fused bank (gate and up in one [experts, 2F, D] tensor), the part'th of `parts`
// equal slices of its second dimension (gate 0 of 2, up 1 of 2).
struct SlotTensor {
  std::string module, tensor;
  int part = 0, parts = 1;
};

// The band_max of a form band without a max (a catalog form's `rows: {min}`, rows_max -1): every
// row count from its min. Seats keep bands as int64 ranges; this is far past any real call.
inline constexpr int64_t kUnboundedRows = int64_t{1} << 62;

// One seat the plan decided on: what it replaces, the op it runs and the tensor of each operand.
struct SeatPlan {
  Seam seam;
  std::string site;                   // the module the seat stands in for
  std::vector<std::string> replaces;  // the modules it computes: the site, or the site's nodes
  std::string impl;                   // "linear_w8a16", "ffn_w4a16", ...
  std::string package;                // kernel package it runs on
  OpKind op = OpKind::linear;
  WeightForm form;
  int64_t band_min = 1, band_max = 1;  // rows; others run the host (band dispatch)
                                       // (band_max kUnboundedRows: no max)
  // Operand -> host tensor: linear {weight, bias?}; gated_ffn {gate, up, down};
  // ffn {up, down, up_bias?, down_bias?}.
  std::map<std::string, SlotTensor> slots;
  Activation activation = Activation::unknown;  // ffn ops
  DType act_dtype = DType::f32;                 // the activation dtype it is bound for
  std::vector<std::string> ladder;              // each step aside on the way to this impl
};

struct Scheme {
  std::string name;
  std::map<std::string, WeightForm> formats;  // structure -> form
  // The calibration its calibrated forms need (SchemeSpec's): statistics and the rows.
  std::vector<Statistic> statistics;
  int64_t calibration_rows = 0;
};

// "auto" and the catalog's schemes.
std::vector<std::string> scheme_names(const Catalog& catalog);

struct PlanOptions {
  std::vector<std::string> structures;  // empty: every structure in the catalog
  std::string scheme = "auto";
  std::optional<int64_t> min_seat_weights;  // unset: the catalog's keep_host rule
  std::optional<int64_t> account_weights;   // unset: the catalog's (Note [Every weight accounted])
  // Adoption (adopt_prequantized): the form each module's weight already has in a quantised
  // checkpoint, by module path. When any is given the scheme is not consulted: a seam takes its
  // projections' own forms, a seam whose weights the checkpoint holds unquantised stays at host,
  // and a module in source_refusals (a block type no kernel reads) refuses its seam with that
  // reason. A bank of experts is keyed by its module's path (all three operands) or by
  // "<module>/<operand>" for one ("model.layers.0.mlp.experts/gate", "/up", "/down"); a bank
  // whose operands differ in form is refused (one bank op runs one form). source names the
  // checkpoint format for the plan ("gguf").
  std::map<std::string, WeightForm> source_forms;
  std::map<std::string, std::string> source_refusals;
  std::string source;
  // A machine decisions file (flashrt/decisions.h): its measured form bands replace the
  // catalog's on the CPU it was measured on; the plan's `assumed` says which value came from
  // where. "" = the catalog's defaults.
  std::string decisions_path;
};

struct Plan {
  Scheme scheme;
  std::vector<SeatPlan> seats;
  std::vector<SiteReason> keep_host;  // decisions, with reasons (not refusals)
  std::vector<SiteReason> refused;
  std::vector<std::string> assumed;
  std::vector<UnavailableEntry> kernel_unavailable;
  int64_t seams_found = 0;
};

// Throws InvalidArgument for an unknown scheme or structure name.
Plan plan(const HostGraph& graph, const Catalog& catalog, const PlanOptions& options,
          KernelHub& hub);

// What a pass decided, before anything is swapped: every seat, keep-at-host and refusal with
// its reason, and the counts. Entries that differ only by one index of their path (the layers of
// a stack) are written once, "model.layers.{0..29}.mlp ... x30" (Note [Explain groups] in
// core/src/util/explain_groups.cpp); verbose writes each on its own line.
std::string explain(const Plan& plan, bool verbose = false);

}  // namespace frt
