// The runtime contract of a seat (DESIGN §6): a seat declares its form, checks every call
// against it, runs its kernel or tells the door to run the host, and keeps the ledger.
#pragma once

#include <flashrt/calibration.h>
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/pack.h>
#include <flashrt/plan.h>
#include <flashrt/tensor.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace frt {

// Operand name ("weight", "gate", "up", "down") -> the moments of the input it reads.
using OperandMoments = std::map<std::string, const InputMoments*>;

// What the door must do after a call.
enum class Verdict : int32_t {
  ran = 0,       // the kernel wrote the output
  band = 1,      // rows outside the band: run the host (counted, not a fallback)
  fallback = 2,  // any other miss: run the host with the same arguments (counted)
  restore = 3,   // a fallback that crossed the consecutive limit: run the host and put it back
  raise = 4,     // on_guard_fail="raise": raise instead of running the host (not counted)
};

// Consecutive fallbacks after which a seat gives its region back to the host for good.
inline constexpr int64_t kSelfDetachAfter = 32;

struct SeatForm {
  std::string site, structure, impl;
  OpKind op = OpKind::linear;
  DType dtype = DType::f32;  // activation dtype the seat was bound for
  int64_t width = 0;         // input features
  int64_t out = 0;           // output features
  int64_t band_min = 1, band_max = 16;
  std::string weights;  // "int8 per-channel"
  // A packed seat (SeatPlan.replaces holds several modules): each one's output columns, in the
  // order of `replaces`, summing to `out`. Empty for a seat of one module.
  std::vector<int64_t> splits;
  std::string describe() const;
};

struct Ledger {
  int64_t calls = 0, fallbacks = 0, band_dispatches = 0, consecutive_fallbacks = 0;
  std::string last_reason;
  std::map<std::string, int64_t> reasons;  // fallback reason -> count
  bool restored = false;
};

// What a seat does on an out-of-form call: run the host (counted), or raise.
enum class GuardMode : int32_t { fallback, raise };
const char* name_of(GuardMode m);
std::optional<GuardMode> parse_guard_mode(std::string_view name);  // "fallback" | "raise"

// A bound seat: the packed weights, its form and its ledger. Thread-safe: the ledger is locked,
// and a call from a thread other than the owner is a counted fallback.
class Seat {
 public:
  Seat(SeatForm form, const frt_kernel_table& table, GuardMode mode);
  virtual ~Seat() = default;

  // Checks a call of `rows` rows against the band, before the door allocates an output.
  // Returns Verdict::ran when the call is in band (the door then calls run()).
  Verdict admit_rows(int64_t rows);
  // Counts a call the host's own path takes by its kind, whatever its rows (an engine's prefill
  // batch, which its backend computes apart from the decode batches the seat serves).
  void count_band();
  // Runs the call: form checks, then the kernel. `training` is the module's mode at the call.
  // `routing`: the router's choice, for a seat of a bank of experts (nullptr for the others).
  Verdict run(const TensorView& x, const TensorView& y, bool training,
              const Routing* routing = nullptr);
  // Runs the kernel on a call outside the host's forward (the door's accuracy band on
  // calibration rows) with run()'s form checks but no ledger entry: "" when the kernel wrote y,
  // else why it did not (rows outside the band among the reasons).
  std::string probe(const TensorView& x, const TensorView& y);
  // The door reports a miss it found itself (an input it cannot view without a copy).
  Verdict miss(const std::string& reason);
  // A miss after which the seat gives its region back for good (a failed self-check): counted
  // as a fallback, and the ledger marked restored, so the same seat is not attached again.
  void retire(const std::string& reason);
  // First time a reason is seen (the door warns once per reason).
  bool first_time(const std::string& reason) const;

  const SeatForm& form() const { return form_; }
  Ledger ledger() const;
  std::thread::id owner() const { return owner_; }
  GuardMode mode() const;
  const frt_kernel_table& table() const { return table_; }
  // Packed bytes one call streams (the floor's numerator).
  virtual int64_t nbytes() const = 0;
  void set_mode(GuardMode mode);  // swap.attach(on_guard_fail=...) sets it on a planned seat

 protected:
  // Seat::run's contract for a seat whose call is not (x, y) (a function seat): training mode,
  // owning thread and the seated dtype, then `refusal` ("" runs `execute`), all in the ledger.
  Verdict run_call(bool training, DType dtype, const std::function<std::string()>& refusal,
                   const std::function<void()>& execute);
  // Counts a call that ran, for a seat whose call is neither run() nor run_call() (a block).
  void count_ran();
  // The form checks of one call: "" when the kernel takes it, else the reason. `routing` is
  // run()'s (a seat that takes none refuses a call that brings one, and the other way round).
  virtual std::string refusal(const TensorView& x, const TensorView& y,
                              const Routing* routing) const = 0;
  // Runs the kernel; only run() calls it, right after refusal() returned "" for the same views,
  // so it does not check the form again (each seated call is checked once).
  virtual void execute(const TensorView& x, const TensorView& y, const Routing* routing) = 0;
  const frt_kernel_table& table_;

 private:
  SeatForm form_;
  GuardMode mode_;
  std::thread::id owner_;
  mutable std::mutex mu_;
  Ledger ledger_;
};

class LinearSeat : public Seat {
 public:
  LinearSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode, PackedLinear weight,
             std::vector<float> bias);
  const PackedLinear& weight() const { return weight_; }
  const float* bias() const { return bias_.empty() ? nullptr : bias_.data(); }
  int64_t nbytes() const override { return weight_.nbytes(); }

 private:
  std::string refusal(const TensorView& x, const TensorView& y,
                      const Routing* routing) const override;
  void execute(const TensorView& x, const TensorView& y, const Routing* routing) override;
  PackedLinear weight_;
  std::vector<float> bias_;
};

// A fused feed-forward: gated (gate set, bias-free) or ungated (no gate, biases optional).
class FfnSeat : public Seat {
 public:
  FfnSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode,
          std::optional<PackedLinear> gate, PackedLinear up, PackedLinear down,
          std::vector<float> up_bias, std::vector<float> down_bias, Activation act);
  const PackedLinear* gate() const { return gate_ ? &*gate_ : nullptr; }
  const PackedLinear& up() const { return up_; }
  const PackedLinear& down() const { return down_; }
  Activation activation() const { return act_; }
  FfnOperands operands() const;
  int64_t nbytes() const override {
    return (gate_ ? gate_->nbytes() : 0) + up_.nbytes() + down_.nbytes();
  }

 private:
  std::string refusal(const TensorView& x, const TensorView& y,
                      const Routing* routing) const override;
  void execute(const TensorView& x, const TensorView& y, const Routing* routing) override;
  std::optional<PackedLinear> gate_;
  PackedLinear up_, down_;
  std::vector<float> up_bias_, down_bias_;
  Activation act_;
};

// A module of a packed seat other than the first the host calls: it runs no kernel. When it is
// called with the very tensor the pack's first module ran on, the door hands it its columns of
// that call's output and run() checks the call's form and counts it; any other call runs the
// module itself (miss(), counted). Its form is the module's own: its width, its columns.
class MemberSeat : public Seat {
 public:
  MemberSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode)
      : Seat(std::move(form), table, mode) {}
  int64_t nbytes() const override { return 0; }  // the pack's first seat streams the weights

 private:
  std::string refusal(const TensorView&, const TensorView&, const Routing* routing) const override {
    return routing != nullptr ? "a projection takes no routing" : "";
  }
  void execute(const TensorView&, const TensorView&, const Routing*) override {}
};

// A bank of routed experts (moe_ffn): each call brings the router's choice beside x.
class MoeSeat : public Seat {
 public:
  MoeSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode, ExpertBank bank)
      : Seat(std::move(form), table, mode), bank_(std::move(bank)) {}
  const ExpertBank& bank() const { return bank_; }
  // Every expert's bytes; a call streams only its selected experts' (expert_nbytes() each).
  int64_t nbytes() const override { return bank_.nbytes(); }

 private:
  std::string refusal(const TensorView& x, const TensorView& y,
                      const Routing* routing) const override;
  void execute(const TensorView& x, const TensorView& y, const Routing* routing) override;
  ExpertBank bank_;
};

// One call of the gated delta rule as the host's module makes it (views of its own tensors): q, k
// [batch, tokens, k_heads, k_dim], v [.., v_heads, v_dim], g (fp32) and beta [batch, tokens,
// v_heads], the state it starts from [batch, v_heads, k_dim, v_dim] (fp32; none: zeros); out
// [batch, tokens, v_heads, v_dim] in q's dtype and final_state (fp32, may be initial_state's
// memory) are written, both contiguous.
struct GatedDeltaCall {
  TensorView q, k, v, g, beta;
  std::optional<TensorView> initial_state;
  TensorView out, final_state;
  bool l2norm = false;  // q and k l2-normalised inside (eps 1e-6, as the host's reference)
  float scale = 0;      // q's scale after the norm (1/sqrt(k_dim) in transformers)
};

// The seat of a module's gated delta rule (op gated_delta): it holds no weight; each call brings
// its operands and the state lives with the host's cache. Dims are fixed at plan time.
class GatedDeltaSeat : public Seat {
 public:
  GatedDeltaSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode,
                 std::map<std::string, int64_t> dims)
      : Seat(std::move(form), table, mode), dims_(std::move(dims)) {}
  Verdict call(const GatedDeltaCall& c, bool training);
  std::string call_refusal(const GatedDeltaCall& c) const;  // "" when the kernel takes it
  int64_t nbytes() const override { return 0; }

 private:
  std::string refusal(const TensorView&, const TensorView&, const Routing*) const override {
    return "the gated delta rule takes its own call (call())";
  }
  void execute(const TensorView&, const TensorView&, const Routing*) override {}
  std::map<std::string, int64_t> dims_;
};

// One call of a causal depthwise convolution: x [batch, channels, tokens], weight [channels,
// taps] (contiguous), bias [channels] or none, the state [batch, channels, state_len] read and
// then updated in place (none: zeros before x), y [batch, channels, tokens]; any strides, one
// dtype. `activation` silu, or none when !activated.
struct ConvCall {
  TensorView x, weight;
  std::optional<TensorView> bias, state;
  TensorView y;
  bool activated = false;
  Activation activation = Activation::silu;
};

// The seat of a depthwise convolution's function (op causal_conv1d), the weight read from each
// call (the host hands its own).
class ConvSeat : public Seat {
 public:
  ConvSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode, int64_t channels,
           int64_t taps)
      : Seat(std::move(form), table, mode), channels_(channels), taps_(taps) {}
  Verdict call(const ConvCall& c, bool training);
  std::string call_refusal(const ConvCall& c) const;
  int64_t nbytes() const override { return 0; }

 private:
  std::string refusal(const TensorView&, const TensorView&, const Routing*) const override {
    return "a convolution takes its own call (call())";
  }
  void execute(const TensorView&, const TensorView&, const Routing*) override {}
  int64_t channels_, taps_;
};

// One call of the host's attention interface for decode rows (views of its own tensors): q
// [batch, heads, 1, head_dim] (each row's heads head_dim apart), k and v [batch, kv_heads,
// positions, head_dim] as the host's cache holds them (any row, head and position strides, the
// head_dim contiguous), out [batch, 1, heads, head_dim] contiguous, written. The mask, where the
// host passes one, is [batch or 1, 1, 1, positions]: bool (true: attended) or f32 added to the
// scores (0: attended, -inf or the dtype's lowest: hidden); each row's attended positions must be
// one range (a causal mask over a preallocated cache, left padding, a sliding window), which is
// what the op reads. Any other mask is refused (Note [Mask as a range]).
struct AttentionCall {
  TensorView q, k, v, out;
  std::optional<TensorView> mask;
  float scale = 0;    // scores are q.k * scale
  float softcap = 0;  // > 0: scores softcapped (softcap * tanh(s / softcap)) before the softmax
};

// One decode batch of a serving engine's attention layer (views of its own tensors): q [batch,
// heads, head_dim] f32 (each row's heads head_dim apart), the layer's key and value pools [slots,
// kv_heads, head_dim] (f32 or bf16, head_dim contiguous, any slot and head strides), the engine's
// slot table [lines, width] int32 (a line per request, a slot per position), each row's line
// `rows` [batch] and length `lengths` [batch] int64; out [batch, heads, head_dim] f32 contiguous,
// written. Every row attends positions [0, length) of its line (Note [Paged attention] in
// kernels/decode/src/decode_ops.cpp).
struct PagedAttentionCall {
  TensorView q, k_pool, v_pool, table, rows, lengths, out;
  float scale = 0;    // scores are q.k * scale
  float softcap = 0;  // > 0: scores softcapped before the softmax
};

// The seat of a module's attention (op attention; capped_attention for a softcapped form;
// paged_attention for a serving engine's pool; sequence_attention for whole sequences, a diffusion
// transformer's): it holds no weight, reads the host's cache or the call's tensors where they
// stand, and keeps the scores' scratch.
class AttentionSeat : public Seat {
 public:
  AttentionSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode, int64_t heads,
                int64_t kv_heads, int64_t head_dim)
      : Seat(std::move(form), table, mode), heads_(heads), kv_heads_(kv_heads), dim_(head_dim) {}
  Verdict call(const AttentionCall& c, bool training);
  std::string call_refusal(const AttentionCall& c) const;  // "" when the kernel takes it
  Verdict call_paged(const PagedAttentionCall& c, bool training);
  std::string paged_refusal(const PagedAttentionCall& c) const;  // "" when the kernel takes it
  // One call of torch's scaled_dot_product_attention over whole sequences at the seat's heads
  // (SequenceAttention's views; out written), with the call's attn_mask where it passes one:
  // [batch or 1, heads or 1, 1, kv_len], bool (true: attended) or f32 / bf16 added to the
  // scores, read as each sequence's one range of keys (Note [Key padding as a range]).
  Verdict call_sequence(const SequenceAttention& c, const std::optional<TensorView>& mask,
                        bool training);
  // "" when the kernel takes it; else the reason. `ranges` gets each sequence's keys.
  std::string sequence_refusal(const SequenceAttention& c, const std::optional<TensorView>& mask,
                               std::vector<std::pair<int64_t, int64_t>>& ranges) const;
  int64_t nbytes() const override { return 0; }

 private:
  std::string refusal(const TensorView&, const TensorView&, const Routing*) const override {
    return "attention takes its own call (call())";
  }
  void execute(const TensorView&, const TensorView&, const Routing*) override {}
  void run_rows(const AttentionCall& c);
  void run_paged(const PagedAttentionCall& c);
  // Why a call's scale and softcap, or the seat's grouping of heads, is not one the ops take.
  std::string grouping_refusal(float scale, float softcap) const;
  // The positions [first, last) row r attends, or why the mask is not one range the op reads.
  std::string attended(const AttentionCall& c, int64_t r, int64_t& first, int64_t& last) const;
  int64_t heads_, kv_heads_, dim_;
  std::vector<float> scores_;  // [heads][positions], grown as the cache grows
};

// One call of a rotary function as an attention module makes it (transformers'
// apply_rotary_pos_emb(q, k, cos, sin)): q [batch, heads, tokens, head_dim] and k [batch,
// kv_heads, tokens, head_dim] (any strides, head_dim contiguous), the cos and sin its rotary
// module returned [batch or 1, tokens, head_dim] (head_dim contiguous; each row's two halves
// equal, the rotate-half table), and q_out, k_out of q's and k's shapes whose heads are head_dim
// apart at each (batch, token), written: x[i] cos[i] - x[i + half] sin[i] and
// x[i + half] cos[i] + x[i] sin[i].
struct RotaryCall {
  TensorView q, k, cos, sin, q_out, k_out;
};

// The seat of a model's rotary function (op rotary): it holds no weight; every call brings the
// tables its rotary module computed for those positions.
class RotarySeat : public Seat {
 public:
  RotarySeat(SeatForm form, const frt_kernel_table& table, GuardMode mode, int64_t heads,
             int64_t kv_heads, int64_t head_dim)
      : Seat(std::move(form), table, mode), heads_(heads), kv_heads_(kv_heads), dim_(head_dim) {}
  Verdict call(const RotaryCall& c, bool training);
  std::string call_refusal(const RotaryCall& c) const;  // "" when the kernel takes it
  int64_t nbytes() const override { return 0; }

 private:
  std::string refusal(const TensorView&, const TensorView&, const Routing*) const override {
    return "a rotary takes its own call (call())";
  }
  void execute(const TensorView&, const TensorView&, const Routing*) override {}
  void run_rows(const RotaryCall& c) const;
  int64_t heads_, kv_heads_, dim_;
};

// The seat of a norm module's forward (op rmsnorm): y = x / rms(x) * w, rows of its width, the
// weight copied from the module at bind (rms_one_plus: 1 + w, so the op's x*w form computes
// Gemma's x*(1+w)) and the module's epsilon.
class NormSeat : public Seat {
 public:
  NormSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode, std::vector<float> weight,
           float eps)
      : Seat(std::move(form), table, mode), weight_(std::move(weight)), eps_(eps) {}
  int64_t nbytes() const override { return static_cast<int64_t>(weight_.size() * sizeof(float)); }
  float eps() const { return eps_; }

 private:
  std::string refusal(const TensorView& x, const TensorView& y,
                      const Routing* routing) const override;
  void execute(const TensorView& x, const TensorView& y, const Routing* routing) override;
  std::vector<float> weight_;
  float eps_;
};

// A routed layer's router as a block runs it: its weight [experts, hidden] copied at build (fp32,
// the host's own stays the host's), logits x W^T on a package's dense op (the attention seat's
// package, flashrt/decode), then choose_experts() (kernel_ops.h): the top-k of the softmax,
// renormalised where the door measured the host's router to do so (RouterFacts).
struct BlockRouter {
  std::vector<float> weight;
  int64_t experts = 0, top_k = 0;
  bool renormalise = false;
};

// The seats a block seat runs, each built for the same plan (SeatPlan.seam.nodes names their
// sites): the layer's two norms and feed-forward, its attention module's q/k/v projections (one
// pack whose splits are q, k and v, or three seats), o projection and per-head q/k norms
// (nullptr where the layer has none), the model's rotary and the module's attention. The
// feed-forward is a dense one (ffn) or a routed one: a bank of experts and the router that
// picks its rows' experts (bank and router; Note [Routed decoder block] in planner/plan.cpp),
// with a shared expert beside them where the layer has one (shared: its feed-forward seat;
// shared_gate: a copy of its gate's [1, hidden] weight, mixed in as sigmoid(x g) * shared(x)).
struct BlockParts {
  NormSeat* input_norm = nullptr;
  NormSeat* post_norm = nullptr;
  std::vector<LinearSeat*> qkv;
  NormSeat* q_norm = nullptr;
  NormSeat* k_norm = nullptr;
  RotarySeat* rotary = nullptr;
  AttentionSeat* attention = nullptr;
  LinearSeat* o = nullptr;
  FfnSeat* ffn = nullptr;
  MoeSeat* bank = nullptr;
  BlockRouter router;              // with bank only
  FfnSeat* shared = nullptr;       // with bank only
  std::vector<float> shared_gate;  // with shared only: [hidden]
};

// The layer's widths and the attention call's scalars, as the plan's facts give them.
struct BlockGeometry {
  int64_t hidden = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float scale = 0, softcap = 0;
};

// A decoder layer for decode rows (op block), run through the seats of its parts in two
// halves around the host's cache update: head() writes the step's q (normed and rotated), k and
// v; the door hands k and v to the host's cache and tail() takes back what the cache returns,
// attends, projects, adds the residual, and runs the post norm and the feed-forward into y. Each
// part's seat checks and counts its own call; the block's ledger counts the layer's. Between the
// halves nothing of the host changes but its cache, so a miss in head() leaves the door free to
// run the host's layer; tail() checks the attention call before it writes anything, and a miss
// there hands the door the rest of the layer to run with the host's modules.
class BlockSeat : public Seat {
 public:
  // `table`: the attention part's package table (a routed block runs its router's logits on
  // that package's dense op; every other op is its parts' seats').
  BlockSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode, BlockParts parts,
            BlockGeometry geometry);
  // x [rows, hidden]; cos, sin [rows or 1, 1, head_dim] (the tables the layer's call carried); q
  // [rows, heads, 1, head_dim], k and v [rows, kv_heads, 1, head_dim], contiguous, written.
  Verdict head(const TensorView& x, const TensorView& cos, const TensorView& sin,
               const TensorView& q, const TensorView& k, const TensorView& v, bool training);
  // x as head() had it, q as head() wrote it, k and v the host cache's [rows, kv_heads,
  // positions, head_dim], the model's mask (AttentionCall's forms) and y [rows, hidden], written.
  Verdict tail(const TensorView& x, const TensorView& q, const TensorView& k, const TensorView& v,
               const std::optional<TensorView>& mask, const TensorView& y, bool training);
  // The self-check of the first decode call against the host's layer on the same values: each
  // named cosine must reach `pass`. "" when all do, else which did not (the door then restores
  // the host's layer with that reason, through miss()).
  static std::string judge(const std::vector<std::pair<std::string, double>>& cosines, double pass);
  // Its parts' seats stream their bytes, each counted where it stands (as a pack's members
  // are); a routed block streams its router's copy (experts x hidden fp32) and its shared
  // expert's gate's (hidden fp32) itself.
  int64_t nbytes() const override {
    return static_cast<int64_t>((parts_.router.weight.size() + parts_.shared_gate.size()) *
                                sizeof(float));
  }

 private:
  std::string refusal(const TensorView&, const TensorView&, const Routing*) const override {
    return "a decoder block takes its own calls (head(), tail())";
  }
  void execute(const TensorView&, const TensorView&, const Routing*) override {}
  // "" when the parts' seats answered ran, else "<part>: <its reason>".
  std::string part_miss(const char* part, const Seat& seat, Verdict v) const;
  // Either half's own checks of a call: training mode, the owner's thread, x f32 rows of the
  // hidden width, contiguous, in the band. "" when it takes x.
  std::string entry_refusal(const TensorView& x, bool training) const;
  // A routed layer's feed-forward: the router's choice for the rows, then the bank's call, then
  // the shared expert's output mixed in where the layer has one.
  void routed_ffn(const TensorView& x, const TensorView& y);
  BlockParts parts_;
  BlockGeometry geo_;
  const frt_op* router_op_ = nullptr;  // the dense op the router's logits run on (routed only)
  // Scratch for one call, grown to the largest rows seen.
  std::vector<float> normed_, qkv_, q_normed_, k_normed_, attended_, projected_, residual_,
      post_normed_, ffn_out_, logits_, route_weight_, shared_out_, shared_logits_;
  std::vector<int64_t> route_index_;
};

// The seat of the pack's module `index` (its position in SeatPlan.replaces, >= 1) at `site`.
// Throws InvalidArgument when `packed` is not a packed seat or index is out of its range.
std::unique_ptr<Seat> member_seat(const Seat& packed, size_t index, const std::string& site);

// The form of the seat built for `plan`: its site, structure, impl, op, activation dtype and band
// (the widths and the weights' description are the builder's).
SeatForm seat_form(const SeatPlan& plan);

// Builds the seat a plan decided on from the host tensors of its slots (operand name -> view,
// "weight"/"bias" for a linear, "gate"/"up"/"down" and the biases for an ffn). Packs the weights
// (read in place, never kept), resolves the plan's package and checks every operand's shape;
// throws Refused naming the operand and its shape when a tensor does not fit the plan.
// `adopted` holds weights a checkpoint already quantised (adopt_prequantized): an operand found
// there is taken as it is (its form must be the plan's) instead of packed from the host tensor.
// A bank (moe_ffn) is adopted per expert: "gate/0".."gate/<E-1>", "up/<e>", "down/<e>", each
// that expert's [out, in] pack; an operand is adopted for every expert or for none, and a key
// outside the bank is refused. The door still hands the bank's host views (its shapes).
// `moments`: operand name -> the input moments a calibrated form rounds it against (the door's
// record of that projection's input); a calibrated operand without them is Refused.
std::unique_ptr<Seat> build_seat(const SeatPlan& plan,
                                 const std::map<std::string, TensorView>& tensors, GuardMode mode,
                                 KernelHub& hub, std::map<std::string, PackedLinear> adopted = {},
                                 const OperandMoments& moments = {});

// Builds the block seat a plan decided on (op block) from the seats built for its parts,
// keyed by the role its plan's seam.nodes gives each site ("input_norm", "post_norm", "ffn" or
// "bank", "attention", "o", "rotary", "qkv" or "q"/"k"/"v", "q_norm"/"k_norm" where the layer has
// them). A routed layer's plan (a "bank" part) also takes `router`, the host's routing weight
// [experts, hidden] in fp32 (copied; its form is plan.seam.router's), and where it has a shared
// expert (a "shared" part), `shared_gate`, its gate's weight [1, hidden] in fp32 (copied). The
// seats must outlive the block (the door holds them). Throws Refused naming a part that is missing
// or of another kind, or whose widths do not chain, or a router weight the plan does not describe.
std::unique_ptr<BlockSeat> build_block_seat(const SeatPlan& plan,
                                            const std::map<std::string, Seat*>& parts,
                                            GuardMode mode, const TensorView* router = nullptr,
                                            const TensorView* shared_gate = nullptr);

}  // namespace frt
