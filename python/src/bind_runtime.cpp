#include <flashrt/errors.h>
#include <flashrt/gates.h>
#include <flashrt/hub.h>
#include <flashrt/seat.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "convert.h"

namespace nb = nanobind;

namespace frt::py {
namespace {

GuardMode guard_mode(const std::string& on_guard_fail) {
  if (on_guard_fail == "fallback") return GuardMode::fallback;
  if (on_guard_fail == "raise") return GuardMode::raise;
  throw InvalidArgument("on_guard_fail '" + on_guard_fail + "' not in {fallback, raise}");
}

PackedLinear pack(const TensorView& w, const std::string& format, int group, bool symmetric) {
  if (format == "int8") return PackedLinear::int8(w);
  if (format == "int4") return PackedLinear::int4(w, group, symmetric);
  throw InvalidArgument("weight format '" + format + "' not in {int8, int4}");
}

std::vector<float> bias_values(nb::handle bias, int64_t n) {
  if (bias.is_none()) return {};
  const TensorView b = view_of(bias, "bias");
  if (b.rank != 1 || b.shape[0] != n)
    throw Refused("bias " + b.describe() + ": expected [" + std::to_string(n) + "]");
  std::vector<float> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = b.element(i * b.strides[0]);
  return out;
}

DType dtype_named(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  throw Refused("activation dtype " + name + "; seats take f32, bf16");
}

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::enum_<Verdict>(m, "Verdict")
      .value("ran", Verdict::ran)
      .value("band", Verdict::band)
      .value("fallback", Verdict::fallback)
      .value("restore", Verdict::restore)
      .value("raise_", Verdict::raise);
  m.attr("SELF_DETACH_AFTER") = kSelfDetachAfter;

  nb::class_<SeatForm>(m, "SeatForm")
      .def_ro("site", &SeatForm::site)
      .def_ro("structure", &SeatForm::structure)
      .def_ro("impl", &SeatForm::impl)
      .def_prop_ro("dtype", [](const SeatForm& f) { return std::string(dtype_name(f.dtype)); })
      .def_ro("width", &SeatForm::width)
      .def_ro("out", &SeatForm::out)
      .def_ro("band_min", &SeatForm::band_min)
      .def_ro("band_max", &SeatForm::band_max)
      .def_ro("weights", &SeatForm::weights)
      .def("describe", &SeatForm::describe);

  nb::class_<Ledger>(m, "Ledger")
      .def_ro("calls", &Ledger::calls)
      .def_ro("fallbacks", &Ledger::fallbacks)
      .def_ro("band_dispatches", &Ledger::band_dispatches)
      .def_ro("consecutive_fallbacks", &Ledger::consecutive_fallbacks)
      .def_ro("last_reason", &Ledger::last_reason)
      .def_ro("reasons", &Ledger::reasons)
      .def_ro("restored", &Ledger::restored);

  // The hot path: one call checks the form and runs the kernel, returning the verdict as an int
  // so the door's forward pays no exception or enum conversion on a hit.
  nb::class_<Seat>(m, "Seat")
      .def("admit_rows", [](Seat& s, int64_t rows) { return static_cast<int>(s.admit_rows(rows)); })
      .def("run",
           [](Seat& s, nb::handle x, nb::handle y, bool training) {
             const TensorView xv = view_of(x, "input"), yv = view_of(y, "output");
             nb::gil_scoped_release release;
             return static_cast<int>(s.run(xv, yv, training));
           })
      .def("miss", [](Seat& s, const std::string& why) { return static_cast<int>(s.miss(why)); })
      .def("first_time", &Seat::first_time)
      .def_prop_ro("form", &Seat::form)
      .def_prop_ro("ledger", &Seat::ledger)
      .def_prop_ro("nbytes", &Seat::nbytes)
      .def_prop_rw(
          "mode",
          [](const Seat& s) {
            return std::string(s.mode() == GuardMode::raise ? "raise" : "fallback");
          },
          [](Seat& s, const std::string& m) { s.set_mode(guard_mode(m)); });

  nb::class_<LinearSeat, Seat>(m, "LinearSeat")
      .def_prop_ro("pack_rel_err", [](const LinearSeat& s) { return s.weight().stats().rel_err; });
  nb::class_<FfnSeat, Seat>(m, "FfnSeat");

  // Bind-time: pack the host's weights (read in place, never kept) and build the seat.
  m.def(
      "make_linear_seat",
      [](const std::string& site, const std::string& structure, const std::string& impl,
         const std::string& package, nb::handle weight, nb::handle bias, const std::string& dtype,
         const std::string& format, int group, bool symmetric, int64_t band_min, int64_t band_max,
         const std::string& on_guard_fail) {
        const frt_kernel_table& table = process_hub().table(package);
        const TensorView w = view_of(weight, "weight");
        std::vector<float> b = bias_values(bias, w.shape[0]);
        const GuardMode mode = guard_mode(on_guard_fail);
        nb::gil_scoped_release release;
        PackedLinear packed = pack(w, format, group, symmetric);
        SeatForm form{site,       structure, impl,     dtype_named(dtype), packed.k(),
                      packed.n(), band_min,  band_max, packed.form()};
        return std::make_unique<LinearSeat>(form, table, mode, std::move(packed), std::move(b));
      },
      nb::arg("site"), nb::arg("structure"), nb::arg("impl"), nb::arg("package"), nb::arg("weight"),
      nb::arg("bias").none(), nb::arg("dtype"), nb::arg("format"), nb::arg("group"),
      nb::arg("symmetric"), nb::arg("band_min"), nb::arg("band_max"), nb::arg("on_guard_fail"));

  m.def(
      "make_ffn_seat",
      [](const std::string& site, const std::string& impl, const std::string& package,
         nb::handle gate, nb::handle up, nb::handle down, const std::string& act,
         const std::string& dtype, const std::string& format, int group, bool symmetric,
         int64_t band_min, int64_t band_max, const std::string& on_guard_fail) {
        const frt_kernel_table& table = process_hub().table(package);
        const TensorView g = view_of(gate, "gate"), u = view_of(up, "up"),
                         d = view_of(down, "down");
        Activation a;
        if (act == "silu")
          a = Activation::silu;
        else if (act == "gelu_tanh")
          a = Activation::gelu_tanh;
        else
          throw InvalidArgument("activation '" + act + "' not in {silu, gelu_tanh}");
        const GuardMode mode = guard_mode(on_guard_fail);
        nb::gil_scoped_release release;
        PackedLinear pg = pack(g, format, group, symmetric), pu = pack(u, format, group, symmetric),
                     pd = pack(d, format, group, symmetric);
        SeatForm form{site,   "decoder_ffn", impl,     dtype_named(dtype), pg.k(),
                      pd.n(), band_min,      band_max, pg.form()};
        return std::make_unique<FfnSeat>(form, table, mode, std::move(pg), std::move(pu),
                                         std::move(pd), a);
      },
      nb::arg("site"), nb::arg("impl"), nb::arg("package"), nb::arg("gate"), nb::arg("up"),
      nb::arg("down"), nb::arg("act"), nb::arg("dtype"), nb::arg("format"), nb::arg("group"),
      nb::arg("symmetric"), nb::arg("band_min"), nb::arg("band_max"), nb::arg("on_guard_fail"));
}

void bind_gates(nb::module_& m) {
  nb::class_<ValueMetrics>(m, "ValueMetrics")
      .def_ro("cosine", &ValueMetrics::cosine)
      .def_ro("max_abs", &ValueMetrics::max_abs)
      .def_ro("elements", &ValueMetrics::elements);
  nb::class_<DistributionMetrics>(m, "DistributionMetrics")
      .def_ro("top1_agreement", &DistributionMetrics::top1_agreement)
      .def_ro("last_position_cosine", &DistributionMetrics::last_position_cosine)
      .def_ro("max_abs", &DistributionMetrics::max_abs)
      .def_ro("positions", &DistributionMetrics::positions);
  nb::class_<LatencyVerdict>(m, "LatencyVerdict")
      .def_ro("median_ratio", &LatencyVerdict::median_ratio)
      .def_ro("ratios", &LatencyVerdict::ratios)
      .def_ro("activates", &LatencyVerdict::activates);
  m.def("value_metrics", [](nb::handle got, nb::handle want) {
    return value_metrics(view_of(got, "got"), view_of(want, "want"));
  });
  m.def("distribution_metrics", [](nb::handle got, nb::handle want) {
    return distribution_metrics(view_of(got, "got"), view_of(want, "want"));
  });
  m.def("value_band", [](double c) { return std::string(band_name(value_band(c))); });
  m.def("distribution_band", [](double t) { return std::string(band_name(distribution_band(t))); });
  m.def("latency_verdict", &latency_verdict, nb::arg("host_seconds"), nb::arg("arm_seconds"),
        nb::arg("min_speedup"));
  m.def("floors_shortfall", &floors_shortfall, nb::arg("metrics"), nb::arg("floors"));
}

}  // namespace frt::py
