#include <flashrt/errors.h>
#include <flashrt/seat.h>

#include <sstream>

namespace frt {

std::string SeatForm::describe() const {
  std::ostringstream s;
  s << structure << " " << impl << ": " << dtype_name(dtype) << " [rows " << band_min << ".."
    << band_max << ", " << width << "] -> [" << out << "], weights " << weights;
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

void LinearSeat::execute(const TensorView& x, const TensorView& y) {
  run_linear(table_, process_parallel(), weight_, bias_.empty() ? nullptr : bias_.data(), x, y);
}

FfnSeat::FfnSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode, PackedLinear gate,
                 PackedLinear up, PackedLinear down, Activation act)
    : Seat(std::move(form), table, mode),
      gate_(std::move(gate)),
      up_(std::move(up)),
      down_(std::move(down)),
      act_(act) {}

std::string FfnSeat::refusal(const TensorView& x, const TensorView& y) const {
  return ffn_refusal(table_, gate_, up_, down_, act_, x, y);
}

void FfnSeat::execute(const TensorView& x, const TensorView& y) {
  run_ffn(table_, process_parallel(), gate_, up_, down_, act_, x, y);
}

}  // namespace frt
