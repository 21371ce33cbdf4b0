#include <flashrt/errors.h>
#include <flashrt/seat.h>

#include <sstream>

#include "runtime/kernel_ops_unchecked.h"

namespace frt {

const char* name_of(GuardMode m) { return m == GuardMode::raise ? "raise" : "fallback"; }

std::optional<GuardMode> parse_guard_mode(std::string_view name) {
  if (name == "fallback") return GuardMode::fallback;
  if (name == "raise") return GuardMode::raise;
  return std::nullopt;
}

std::string SeatForm::describe() const {
  std::ostringstream s;
  s << structure << " " << impl << ": " << dtype_name(dtype) << " [rows " << band_min << "..";
  if (band_max < kUnboundedRows) s << band_max;  // a form band without a max reads "64.."
  s << ", " << width << "] -> [" << out << "], weights " << weights;
  return s.str();
}

Seat::Seat(SeatForm form, const frt_kernel_table& table, GuardMode mode)
    : table_(table), form_(std::move(form)), mode_(mode), owner_(std::this_thread::get_id()) {}

Verdict Seat::admit_rows(int64_t rows) {
  if (rows >= form_.band_min && rows <= form_.band_max) return Verdict::ran;
  std::lock_guard lock(mu_);
  ++ledger_.calls;
  ++ledger_.band_dispatches;
  return Verdict::band;
}

Verdict Seat::miss(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++ledger_.calls;
  ledger_.last_reason = reason;
  if (mode_ == GuardMode::raise) return Verdict::raise;
  ++ledger_.fallbacks;
  ++ledger_.reasons[reason];
  if (++ledger_.consecutive_fallbacks >= kSelfDetachAfter && !ledger_.restored) {
    ledger_.restored = true;
    return Verdict::restore;
  }
  return Verdict::fallback;
}

bool Seat::first_time(const std::string& reason) const {
  std::lock_guard lock(mu_);
  auto it = ledger_.reasons.find(reason);
  return it == ledger_.reasons.end() || it->second <= 1;
}

Verdict Seat::run(const TensorView& x, const TensorView& y, bool training) {
  if (training) return miss("training mode");
  if (std::this_thread::get_id() != owner_) return miss("called from a second thread");
  if (x.dtype != form_.dtype)
    return miss(std::string("input dtype ") + dtype_name(x.dtype) + ", seated for " +
                dtype_name(form_.dtype));
  if (x.rank == 2 && (x.shape[0] < form_.band_min || x.shape[0] > form_.band_max)) {
    std::lock_guard lock(mu_);
    ++ledger_.calls;
    ++ledger_.band_dispatches;
    return Verdict::band;
  }
  if (std::string why = refusal(x, y); !why.empty()) return miss(why);
  execute(x, y);
  std::lock_guard lock(mu_);
  ++ledger_.calls;
  ledger_.consecutive_fallbacks = 0;
  return Verdict::ran;
}

GuardMode Seat::mode() const {
  std::lock_guard lock(mu_);
  return mode_;
}

void Seat::set_mode(GuardMode mode) {
  std::lock_guard lock(mu_);
  mode_ = mode;
}

Ledger Seat::ledger() const {
  std::lock_guard lock(mu_);
  return ledger_;
}

LinearSeat::LinearSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode,
                       PackedLinear weight, std::vector<float> bias)
    : Seat(std::move(form), table, mode), weight_(std::move(weight)), bias_(std::move(bias)) {
  if (!bias_.empty() && static_cast<int64_t>(bias_.size()) != weight_.n())
    throw InvalidArgument("LinearSeat: bias has " + std::to_string(bias_.size()) + " entries for " +
                          std::to_string(weight_.n()) + " outputs");
}

std::string LinearSeat::refusal(const TensorView& x, const TensorView& y) const {
  return linear_refusal(table_, weight_, x, y);
}

// Seat::run has just asked refusal() for these views: the form is checked once per call.
void LinearSeat::execute(const TensorView& x, const TensorView& y) {
  detail::run_linear_unchecked(table_, process_parallel(), weight_,
                               bias_.empty() ? nullptr : bias_.data(), x, y);
}

FfnSeat::FfnSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode,
                 std::optional<PackedLinear> gate, PackedLinear up, PackedLinear down,
                 std::vector<float> up_bias, std::vector<float> down_bias, Activation act)
    : Seat(std::move(form), table, mode),
      gate_(std::move(gate)),
      up_(std::move(up)),
      down_(std::move(down)),
      up_bias_(std::move(up_bias)),
      down_bias_(std::move(down_bias)),
      act_(act) {}

FfnOperands FfnSeat::operands() const {
  FfnOperands f;
  f.gate = gate();
  f.up = &up_;
  f.down = &down_;
  f.up_bias = up_bias_.empty() ? nullptr : up_bias_.data();
  f.down_bias = down_bias_.empty() ? nullptr : down_bias_.data();
  f.act = act_;
  return f;
}

std::string FfnSeat::refusal(const TensorView& x, const TensorView& y) const {
  return ffn_refusal(table_, operands(), x, y);
}

// As LinearSeat::execute: Seat::run checked the form with refusal() just before.
void FfnSeat::execute(const TensorView& x, const TensorView& y) {
  detail::run_ffn_unchecked(table_, process_parallel(), operands(), x, y);
}

namespace {

const TensorView& operand(const std::map<std::string, TensorView>& t, const std::string& name,
                          const SeatPlan& plan) {
  const auto it = t.find(name);
  if (it == t.end())
    throw InvalidArgument("seat " + plan.site + ": no tensor for operand '" + name + "'");
  return it->second;
}

const TensorView* optional_operand(const std::map<std::string, TensorView>& t,
                                   const std::string& name) {
  const auto it = t.find(name);
  return it == t.end() ? nullptr : &it->second;
}

// The operand's packed weight: the adopted one when the checkpoint supplied it, else the host
// tensor packed to the plan's form. n, k > 0 are the shape the other operands imply.
PackedLinear pack(const std::map<std::string, TensorView>& tensors,
                  std::map<std::string, PackedLinear>& adopted, const std::string& name,
                  const SeatPlan& plan, int64_t n, int64_t k) {
  const std::string what = name == "weight" ? plan.site + " weight" : name;
  const WeightForm& form = plan.form;
  if (const auto it = adopted.find(name); it != adopted.end()) {
    PackedLinear w = std::move(it->second);
    adopted.erase(it);
    const bool same = w.format() == form.format && w.group() == form.group &&
                      (w.view().scale_dtype == FRT_F16) == (form.scale_dtype == DType::f16);
    if (!same)
      throw Refused(what + ": adopted as " + w.form() + ", the plan seats " + form.describe());
    if ((n > 0 && w.n() != n) || (k > 0 && w.k() != k))
      throw Refused(what + ": adopted [" + std::to_string(w.n()) + ", " + std::to_string(w.k()) +
                    "], expected [" + std::to_string(n) + ", " + std::to_string(k) + "]");
    return w;
  }
  const TensorView& w = operand(tensors, name, plan);
  if (w.rank != 2 || (n > 0 && w.shape[0] != n) || (k > 0 && w.shape[1] != k))
    throw Refused(what + " " + w.describe() + ": expected a [" + std::to_string(n) + ", " +
                  std::to_string(k) + "] weight");
  switch (form.format) {
    case WeightFormat::int8_channel:
      return PackedLinear::int8(w);
    case WeightFormat::int8_group:
      return PackedLinear::int8(w, form.group, form.scale_dtype);
    case WeightFormat::int8_gemm:
      return PackedLinear::int8_gemm(w, form.group);
    case WeightFormat::int4_gemm:
      return PackedLinear::int4_gemm(w, form.symmetric);
    case WeightFormat::int4_group:
      break;
  }
  return PackedLinear::int4(w, form.group, form.symmetric, form.scale_dtype);
}

// A bias read once into fp32 (it is small, and kernels take fp32 biases).
std::vector<float> bias_values(const TensorView* b, int64_t n, const std::string& what) {
  if (b == nullptr) return {};
  if (b->rank != 1 || b->shape[0] != n)
    throw Refused(what + " " + b->describe() + ": expected [" + std::to_string(n) + "]");
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = b->element(i * b->strides[0]);
  return out;
}

// The operand of `plan.slots` holding `tensor` of `module`, or nullptr.
const TensorView* slot_of(const SeatPlan& plan, const std::map<std::string, TensorView>& tensors,
                          const std::string& module, const std::string& tensor) {
  for (const auto& [name, slot] : plan.slots)
    if (slot.module == module && slot.tensor == tensor) return &operand(tensors, name, plan);
  return nullptr;
}

// A packed linear: the modules' weights stacked along the output in the order of `replaces`
// (per-channel scales, so each row packs as it would alone) and their biases beside them (zeros
// for a module without one, when another has one).
std::unique_ptr<Seat> build_packed(const SeatPlan& plan,
                                   const std::map<std::string, TensorView>& tensors,
                                   const frt_kernel_table& table, GuardMode mode, SeatForm form) {
  if (plan.form.format != WeightFormat::int8_gemm && plan.form.format != WeightFormat::int8_channel)
    throw Refused("seat " + plan.site + ": a packed seat takes per-channel forms, not " +
                  plan.form.describe());
  int64_t n = 0, k = 0;
  bool any_bias = false;
  std::vector<const TensorView*> weights, biases;
  for (const std::string& module : plan.replaces) {
    const TensorView* w = slot_of(plan, tensors, module, "weight");
    if (w == nullptr) throw InvalidArgument("seat " + plan.site + ": no weight for " + module);
    if (w->rank != 2 || (k != 0 && w->shape[1] != k))
      throw Refused(module + " weight " + w->describe() + ": expected [out, " + std::to_string(k) +
                    "] like the other projections of the pack");
    k = w->shape[1];
    const TensorView* b = slot_of(plan, tensors, module, "bias");
    if (b != nullptr && (b->rank != 1 || b->shape[0] != w->shape[0]))
      throw Refused(module + " bias " + b->describe() + ": expected [" +
                    std::to_string(w->shape[0]) + "]");
    any_bias |= b != nullptr;
    weights.push_back(w);
    biases.push_back(b);
    form.splits.push_back(w->shape[0]);
    n += w->shape[0];
  }
  std::vector<float> stacked(static_cast<size_t>(n * k));
  std::vector<float> bias(any_bias ? static_cast<size_t>(n) : 0, 0.0f);
  int64_t row = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const TensorView& w = *weights[i];
    for (int64_t r = 0; r < w.shape[0]; ++r, ++row) {
      for (int64_t c = 0; c < k; ++c)
        stacked[static_cast<size_t>(row * k + c)] = w.element(r * w.strides[0] + c * w.strides[1]);
      if (biases[i] != nullptr)
        bias[static_cast<size_t>(row)] = biases[i]->element(r * biases[i]->strides[0]);
    }
  }
  const TensorView all = TensorView::matrix(stacked.data(), DType::f32, n, k, k);
  PackedLinear packed = plan.form.format == WeightFormat::int8_gemm ? PackedLinear::int8_gemm(all)
                                                                    : PackedLinear::int8(all);
  form.width = k;
  form.out = n;
  form.weights = packed.form();
  return std::make_unique<LinearSeat>(form, table, mode, std::move(packed), std::move(bias));
}

}  // namespace

std::unique_ptr<Seat> member_seat(const Seat& packed, size_t index, const std::string& site) {
  const SeatForm& pf = packed.form();
  if (pf.splits.empty() || index == 0 || index >= pf.splits.size())
    throw InvalidArgument("member_seat: " + pf.site + " has " + std::to_string(pf.splits.size()) +
                          " packed modules; no member " + std::to_string(index));
  SeatForm form = pf;
  form.site = site;
  form.out = pf.splits[index];
  form.splits.clear();
  int64_t from = 0;
  for (size_t i = 0; i < index; ++i) from += pf.splits[i];
  form.weights = "columns " + std::to_string(from) + ".." + std::to_string(from + form.out) +
                 " of the pack at " + pf.site + " (" + pf.weights + ")";
  return std::make_unique<MemberSeat>(form, packed.table(), packed.mode());
}

std::unique_ptr<Seat> build_seat(const SeatPlan& plan,
                                 const std::map<std::string, TensorView>& tensors, GuardMode mode,
                                 KernelHub& hub, std::map<std::string, PackedLinear> adopted) {
  const frt_kernel_table& table = hub.table(plan.package);
  if (!kernel_dtype(plan.act_dtype))
    throw Refused("activation dtype " + std::string(name_of(plan.act_dtype)) +
                  "; seats take f32, bf16");
  SeatForm form;
  form.site = plan.site;
  form.structure = plan.seam.structure;
  form.impl = plan.impl;
  form.op = plan.op;
  form.dtype = plan.act_dtype;
  form.band_min = plan.band_min;
  form.band_max = plan.band_max;
  if (plan.op == OpKind::linear && plan.replaces.size() > 1)
    return build_packed(plan, tensors, table, mode, form);
  if (plan.op == OpKind::linear) {
    PackedLinear w = pack(tensors, adopted, "weight", plan, 0, 0);
    std::vector<float> b = bias_values(optional_operand(tensors, "bias"), w.n(), "bias");
    form.width = w.k();
    form.out = w.n();
    form.weights = w.form();
    return std::make_unique<LinearSeat>(form, table, mode, std::move(w), std::move(b));
  }
  if (plan.op != OpKind::gated_ffn && plan.op != OpKind::ffn)
    throw InvalidArgument("seat " + plan.site + ": op " + name_of(plan.op) + " is not a seat op");
  std::optional<PackedLinear> gate;
  PackedLinear up = pack(tensors, adopted, "up", plan, 0, 0);
  if (plan.op == OpKind::gated_ffn) gate = pack(tensors, adopted, "gate", plan, up.n(), up.k());
  PackedLinear down = pack(tensors, adopted, "down", plan, up.k(), up.n());
  std::vector<float> up_bias = bias_values(optional_operand(tensors, "up_bias"), up.n(), "up bias");
  std::vector<float> down_bias =
      bias_values(optional_operand(tensors, "down_bias"), down.n(), "down bias");
  form.width = up.k();
  form.out = down.n();
  form.weights = up.form();
  return std::make_unique<FfnSeat>(form, table, mode, std::move(gate), std::move(up),
                                   std::move(down), std::move(up_bias), std::move(down_bias),
                                   plan.activation);
}

}  // namespace frt
