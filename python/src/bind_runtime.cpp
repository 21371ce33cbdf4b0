#include <flashrt/catalog.h>
#include <flashrt/errors.h>
#include <flashrt/gates.h>
#include <flashrt/hub.h>
#include <flashrt/plan.h>
#include <flashrt/seat.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "convert.h"

namespace nb = nanobind;

namespace frt::py {
namespace {

// The door's on_guard_fail, parsed once where it enters (swap.attach).
GuardMode guard_mode(const std::string& on_guard_fail) {
  if (const std::optional<GuardMode> m = parse_guard_mode(on_guard_fail)) return *m;
  throw InvalidArgument("on_guard_fail '" + on_guard_fail + "' not in {'fallback', 'raise'}");
}

// `t` as a matrix [rows, last dim] when its leading dims step by whole rows of each other (rank
// 1 is one row); any other layout is left as it is, for the seat's own check to name.
TensorView as_rows(const TensorView& t) {
  if (t.rank == 2 || t.rank < 1) return t;
  const int last = t.rank - 1;
  int64_t rows = 1, row_stride = 0, outer = 0;  // outer: the stride the next outer dim must have
  bool found = false;                           // a leading dim of more than one row seen
  for (int i = last - 1; i >= 0; --i) {
    if (t.shape[i] == 1) continue;
    if (t.strides[i] <= 0 || (found && t.strides[i] != outer)) return t;  // not rows apart
    if (!found) row_stride = t.strides[i];
    found = true;
    outer = t.strides[i] * t.shape[i];
    rows *= t.shape[i];
  }
  TensorView m = t;
  m.rank = 2;
  m.shape = {rows, t.shape[last], 0, 0};
  m.strides = {found ? row_stride : t.shape[last] * t.strides[last], t.strides[last], 0, 0};
  return m;
}

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::enum_<GuardMode>(m, "GuardMode")
      .value("fallback", GuardMode::fallback)
      .value("raise_", GuardMode::raise);
  m.def("guard_mode", &guard_mode, nb::arg("on_guard_fail"));
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
      .def_ro("op", &SeatForm::op)
      .def_ro("dtype", &SeatForm::dtype)
      .def_ro("width", &SeatForm::width)
      .def_ro("out", &SeatForm::out)
      .def_ro("band_min", &SeatForm::band_min)
      .def_ro("band_max", &SeatForm::band_max)
      .def_ro("weights", &SeatForm::weights)
      .def_ro("splits", &SeatForm::splits)
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
      .def("count_band", &Seat::count_band)
      // x and y of any rank whose leading dims are one run of rows ([batch, tokens, width]
      // contiguous) are read as rows: the door hands its tensors without viewing them first.
      .def("run",
           [](Seat& s, nb::handle x, nb::handle y, bool training) {
             const TensorView xv = as_rows(view_of(x, "input")), yv = as_rows(view_of(y, "output"));
             nb::gil_scoped_release release;
             return static_cast<int>(s.run(xv, yv, training));
           })
      .def("probe",
           [](Seat& s, nb::handle x, nb::handle y) {
             const TensorView xv = as_rows(view_of(x, "input")), yv = as_rows(view_of(y, "output"));
             nb::gil_scoped_release release;
             return s.probe(xv, yv);
           })
      // A bank of experts' call: the router's choice beside x (index int64, weights f32/bf16).
      .def("run_routed",
           [](Seat& s, nb::handle x, nb::handle index, nb::handle weights, nb::handle y,
              bool training) {
             const TensorView xv = view_of(x, "input"), yv = view_of(y, "output");
             const Routing r{index_view_of(index, "routing index"),
                             view_of(weights, "routing weights")};
             nb::gil_scoped_release release;
             return static_cast<int>(s.run(xv, yv, training, &r));
           })
      .def("miss", [](Seat& s, const std::string& why) { return static_cast<int>(s.miss(why)); })
      .def("retire", &Seat::retire, nb::arg("reason"))
      .def("first_time", &Seat::first_time)
      .def_prop_ro("form", &Seat::form)
      .def_prop_ro("ledger", &Seat::ledger)
      .def_prop_ro("nbytes", &Seat::nbytes)
      .def_prop_rw("mode", &Seat::mode, &Seat::set_mode);

  nb::class_<LinearSeat, Seat>(m, "LinearSeat")
      .def_prop_ro("pack_rel_err", [](const LinearSeat& s) { return s.weight().stats().rel_err; });
  nb::class_<MemberSeat, Seat>(m, "MemberSeat");
  nb::class_<FfnSeat, Seat>(m, "FfnSeat")
      .def_prop_ro("gated", [](const FfnSeat& s) { return s.gate() != nullptr; })
      .def_prop_ro("activation", &FfnSeat::activation);

  // Function seats: a call's operands as the host's function received them; a tensor the
  // binding cannot view (another dtype, another device) is a counted miss, not an exception.
  nb::class_<GatedDeltaSeat, Seat>(m, "GatedDeltaSeat")
      .def(
          "call",
          [](GatedDeltaSeat& s, nb::handle q, nb::handle k, nb::handle v, nb::handle g,
             nb::handle beta, nb::handle initial_state, nb::handle out, nb::handle final_state,
             bool l2norm, float scale, bool training) {
            GatedDeltaCall c;
            try {
              c.q = view_of(q, "q");
              c.k = view_of(k, "k");
              c.v = view_of(v, "v");
              c.g = view_of(g, "g");
              c.beta = view_of(beta, "beta");
              if (!initial_state.is_none()) c.initial_state = view_of(initial_state, "state");
              c.out = view_of(out, "out");
              c.final_state = view_of(final_state, "final state");
            } catch (const Refused& e) {
              return static_cast<int>(s.miss(e.what()));
            }
            c.l2norm = l2norm;
            c.scale = scale;
            nb::gil_scoped_release release;
            return static_cast<int>(s.call(c, training));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("g"), nb::arg("beta"),
          nb::arg("initial_state").none(), nb::arg("out"), nb::arg("final_state"),
          nb::arg("l2norm"), nb::arg("scale"), nb::arg("training"));
  nb::class_<ConvSeat, Seat>(m, "ConvSeat")
      .def(
          "call",
          [](ConvSeat& s, nb::handle x, nb::handle weight, nb::handle bias, nb::handle state,
             nb::handle y, std::optional<Activation> act, bool training) {
            ConvCall c;
            try {
              c.x = view_of(x, "x");
              c.weight = view_of(weight, "weight");
              if (!bias.is_none()) c.bias = view_of(bias, "bias");
              if (!state.is_none()) c.state = view_of(state, "state");
              c.y = view_of(y, "y");
            } catch (const Refused& e) {
              return static_cast<int>(s.miss(e.what()));
            }
            c.activated = act.has_value();
            c.activation = act.value_or(Activation::silu);
            nb::gil_scoped_release release;
            return static_cast<int>(s.call(c, training));
          },
          nb::arg("x"), nb::arg("weight"), nb::arg("bias").none(), nb::arg("state").none(),
          nb::arg("y"), nb::arg("activation").none(), nb::arg("training"));

  nb::class_<AttentionSeat, Seat>(m, "AttentionSeat")
      .def(
          "call",
          [](AttentionSeat& s, nb::handle q, nb::handle k, nb::handle v, nb::handle mask,
             nb::handle out, float scale, float softcap, bool training) {
            AttentionCall c;
            try {
              c.q = view_of(q, "q");
              c.k = view_of(k, "k");
              c.v = view_of(v, "v");
              if (!mask.is_none()) c.mask = mask_view_of(mask, "mask");
              c.out = view_of(out, "out");
            } catch (const Refused& e) {
              return static_cast<int>(s.miss(e.what()));
            }
            c.scale = scale;
            c.softcap = softcap;
            nb::gil_scoped_release release;
            return static_cast<int>(s.call(c, training));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask").none(), nb::arg("out"),
          nb::arg("scale"), nb::arg("softcap"), nb::arg("training"))
      .def(
          "call_paged",
          [](AttentionSeat& s, nb::handle q, nb::handle k_pool, nb::handle v_pool, nb::handle table,
             nb::handle rows, nb::handle lengths, nb::handle out, float scale, float softcap,
             bool training) {
            PagedAttentionCall c;
            try {
              c.q = view_of(q, "q");
              c.k_pool = view_of(k_pool, "k_pool");
              c.v_pool = view_of(v_pool, "v_pool");
              c.table = index_view_of(table, "table");
              c.rows = index_view_of(rows, "rows");
              c.lengths = index_view_of(lengths, "lengths");
              c.out = view_of(out, "out");
            } catch (const Refused& e) {
              return static_cast<int>(s.miss(e.what()));
            }
            c.scale = scale;
            c.softcap = softcap;
            nb::gil_scoped_release release;
            return static_cast<int>(s.call_paged(c, training));
          },
          nb::arg("q"), nb::arg("k_pool"), nb::arg("v_pool"), nb::arg("table"), nb::arg("rows"),
          nb::arg("lengths"), nb::arg("out"), nb::arg("scale"), nb::arg("softcap"),
          nb::arg("training"))
      .def(
          "call_sequence",
          [](AttentionSeat& s, nb::handle q, nb::handle k, nb::handle v, nb::handle mask,
             nb::handle out, float scale, bool training) {
            SequenceAttention c;
            std::optional<TensorView> m;
            try {
              c.q = view_of(q, "q");
              c.k = view_of(k, "k");
              c.v = view_of(v, "v");
              if (!mask.is_none()) m = mask_view_of(mask, "attn_mask");
              c.out = view_of(out, "out");
            } catch (const Refused& e) {
              return static_cast<int>(s.miss(e.what()));
            }
            c.scale = scale;
            nb::gil_scoped_release release;
            return static_cast<int>(s.call_sequence(c, m, training));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask").none(), nb::arg("out"),
          nb::arg("scale"), nb::arg("training"));

  nb::class_<RotarySeat, Seat>(m, "RotarySeat")
      .def(
          "call",
          [](RotarySeat& s, nb::handle q, nb::handle k, nb::handle cos, nb::handle sin,
             nb::handle q_out, nb::handle k_out, bool training) {
            RotaryCall c;
            try {
              c.q = view_of(q, "q");
              c.k = view_of(k, "k");
              c.cos = view_of(cos, "cos");
              c.sin = view_of(sin, "sin");
              c.q_out = view_of(q_out, "q_out");
              c.k_out = view_of(k_out, "k_out");
            } catch (const Refused& e) {
              return static_cast<int>(s.miss(e.what()));
            }
            nb::gil_scoped_release release;
            return static_cast<int>(s.call(c, training));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("cos"), nb::arg("sin"), nb::arg("q_out"),
          nb::arg("k_out"), nb::arg("training"));

  nb::class_<BlockSeat, Seat>(m, "BlockSeat")
      .def(
          "head",
          [](BlockSeat& s, nb::handle x, nb::handle cos, nb::handle sin, nb::handle q, nb::handle k,
             nb::handle v, bool training) {
            TensorView xv, cv, sv, qv, kv, vv;
            try {
              xv = as_rows(view_of(x, "x"));
              cv = view_of(cos, "cos");
              sv = view_of(sin, "sin");
              qv = view_of(q, "q");
              kv = view_of(k, "k");
              vv = view_of(v, "v");
            } catch (const Refused& e) {
              return static_cast<int>(s.miss(e.what()));
            }
            nb::gil_scoped_release release;
            return static_cast<int>(s.head(xv, cv, sv, qv, kv, vv, training));
          },
          nb::arg("x"), nb::arg("cos"), nb::arg("sin"), nb::arg("q"), nb::arg("k"), nb::arg("v"),
          nb::arg("training"))
      .def(
          "tail",
          [](BlockSeat& s, nb::handle x, nb::handle q, nb::handle k, nb::handle v, nb::handle mask,
             nb::handle y, bool training) {
            TensorView xv, qv, kv, vv, yv;
            std::optional<TensorView> mv;
            try {
              xv = as_rows(view_of(x, "x"));
              qv = view_of(q, "q");
              kv = view_of(k, "k");
              vv = view_of(v, "v");
              if (!mask.is_none()) mv = mask_view_of(mask, "mask");
              yv = as_rows(view_of(y, "y"));
            } catch (const Refused& e) {
              return static_cast<int>(s.miss(e.what()));
            }
            nb::gil_scoped_release release;
            return static_cast<int>(s.tail(xv, qv, kv, vv, mv, yv, training));
          },
          nb::arg("x"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask").none(),
          nb::arg("y"), nb::arg("training"))
      .def_static("judge", &BlockSeat::judge, nb::arg("cosines"), nb::arg("pass_"));
  m.def(
      "build_block_seat",
      [](const SeatPlan& plan, const std::map<std::string, Seat*>& parts, GuardMode mode,
         nb::handle router, nb::handle shared_gate) {
        std::optional<TensorView> rv, gv;
        if (!router.is_none()) rv = view_of(router, "router");
        if (!shared_gate.is_none()) gv = view_of(shared_gate, "shared_gate");
        // The router and the shared expert's gate are copied.
        return build_block_seat(plan, parts, mode, rv ? &*rv : nullptr, gv ? &*gv : nullptr);
      },
      // The block holds its parts' seats by pointer: the dict of them lives as long as it does.
      nb::arg("plan"), nb::arg("parts"), nb::arg("mode") = GuardMode::fallback,
      nb::arg("router").none() = nb::none(), nb::arg("shared_gate").none() = nb::none(),
      nb::keep_alive<0, 2>());

  // Bind-time: the one constructor. The door hands the plan and the host tensor of each operand
  // (plan.slots resolved on its tree); the core packs them (read in place, never kept).
  m.def(
      "build_seat",
      [](const SeatPlan& plan, const std::map<std::string, nb::handle>& tensors, GuardMode mode,
         const std::map<std::string, PackedLinear*>& adopted,
         const std::map<std::string, const InputMoments*>& moments) {
        std::map<std::string, TensorView> views;
        for (const auto& [name, t] : tensors) views[name] = view_of(t, name.c_str());
        // Adopted packs move into the seat: the Python objects are left empty (n = 0).
        std::map<std::string, PackedLinear> packs;
        for (const auto& [name, p] : adopted) {
          if (p == nullptr || p->n() == 0)
            throw InvalidArgument("adopted '" + name + "': an empty pack (already seated?)");
          packs.emplace(name, std::move(*p));
        }
        nb::gil_scoped_release release;
        return build_seat(plan, views, mode, process_hub(), std::move(packs), moments);
      },
      nb::arg("plan"), nb::arg("tensors"), nb::arg("mode") = GuardMode::fallback,
      nb::arg("adopted") = std::map<std::string, PackedLinear*>{},
      nb::arg("moments") = std::map<std::string, const InputMoments*>{});
  m.def("member_seat", &member_seat, nb::arg("packed"), nb::arg("index"), nb::arg("site"));
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
  nb::enum_<ParityBand>(m, "ParityBand")
      .value("pass_", ParityBand::pass)
      .value("warn", ParityBand::warn)
      .value("low", ParityBand::low);
  nb::enum_<UnitDecision>(m, "UnitDecision")
      .value("activated", UnitDecision::activated)
      .value("refused_fallbacks", UnitDecision::refused_fallbacks)
      .value("refused_floor", UnitDecision::refused_floor)
      .value("refused_latency", UnitDecision::refused_latency);
  nb::class_<UnitVerdict>(m, "UnitVerdict")
      .def_ro("decision", &UnitVerdict::decision)
      .def_ro("text", &UnitVerdict::text)
      .def_ro("band", &UnitVerdict::band)
      .def_ro("latency", &UnitVerdict::latency);
  m.def("band_name", [](ParityBand b) { return std::string(band_name(b)); });
  m.def("parity_band", &parity_band, nb::arg("band"), nb::arg("metric"));
  m.def("judge_unit", &judge_unit, nb::arg("band"), nb::arg("gate"), nb::arg("metrics"),
        nb::arg("fallbacks"), nb::arg("host_seconds"), nb::arg("arm_seconds"),
        nb::arg("min_speedup").none(), nb::arg("floors"));
  m.def("latency_verdict", &latency_verdict, nb::arg("host_seconds"), nb::arg("arm_seconds"),
        nb::arg("min_speedup"));
  m.def("floors_shortfall", &floors_shortfall, nb::arg("metrics"), nb::arg("floors"));
  m.def("pick_candidate", &pick_candidate, nb::arg("verdicts"));

  nb::class_<UnitOutcome>(m, "UnitOutcome")
      .def_ro("unit", &UnitOutcome::unit)
      .def_ro("scheme", &UnitOutcome::scheme)
      .def_ro("best", &UnitOutcome::best)
      .def_ro("decision", &UnitOutcome::decision)
      .def_ro("paths", &UnitOutcome::paths)
      .def_prop_ro("kept", &UnitOutcome::kept);
  nb::class_<Arbitration>(m, "Arbitration")
      .def_ro("units", &Arbitration::units)
      .def_ro("refused", &Arbitration::refused);
  nb::class_<UnitArbiter>(m, "UnitArbiter")
      .def(nb::init<bool>(), nb::arg("gated_auto"))
      .def(
          "offer",
          [](UnitArbiter& a, const std::string& unit, const std::string& scheme,
             std::optional<UnitVerdict> verdict, const std::string& unmeasured,
             std::vector<std::string> paths, std::vector<std::string> needs) {
            return a.offer(unit, CandidateResult{scheme, std::move(verdict), unmeasured,
                                                 std::move(paths), std::move(needs)});
          },
          nb::arg("unit"), nb::arg("scheme"), nb::arg("verdict").none(), nb::arg("unmeasured"),
          nb::arg("paths"), nb::arg("needs") = std::vector<std::string>{})
      .def("plan_refused", &UnitArbiter::plan_refused, nb::arg("scheme"), nb::arg("path"),
           nb::arg("why"))
      .def("settle", &UnitArbiter::settle);

  nb::class_<SelfCheckVerdict>(m, "SelfCheckVerdict")
      .def_ro("passed", &SelfCheckVerdict::passed)
      .def_ro("top1_agreement", &SelfCheckVerdict::top1_agreement)
      .def_ro("min_cosine", &SelfCheckVerdict::min_cosine)
      .def_ro("worst_position", &SelfCheckVerdict::worst_position)
      .def_ro("min_keys_cosine", &SelfCheckVerdict::min_keys_cosine)
      .def_ro("worst_key_layer", &SelfCheckVerdict::worst_key_layer)
      .def_ro("worst_key_position", &SelfCheckVerdict::worst_key_position)
      .def_ro("positions", &SelfCheckVerdict::positions)
      .def_ro("text", &SelfCheckVerdict::text);
  m.def(
      "judge_self_check",
      [](const SelfCheckSpec& spec, nb::handle got, nb::handle want, nb::handle got_keys,
         nb::handle want_keys, int64_t first_key_position) {
        return judge_self_check(spec, view_of(got, "got"), view_of(want, "want"),
                                view_of(got_keys, "got_keys"), view_of(want_keys, "want_keys"),
                                first_key_position);
      },
      nb::arg("spec"), nb::arg("got"), nb::arg("want"), nb::arg("got_keys"), nb::arg("want_keys"),
      nb::arg("first_key_position") = 0);
  nb::class_<CertificationVerdict>(m, "CertificationVerdict")
      .def_ro("passed", &CertificationVerdict::passed)
      .def_ro("worst_cosine", &CertificationVerdict::worst_cosine)
      .def_ro("samples", &CertificationVerdict::samples)
      .def_ro("text", &CertificationVerdict::text);
  m.def("judge_certification", &judge_certification, nb::arg("cosines"), nb::arg("floor"));
}

}  // namespace frt::py
