// The catalog: the one home of what the planner knows (docs/architecture.md, "The catalog").
//   structures/<name>.yaml  what one kind of seam looks like (boundary tensors in symbolic dims,
//                           weight slots, how discovery finds it, gates, the reference formula)
//   schemes.yaml            weight forms, and per scheme the form of each structure
//   ladders.yaml            per structure, the impls tried best first (kernel package + op)
//   gates.yaml              parity bands per output kind for the gated door
//   bindings/<name>.yaml    where a host family's slots sit (decode_loop's stack)
// The loader validates every file and every cross-reference and fails loudly, naming the file
// and field: a declaration nobody checks is a comment (DESIGN §10).
#pragma once

#include <flashrt/calibration.h>
#include <flashrt/types.h>

#include <cstdint>
#include <map>
#include <optional>
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
  std::vector<DType> dtypes;  // subset of {f32, bf16}
  bool required = true;
  // Set on an output whose dtype must equal that input's (a seat never changes the host's dtype);
  // dtypes then holds that input's allowed dtypes.
  std::string dtype_of;
};

struct GateSpec {
  OutputKind kind = OutputKind::values;  // values: cosine; distribution: top-1 agreement
  double pass = 0.0;
  double warn = 0.0;
  double min_speedup = 0.0;
};

// Note [Match patterns]: discovery reads a structure's `match` section; the planner knows node
// kinds and flow relations, never structure names. A node is a module of the host: a linear
// (weight [out, in] in the structure's dims, optionally the graph's output head) or an
// elementwise activation (what it computes becomes an attribute) or a norm without affine
// parameters (its measured form becomes an attribute). Flow relations come from the observed
// forward: same_input (both read one tensor), feeds (a's output is b's input), not_feeds,
// modulates (b reads a per-channel affine function of a's output, x*scale + shift, measured by
// the door). The site is the node's own module (one node) or the parent holding all nodes; with
// `siblings` every node must be a child of the first node's parent. An `optional` node may be
// left unassigned (a pack of two where a third sibling reads another tensor). An `experts` node is
// a bank of routed experts (a module of kind experts): its 3-D banks fill the slots gate, up
// [experts, intermediate, hidden] and down [experts, hidden, intermediate], binding those dims,
// and its measured gated form's activation must be one of its attribute's values.
// A `recurrence` node is a module that calls a recurrence function (kind recurrence): it binds
// the dims k_heads, v_heads, k_dim, v_dim and its measured form must be one of its attribute's
// values. A `conv` node is a depthwise convolution module whose weight a convolution function is
// called with (kind conv): it binds channels and taps, and the activation its calls ask for
// ("none" for none) must be one of its attribute's values. Both seat a function (kind function).
// A `norm` node alone in a function structure is a norm module whose whole forward the seat
// replaces: it binds width.
// An `attention` node is a module that calls the host's attention interface (kind attention): it
// binds heads, kv_heads, head_dim, and its measured form must be one of its attribute's values.
// A `rotary` node is a rotary embedding module whose cos/sin a rotary function was called with
// (kind rotary): it binds heads, kv_heads, head_dim, and its measured pairing form must be one of
// its attribute's values.
// A `block` node is a decoder layer (kind block) whose measured composition must be one of its
// attribute's values; it binds hidden. It is the one node of a block structure, seated through
// the seats of its sublayers.
enum class NodeKind : int32_t {
  linear,
  activation,
  norm,
  experts,
  recurrence,
  conv,
  attention,
  rotary,
  block
};
enum class FlowKind : int32_t { same_input, feeds, not_feeds, modulates };
enum class SiteKind : int32_t { node, parent };

struct MatchNode {
  std::string name;
  NodeKind kind = NodeKind::linear;
  std::string out_dim, in_dim;  // linear: weight [out_dim, in_dim]
  std::string weight_slot;      // linear: the slot its weight fills (the node's name)
  std::string bias_slot;        // linear: the slot its bias fills; "" = a bias is out of bounds
  bool output_head = false;     // linear: must be the graph's output head
  std::string attribute;  // activation / norm / experts: the attribute whose values it must take
  // experts: the slots its banks fill, gate, up, down (3-D, [experts, out, in]); the dims they
  // bind are experts_dim, and out_dim / in_dim as a linear's (gate's [out, in])
  std::vector<std::string> bank_slots;
  std::string experts_dim;
  bool optional = false;  // may stay unassigned (never the first node)
  // attention: matches modules whose keys and values live there (`cache:`, dense by default)
  AttentionCache cache = AttentionCache::dense;
};

// The value a conv node's attribute takes for calls that ask for no activation.
inline constexpr std::string_view kNoActivation = "none";

// The dims a recurrence, conv or (function structure) norm node binds (the structure declares
// them); empty for the others.
const std::vector<std::string>& node_dims(NodeKind kind);

struct FlowEdge {
  FlowKind kind = FlowKind::feeds;
  std::string a, b;
};

struct MatchSpec {
  int priority = 0;            // higher claims its modules first
  bool always_claims = false;  // claims its modules even when the caller did not ask for it
  SiteKind site = SiteKind::node;
  bool siblings = false;  // every node is a child of the first node's parent
  // Where the scheme gives the structure no form it claims nothing, leaving its modules to the
  // structures below it (an arrangement of projections rather than a precision of its own).
  bool yields_unformed = false;
  std::vector<MatchNode> nodes;
  std::vector<FlowEdge> flow;
  const MatchNode* node(std::string_view name) const;
};

struct StructureSpec {
  std::string name;
  int version = 0;
  // "region", or "function": a unit computed at the host's precision that reads no packed
  // weight: a function the host module calls (the gated delta rule) or a module that is one
  // (a norm).
  std::string kind;
  std::string description;
  std::vector<DimSpec> dims;
  std::vector<TensorSpec> inputs, outputs, slots;
  // Host attributes the structure distinguishes, each with its allowed values.
  std::map<std::string, std::vector<std::string>> attributes;
  std::vector<std::pair<std::string, std::string>> points;  // (name, "input"|"output"|"internal")
  GateSpec gate;
  MatchSpec match;
  std::vector<std::string> boundary_excludes;
  std::string reference;  // one-line formula: the gates' ground truth
  bool tied_allowed = false;
  // First 16 hex chars of SHA-256 over a canonical form of the parsed spec: comments, layout
  // and key order do not move it; any value does.
  std::string digest;

  const DimSpec* dim(std::string_view name) const;
  const TensorSpec* slot(std::string_view name) const;
};

// A weight form a scheme names: "int8" -> int8 per-channel, "int4_g32" -> int4 g32 symmetric.
struct WeightForm {
  std::string name;  // the catalog's name for it
  // No weight form: a function seat (kind function) computes at the host's own precision and
  // reads its operands from each call; `format` and `group` mean nothing then.
  bool host = false;
  WeightFormat format = WeightFormat::int8_channel;
  int group = 0;
  bool symmetric = true;
  DType scale_dtype = DType::f32;  // group forms may keep scales (and mins) in f16
  std::string tag;                 // "w8a16": the impl name's suffix
  // The rows a seat of this form serves, when the form has a band of its own (a GEMM form for
  // many rows); 0 = the structure's decode band. rows_max -1 = unbounded.
  int64_t rows_min = 0, rows_max = 0;
  // Rounded against the input's second moments (Note [Calibrated rounding] in
  // core/src/quant/calibrated.cpp): int4 forms only; a scheme naming one declares its calibration.
  bool calibrated = false;
  // "int8 per-channel", "int8 g32", "int4 g32 symmetric", "int4 g32 asymmetric f16 scales"
  std::string describe() const;
};

struct SchemeSpec {
  std::string name, description;
  std::map<std::string, std::string> formats;  // structure -> form name; absent: keep at host
  std::vector<std::string> requires_packages;  // the scheme is usable only where these load
  std::string indivisible;  // form used where a group form does not divide a width ("" = none)
  // What its calibrated forms are rounded against (empty when it names none): the statistics
  // recorded at each projection's input, and the rows below which a plan refuses the seat.
  std::vector<Statistic> statistics;
  int64_t calibration_rows = 0;
  // The widest span of inputs whose cross moments are kept (InputMoments::span_for's cap).
  int64_t calibration_span = 0;
};

struct SchemePolicy {
  std::map<std::string, WeightForm> forms;
  std::map<std::string, SchemeSpec> schemes;
  std::vector<std::string> auto_order;  // "auto" = the first usable scheme in this order
  // "auto" in the gated door: the schemes it measures on the host, per unit (Note [Gated auto]
  // in gates.cpp). Empty: the gated door resolves auto as the build-only doors do.
  std::vector<std::string> gated_auto;
  // Seams with fewer weights stay with the host: below it a seat cannot pay for its call.
  int64_t min_seat_weights = 0;
  // Every parameter of at least this many elements (outside the input embedding) is accounted
  // for by a plan over all structures: seated, kept at host or refused, each with its reason.
  int64_t account_weights = int64_t{1} << 62;
};

// One impl a ladder tries: a kernel package's op. per_node seats each linear node of the seam
// on its own (the op then takes one projection) instead of the region as one call; packed runs
// the linear op once over the nodes' weights stacked along the output (siblings that read one
// input: one quantization of it, one GEMM).
struct Rung {
  std::string impl;
  std::string package;
  OpKind op = OpKind::linear;
  bool per_node = false;
  bool packed = false;
  // The package builds (variant names' last part: "amx") this rung is measured to pay on; empty:
  // any. On another build the rung is passed over, saying so (a portable path slower than the
  // host's own is no qualified implementation).
  std::vector<std::string> builds;
};

// Parity bands of the gated door, by what the host's forward returns (DESIGN §7).
struct OutputBand {
  OutputKind kind = OutputKind::values;
  std::string metric;  // "cosine" | "top1_agreement"
  double pass = 0, warn = 0;
};

// decode_loop's self-check against the host (gates.yaml self_checks.decode_loop): teacher-forced
// over a probe of probe_tokens tokens, the loop's logits against the host's at every position,
// and the rotated keys each layer cached. Every floor must hold.
struct SelfCheckSpec {
  int64_t probe_tokens = 0;
  double top1_agreement = 0;  // floor on the share of positions whose argmax agrees
  double logits_cosine = 0;   // floor on every position's logits cosine
  double keys_cosine = 0;     // floor on every layer's and position's cached key cosine
};

// Where a host family keeps the slots of a decode program (decode_loop): paths relative to the
// stack and to each layer, and the attribute values it covers.
struct BindingSlot {
  std::string name, path;
  bool required = true;
};
struct BindingSpec {
  std::string name, description;
  std::string layers;              // path of the layer list, e.g. "model.layers"
  std::vector<BindingSlot> stack;  // final_norm, rotary, ... relative to the root
  std::vector<BindingSlot> layer;  // per layer, relative to the layer
  // Per-layer paths whose presence means a form the program does not take -> what that form is.
  std::map<std::string, std::string> fused_forms;
  // The kernel packages the program runs (the file's `kernels`): its primitives, the linear op
  // over the host's own projections, the fused feed-forward.
  std::string decode_package, linear_package, ffn_package;
  // The attribute values it covers (the file's `attributes`: norm_form, activation, rope_type),
  // parsed at load; empty when the file declares none.
  std::vector<NormForm> norm_forms;
  std::vector<Activation> activations;
  std::vector<RopeKind> rope_kinds;
};

class Catalog;
namespace detail {
// Reads schemes.yaml, ladders.yaml, gates.yaml and bindings/ (core/src/catalog/policy.cpp).
void load_policy(Catalog& c, const std::string& dir);
}  // namespace detail

class Catalog {
 public:
  // Loads and validates the catalog under dir (layout above). structures/ must hold at least one
  // spec; the other files are optional. Throws InvalidArgument naming the file and field on the
  // first problem, including cross-references (a scheme or ladder naming an unknown structure,
  // form or op).
  static Catalog load(const std::string& dir);

  std::vector<std::string> names() const;  // structures, sorted
  // Throws InvalidArgument listing the known names.
  const StructureSpec& get(const std::string& name) const;
  const std::string& dir() const { return dir_; }

  const SchemePolicy& schemes() const { return schemes_; }
  // The ladder of a structure (empty when none is declared).
  const std::vector<Rung>& ladder(const std::string& structure) const;
  // Where each rung was declared ("ladders.yaml: ladders.linear_proj[0]"), for messages.
  std::string rung_field(const std::string& structure, size_t index) const;
  const std::map<std::string, std::vector<Rung>>& ladders() const { return ladders_; }
  const OutputBand& band(OutputKind kind) const;
  // Throws InvalidArgument when gates.yaml declares no decode_loop self-check.
  const SelfCheckSpec& decode_self_check() const;
  const std::map<std::string, BindingSpec>& bindings() const { return bindings_; }
  // Throws InvalidArgument listing the known names.
  const BindingSpec& binding(const std::string& name) const;
  // Every package a ladder names and every scheme requires that is not in `visible` (the kernel
  // path's packages), as "file: field: 'pkg' is not on the kernel path"; empty when all are.
  std::vector<std::string> missing_packages(const std::vector<std::string>& visible) const;

 private:
  friend void detail::load_policy(Catalog& c, const std::string& dir);
  std::string dir_;
  std::map<std::string, StructureSpec> specs_;
  SchemePolicy schemes_;
  std::map<std::string, std::vector<Rung>> ladders_;
  std::map<OutputKind, OutputBand> bands_;
  std::optional<SelfCheckSpec> decode_self_check_;
  std::map<std::string, BindingSpec> bindings_;
};

}  // namespace frt
