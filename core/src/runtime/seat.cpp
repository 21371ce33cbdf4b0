#include <flashrt/errors.h>
#include <flashrt/seat.h>

#include <map>
#include <sstream>
#include <string>

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

void Seat::retire(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++ledger_.calls;
  ++ledger_.fallbacks;
  ++ledger_.reasons[reason];
  ledger_.last_reason = reason;
  ledger_.restored = true;
}

bool Seat::first_time(const std::string& reason) const {
  std::lock_guard lock(mu_);
  auto it = ledger_.reasons.find(reason);
  return it == ledger_.reasons.end() || it->second <= 1;
}

Verdict Seat::run(const TensorView& x, const TensorView& y, bool training, const Routing* routing) {
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
  if (std::string why = refusal(x, y, routing); !why.empty()) return miss(why);
  execute(x, y, routing);
  std::lock_guard lock(mu_);
  ++ledger_.calls;
  ledger_.consecutive_fallbacks = 0;
  return Verdict::ran;
}

std::string Seat::probe(const TensorView& x, const TensorView& y) {
  if (x.dtype != form_.dtype)
    return std::string("input dtype ") + dtype_name(x.dtype) + ", seated for " +
           dtype_name(form_.dtype);
  if (x.rank != 2 || x.shape[0] < form_.band_min || x.shape[0] > form_.band_max)
    return "rows " + x.describe() + " outside the band " + std::to_string(form_.band_min) + ".." +
           std::to_string(form_.band_max);
  if (std::string why = refusal(x, y, nullptr); !why.empty()) return why;
  execute(x, y, nullptr);
  return "";
}

Verdict Seat::run_call(bool training, DType dtype, const std::function<std::string()>& refusal,
                       const std::function<void()>& execute) {
  if (training) return miss("training mode");
  if (std::this_thread::get_id() != owner_) return miss("called from a second thread");
  if (dtype != form_.dtype)
    return miss(std::string("input dtype ") + dtype_name(dtype) + ", seated for " +
                dtype_name(form_.dtype));
  if (std::string why = refusal(); !why.empty()) return miss(why);
  execute();
  std::lock_guard lock(mu_);
  ++ledger_.calls;
  ledger_.consecutive_fallbacks = 0;
  return Verdict::ran;
}

void Seat::count_band() {
  std::lock_guard lock(mu_);
  ++ledger_.calls;
  ++ledger_.band_dispatches;
}

void Seat::count_ran() {
  std::lock_guard lock(mu_);
  ++ledger_.calls;
  ledger_.consecutive_fallbacks = 0;
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

std::string LinearSeat::refusal(const TensorView& x, const TensorView& y,
                                const Routing* routing) const {
  if (routing != nullptr) return "a projection takes no routing";
  return linear_refusal(table_, weight_, x, y);
}

// Seat::run has just asked refusal() for these views: the form is checked once per call.
void LinearSeat::execute(const TensorView& x, const TensorView& y, const Routing*) {
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

std::string FfnSeat::refusal(const TensorView& x, const TensorView& y,
                             const Routing* routing) const {
  if (routing != nullptr) return "a feed-forward takes no routing";
  return ffn_refusal(table_, operands(), x, y);
}

// As LinearSeat::execute: Seat::run checked the form with refusal() just before.
void FfnSeat::execute(const TensorView& x, const TensorView& y, const Routing*) {
  detail::run_ffn_unchecked(table_, process_parallel(), operands(), x, y);
}

std::string MoeSeat::refusal(const TensorView& x, const TensorView& y,
                             const Routing* routing) const {
  if (routing == nullptr) return "a bank of experts needs the router's choice (index, weights)";
  return moe_refusal(table_, bank_, x, *routing, y);
}

void MoeSeat::execute(const TensorView& x, const TensorView& y, const Routing* routing) {
  detail::run_moe_unchecked(table_, process_parallel(), bank_, x, *routing, y);
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
// tensor packed to the plan's form (a calibrated form against `moments`' entry for the
// operand). n, k > 0 are the shape the other operands imply.
PackedLinear pack(const std::map<std::string, TensorView>& tensors,
                  std::map<std::string, PackedLinear>& adopted, const std::string& name,
                  const SeatPlan& plan, int64_t n, int64_t k, const OperandMoments& moments) {
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
  const InputMoments* m = nullptr;
  if (form.calibrated) {
    const auto it = moments.find(name);
    if (it == moments.end() || it->second == nullptr)
      throw Refused(what + ": " + form.describe() + " is rounded against its input's moments; " +
                    "none were handed for operand '" + name + "'");
    m = it->second;
  }
  switch (form.format) {
    case WeightFormat::int8_channel:
      return PackedLinear::int8(w);
    case WeightFormat::int8_group:
      return PackedLinear::int8(w, form.group, form.scale_dtype);
    case WeightFormat::int8_gemm:
      return PackedLinear::int8_gemm(w, form.group);
    case WeightFormat::int4_gemm:
      return PackedLinear::int4_gemm(w, form.symmetric, m);
    case WeightFormat::int4_super:
      return PackedLinear::int4_super(w);
    case WeightFormat::int8_super:
      return PackedLinear::int8_super(w);
    case WeightFormat::int4_super_gemm:
      return PackedLinear::int4_super_gemm(w);
    case WeightFormat::int6_super_gemm:
      return PackedLinear::int6_super_gemm(w);
    case WeightFormat::int5_gemm:
    case WeightFormat::int5_super_gemm:
      throw Refused(what + ": " + form.describe() +
                    " holds a checkpoint's own values; no host weight is packed in it");
    case WeightFormat::int4_group:
      break;
  }
  return PackedLinear::int4(w, form.group, form.symmetric, form.scale_dtype, m);
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

// Expert e's [out, in] matrix of a bank view [experts, out, in] (inner dimension contiguous).
TensorView expert_matrix(const TensorView& bank, int64_t e) {
  const int64_t bytes = bank.dtype == DType::bf16 ? 2 : 4;
  auto* base = static_cast<char*>(bank.data) + e * bank.strides[0] * bytes;
  TensorView m =
      TensorView::matrix(base, bank.dtype, bank.shape[1], bank.shape[2], bank.strides[1]);
  m.strides[1] = bank.strides[2];
  return m;
}

// The adopted packs of a bank (keys "<operand>/<expert>"): every key names an operand and an
// expert of the bank, and each operand is adopted for all of its experts or for none.
void check_bank_keys(const SeatPlan& plan, const std::map<std::string, PackedLinear>& adopted,
                     int64_t experts) {
  std::map<std::string, int64_t> count;
  for (const auto& [key, _] : adopted) {
    const size_t slash = key.find('/');
    const std::string operand = key.substr(0, slash);
    const std::string index = slash == std::string::npos ? "" : key.substr(slash + 1);
    const bool numeric = !index.empty() && index.size() < 10 &&
                         index.find_first_not_of("0123456789") == std::string::npos;
    if ((operand != "gate" && operand != "up" && operand != "down") || !numeric ||
        std::stoll(index) >= experts)
      throw Refused("bank " + plan.site + ": adopted '" + key + "' names no operand of its " +
                    std::to_string(experts) + " experts (gate/<e>, up/<e>, down/<e>)");
    ++count[operand];
  }
  for (const auto& [operand, n] : count)
    if (n != experts)
      throw Refused("bank " + plan.site + ": " + std::to_string(n) + " of its " +
                    std::to_string(experts) + " experts' " + operand +
                    " adopted; an operand is adopted for every expert or none");
}

// A bank of experts: each expert's gate, up and down, adopted ("gate/<e>" in `adopted`) or packed
// to the plan's form. The door hands the banks as [experts, out, in] views (gate and up as the
// halves of a fused tensor).
std::unique_ptr<Seat> build_bank(const SeatPlan& plan,
                                 const std::map<std::string, TensorView>& tensors,
                                 std::map<std::string, PackedLinear>& adopted,
                                 const frt_kernel_table& table, GuardMode mode, SeatForm form) {
  const TensorView& g = operand(tensors, "gate", plan);
  const TensorView& u = operand(tensors, "up", plan);
  const TensorView& d = operand(tensors, "down", plan);
  const int64_t experts = g.shape[0], inner = g.shape[1], hidden = g.shape[2];
  const auto expect = [&](const char* what, const TensorView& t, int64_t out, int64_t in) {
    if (t.rank != 3 || t.shape[0] != experts || t.shape[1] != out || t.shape[2] != in ||
        (t.dtype != DType::f32 && t.dtype != DType::bf16))
      throw Refused(std::string("bank ") + what + " " + t.describe() +
                    ": expected an f32 or bf16 [" + std::to_string(experts) + ", " +
                    std::to_string(out) + ", " + std::to_string(in) + "] bank");
  };
  expect("gate", g, inner, hidden);
  expect("up", u, inner, hidden);
  expect("down", d, hidden, inner);
  check_bank_keys(plan, adopted, experts);
  std::vector<PackedLinear> gates, ups, downs;
  for (int64_t e = 0; e < experts; ++e) {
    const std::string i = "/" + std::to_string(e);
    std::map<std::string, TensorView> one = {{"gate" + i, expert_matrix(g, e)},
                                             {"up" + i, expert_matrix(u, e)},
                                             {"down" + i, expert_matrix(d, e)}};
    // Each expert reads only its own rows: no bank-wide moments stand for them.
    gates.push_back(pack(one, adopted, "gate" + i, plan, inner, hidden, {}));
    ups.push_back(pack(one, adopted, "up" + i, plan, inner, hidden, {}));
    downs.push_back(pack(one, adopted, "down" + i, plan, hidden, inner, {}));
  }
  ExpertBank bank(std::move(gates), std::move(ups), std::move(downs), plan.activation);
  form.width = form.out = hidden;
  form.weights = std::to_string(experts) + " experts, " + bank.form();
  return std::make_unique<MoeSeat>(form, table, mode, std::move(bank));
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

SeatForm seat_form(const SeatPlan& plan) {
  SeatForm form;
  form.site = plan.site;
  form.structure = plan.seam.structure;
  form.impl = plan.impl;
  form.op = plan.op;
  form.dtype = plan.act_dtype;
  form.band_min = plan.band_min;
  form.band_max = plan.band_max;
  return form;
}

std::unique_ptr<Seat> build_seat(const SeatPlan& plan,
                                 const std::map<std::string, TensorView>& tensors, GuardMode mode,
                                 KernelHub& hub, std::map<std::string, PackedLinear> adopted,
                                 const OperandMoments& moments) {
  if (plan.op == OpKind::block)
    throw InvalidArgument(plan.site +
                          ": a decoder block is built from its parts' seats (build_block_seat)");
  const frt_kernel_table& table = hub.table(plan.package);
  if (!kernel_dtype(plan.act_dtype))
    throw Refused("activation dtype " + std::string(name_of(plan.act_dtype)) +
                  "; seats take f32, bf16");
  SeatForm form = seat_form(plan);
  if (plan.op == OpKind::linear && plan.replaces.size() > 1)
    return build_packed(plan, tensors, table, mode, form);
  if (plan.op == OpKind::linear) {
    PackedLinear w = pack(tensors, adopted, "weight", plan, 0, 0, moments);
    std::vector<float> b = bias_values(optional_operand(tensors, "bias"), w.n(), "bias");
    form.width = w.k();
    form.out = w.n();
    form.weights = w.form();
    return std::make_unique<LinearSeat>(form, table, mode, std::move(w), std::move(b));
  }
  if (plan.op == OpKind::moe_ffn) return build_bank(plan, tensors, adopted, table, mode, form);
  if (plan.op == OpKind::rmsnorm) {
    // A norm's weight is copied as fp32 (1 + w for the rms_one_plus form), never packed.
    const TensorView& w = operand(tensors, "weight", plan);
    const int64_t width = plan.seam.dims.count("width") ? plan.seam.dims.at("width") : 0;
    if (w.rank != 1 || w.shape[0] != width)
      throw Refused(plan.site + " weight " + w.describe() + ": expected [" + std::to_string(width) +
                    "]");
    const NormForm nf = plan.seam.norm.form;
    if (nf != NormForm::rms && nf != NormForm::rms_one_plus)
      throw Refused(plan.site + ": norm form " + std::string(name_of(nf)) +
                    "; the op computes rms and rms_one_plus");
    std::vector<float> weight = bias_values(&w, width, plan.site + " weight");
    if (nf == NormForm::rms_one_plus)
      for (float& v : weight) v += 1.0f;
    form.width = form.out = width;
    form.weights = plan.form.describe();
    return std::make_unique<NormSeat>(form, table, mode, std::move(weight),
                                      static_cast<float>(plan.seam.norm.eps));
  }
  if (function_op(plan.op)) {
    // A function seat reads its operands from each call; it packs nothing.
    const auto dim = [&](const char* name) {
      const auto it = plan.seam.dims.find(name);
      if (it == plan.seam.dims.end())
        throw InvalidArgument("seat " + plan.site + ": the plan binds no dim " + name);
      return it->second;
    };
    form.weights = plan.form.describe();
    if (plan.op == OpKind::attention || plan.op == OpKind::paged_attention ||
        plan.op == OpKind::sequence_attention) {
      form.width = dim("heads") * dim("head_dim");
      form.out = form.width;
      if (plan.op == OpKind::attention && plan.seam.attention.softcap > 0 &&
          find_op(table, OpKind::capped_attention) == nullptr)
        throw Refused(plan.site + ": softcapped scores; " + plan.package +
                      " owns no capped_attention op");
      return std::make_unique<AttentionSeat>(form, table, mode, dim("heads"), dim("kv_heads"),
                                             dim("head_dim"));
    }
    if (plan.op == OpKind::rotary) {
      form.width = form.out = dim("heads") * dim("head_dim");
      return std::make_unique<RotarySeat>(form, table, mode, dim("heads"), dim("kv_heads"),
                                          dim("head_dim"));
    }
    if (plan.op == OpKind::gated_delta) {
      form.width = dim("k_heads") * dim("k_dim");
      form.out = dim("v_heads") * dim("v_dim");
      return std::make_unique<GatedDeltaSeat>(form, table, mode, plan.seam.dims);
    }
    form.width = form.out = dim("channels");
    return std::make_unique<ConvSeat>(form, table, mode, dim("channels"), dim("taps"));
  }
  if (plan.op != OpKind::gated_ffn && plan.op != OpKind::ffn)
    throw InvalidArgument("seat " + plan.site + ": op " + name_of(plan.op) + " is not a seat op");
  std::optional<PackedLinear> gate;
  PackedLinear up = pack(tensors, adopted, "up", plan, 0, 0, moments);
  if (plan.op == OpKind::gated_ffn)
    gate = pack(tensors, adopted, "gate", plan, up.n(), up.k(), moments);
  PackedLinear down = pack(tensors, adopted, "down", plan, up.k(), up.n(), moments);
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
