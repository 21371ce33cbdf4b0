// The planner seen from Python: HostGraph in (filled by the door's observation), Plan out, as
// bound classes and enums (STYLE (d): never string dicts).
#include <flashrt/catalog.h>
#include <flashrt/host_graph.h>
#include <flashrt/hub.h>
#include <flashrt/plan.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace frt::py {

void bind_planner(nb::module_& m) {
  nb::class_<NormFacts>(m, "NormFacts")
      .def(nb::init<>())
      .def(
          "__init__",
          [](NormFacts* t, NormForm form, double eps, bool affine, std::string modulation) {
            new (t) NormFacts{form, eps, affine, std::move(modulation)};
          },
          nb::arg("form"), nb::arg("eps") = 0.0, nb::arg("affine") = true,
          nb::arg("modulation") = "")
      .def_rw("form", &NormFacts::form)
      .def_rw("eps", &NormFacts::eps)
      .def_rw("affine", &NormFacts::affine)
      .def_rw("modulation", &NormFacts::modulation);

  nb::class_<BlockFacts>(m, "BlockFacts")
      .def(nb::init<>())
      .def_rw("form", &BlockFacts::form)
      .def_rw("input_norm", &BlockFacts::input_norm)
      .def_rw("attention", &BlockFacts::attention)
      .def_rw("post_norm", &BlockFacts::post_norm)
      .def_rw("ffn", &BlockFacts::ffn)
      .def_rw("q", &BlockFacts::q)
      .def_rw("k", &BlockFacts::k)
      .def_rw("v", &BlockFacts::v)
      .def_rw("o", &BlockFacts::o)
      .def_rw("q_norm", &BlockFacts::q_norm)
      .def_rw("k_norm", &BlockFacts::k_norm)
      .def_rw("rotary", &BlockFacts::rotary)
      .def_rw("hidden", &BlockFacts::hidden)
      .def_rw("other", &BlockFacts::other);
  nb::class_<RotaryFacts>(m, "RotaryFacts")
      .def(nb::init<>())
      .def_rw("inv_freq", &RotaryFacts::inv_freq)
      .def_rw("attention_scaling", &RotaryFacts::attention_scaling)
      .def_rw("inv_freq_of", &RotaryFacts::inv_freq_of)
      .def_rw("attention_scaling_of", &RotaryFacts::attention_scaling_of)
      .def_rw("form", &RotaryFacts::form)
      .def_rw("heads", &RotaryFacts::heads)
      .def_rw("kv_heads", &RotaryFacts::kv_heads)
      .def_rw("head_dim", &RotaryFacts::head_dim)
      .def_rw("functions", &RotaryFacts::functions)
      .def_rw("other", &RotaryFacts::other);

  nb::class_<HostConfig>(m, "HostConfig")
      .def(nb::init<>())
      .def_rw("dtype", &HostConfig::dtype)
      .def_rw("heads", &HostConfig::heads)
      .def_rw("kv_heads", &HostConfig::kv_heads)
      .def_rw("head_dim", &HostConfig::head_dim)
      .def_rw("intermediate", &HostConfig::intermediate)
      .def_rw("rope", &HostConfig::rope)
      .def_rw("rope_name", &HostConfig::rope_name)
      .def_rw("sliding_window", &HostConfig::sliding_window)
      .def_rw("rope_original_max", &HostConfig::rope_original_max)
      .def_rw("layer_types", &HostConfig::layer_types)
      .def_rw("rope_layers", &HostConfig::rope_layers)
      .def_rw("embedding_multiplier", &HostConfig::embedding_multiplier)
      .def_rw("residual_multiplier", &HostConfig::residual_multiplier)
      .def_rw("attention_multiplier", &HostConfig::attention_multiplier)
      .def_rw("logits_scaling", &HostConfig::logits_scaling)
      .def_rw("query_pre_attn_scalar", &HostConfig::query_pre_attn_scalar)
      .def_rw("attn_logit_softcapping", &HostConfig::attn_logit_softcapping)
      .def_rw("final_logit_softcapping", &HostConfig::final_logit_softcapping)
      .def_rw("clip_qkv", &HostConfig::clip_qkv);

  nb::class_<RouterFacts>(m, "RouterFacts")
      .def(nb::init<>())
      .def_rw("form", &RouterFacts::form)
      .def_rw("experts", &RouterFacts::experts)
      .def_rw("hidden", &RouterFacts::hidden)
      .def_rw("top_k", &RouterFacts::top_k)
      .def_rw("other", &RouterFacts::other);

  nb::class_<ExpertFacts>(m, "ExpertFacts")
      .def(nb::init<>())
      .def_rw("experts", &ExpertFacts::experts)
      .def_rw("hidden", &ExpertFacts::hidden)
      .def_rw("intermediate", &ExpertFacts::intermediate)
      .def_rw("top_k", &ExpertFacts::top_k)
      .def_rw("gate_up", &ExpertFacts::gate_up)
      .def_rw("gate", &ExpertFacts::gate)
      .def_rw("up", &ExpertFacts::up)
      .def_rw("down", &ExpertFacts::down)
      .def_rw("transposed", &ExpertFacts::transposed)
      .def_rw("has_bias", &ExpertFacts::has_bias)
      .def_rw("router", &ExpertFacts::router);

  nb::class_<RecurrenceFacts>(m, "RecurrenceFacts")
      .def(nb::init<>())
      .def_rw("form", &RecurrenceFacts::form)
      .def_rw("k_heads", &RecurrenceFacts::k_heads)
      .def_rw("v_heads", &RecurrenceFacts::v_heads)
      .def_rw("k_dim", &RecurrenceFacts::k_dim)
      .def_rw("v_dim", &RecurrenceFacts::v_dim)
      .def_rw("l2norm", &RecurrenceFacts::l2norm)
      .def_rw("functions", &RecurrenceFacts::functions)
      .def_rw("other", &RecurrenceFacts::other);

  nb::class_<ConvFacts>(m, "ConvFacts")
      .def(nb::init<>())
      .def_rw("channels", &ConvFacts::channels)
      .def_rw("taps", &ConvFacts::taps)
      .def_rw("groups", &ConvFacts::groups)
      .def_rw("padding", &ConvFacts::padding)
      .def_rw("has_bias", &ConvFacts::has_bias)
      .def_rw("functions", &ConvFacts::functions)
      .def_rw("activation", &ConvFacts::activation)
      .def_rw("activated", &ConvFacts::activated);

  nb::class_<AttentionFacts>(m, "AttentionFacts")
      .def(nb::init<>())
      .def_rw("form", &AttentionFacts::form)
      .def_rw("heads", &AttentionFacts::heads)
      .def_rw("kv_heads", &AttentionFacts::kv_heads)
      .def_rw("head_dim", &AttentionFacts::head_dim)
      .def_rw("scale", &AttentionFacts::scale)
      .def_rw("softcap", &AttentionFacts::softcap)
      .def_rw("sliding_window", &AttentionFacts::sliding_window)
      .def_rw("implementation", &AttentionFacts::implementation)
      .def_rw("other", &AttentionFacts::other)
      .def_rw("cache", &AttentionFacts::cache);

  nb::class_<HostParam>(m, "HostParam")
      .def(nb::init<>())
      .def_rw("module", &HostParam::module)
      .def_rw("name", &HostParam::name)
      .def_rw("shape", &HostParam::shape)
      .def_rw("elements", &HostParam::elements);

  nb::class_<HostModule>(m, "HostModule")
      .def(nb::init<>())
      .def_rw("path", &HostModule::path)
      .def_rw("kind", &HostModule::kind)
      .def_rw("type_name", &HostModule::type_name)
      .def_rw("in_features", &HostModule::in_features)
      .def_rw("out_features", &HostModule::out_features)
      .def_rw("has_bias", &HostModule::has_bias)
      .def_rw("weight_dtype", &HostModule::weight_dtype)
      .def_rw("weight_device", &HostModule::weight_device)
      .def_rw("weight_id", &HostModule::weight_id)
      .def_rw("activation", &HostModule::activation)
      .def_rw("norm", &HostModule::norm)
      .def_rw("rotary", &HostModule::rotary)
      .def_rw("block", &HostModule::block)
      .def_rw("embed_scale", &HostModule::embed_scale)
      .def_rw("calibration_rows", &HostModule::calibration_rows)
      .def_rw("seated", &HostModule::seated)
      .def_rw("experts", &HostModule::experts)
      .def_rw("router", &HostModule::router)
      .def_rw("recurrence", &HostModule::recurrence)
      .def_rw("attention", &HostModule::attention)
      .def_rw("conv", &HostModule::conv)
      .def_rw("children", &HostModule::children);

  nb::class_<HostCall>(m, "HostCall")
      .def(nb::init<>())
      .def_rw("path", &HostCall::path)
      .def_rw("rows", &HostCall::rows)
      .def_rw("width", &HostCall::width)
      .def_rw("dtype", &HostCall::dtype)
      .def_rw("input_id", &HostCall::input_id)
      .def_rw("output_id", &HostCall::output_id)
      .def_rw("modulated_from", &HostCall::modulated_from);

  nb::class_<HostGraph>(m, "HostGraph")
      .def(nb::init<>())
      .def_rw("modules", &HostGraph::modules)
      .def_rw("calls", &HostGraph::calls)
      .def_rw("params", &HostGraph::params)
      .def_rw("output_head", &HostGraph::output_head)
      .def_rw("input_embedding", &HostGraph::input_embedding)
      .def_rw("config", &HostGraph::config);

  nb::class_<Seam>(m, "Seam")
      .def_ro("site", &Seam::site)
      .def_ro("structure", &Seam::structure)
      .def_ro("nodes", &Seam::nodes)
      .def_ro("slots", &Seam::slots)
      .def_ro("dims", &Seam::dims)
      .def_ro("activation", &Seam::activation)
      .def_ro("weight_dtype", &Seam::weight_dtype)
      .def_ro("act_dtype", &Seam::act_dtype)
      .def_ro("rows_seen", &Seam::rows_seen)
      .def_ro("tied", &Seam::tied)
      .def_ro("shape", &Seam::shape)
      .def_ro("weight_count", &Seam::weight_count)
      .def_ro("top_k", &Seam::top_k)
      .def_ro("attention", &Seam::attention)
      .def_ro("router", &Seam::router);

  nb::class_<SlotTensor>(m, "SlotTensor")
      .def_ro("module", &SlotTensor::module)
      .def_ro("tensor", &SlotTensor::tensor)
      .def_ro("part", &SlotTensor::part)
      .def_ro("parts", &SlotTensor::parts)
      .def("__repr__",
           [](const SlotTensor& t) { return "SlotTensor(" + t.module + "." + t.tensor + ")"; });

  nb::class_<SeatPlan>(m, "SeatPlan")
      .def_ro("seam", &SeatPlan::seam)
      .def_ro("site", &SeatPlan::site)
      .def_ro("replaces", &SeatPlan::replaces)
      .def_ro("impl", &SeatPlan::impl)
      .def_ro("package", &SeatPlan::package)
      .def_ro("op", &SeatPlan::op)
      .def_ro("form", &SeatPlan::form)
      .def_ro("band_min", &SeatPlan::band_min)
      .def_ro("band_max", &SeatPlan::band_max)
      .def_ro("slots", &SeatPlan::slots)
      .def_ro("activation", &SeatPlan::activation)
      .def_ro("act_dtype", &SeatPlan::act_dtype)
      .def_ro("ladder", &SeatPlan::ladder);

  nb::class_<Scheme>(m, "Scheme")
      .def_ro("name", &Scheme::name)
      .def_ro("formats", &Scheme::formats)
      .def_ro("statistics", &Scheme::statistics)
      .def_ro("calibration_rows", &Scheme::calibration_rows);

  nb::class_<Discovery>(m, "Discovery")
      .def_ro("seams", &Discovery::seams)
      .def_ro("refused", &Discovery::refused)
      .def_ro("assumed", &Discovery::assumed);

  nb::class_<PlanOptions>(m, "PlanOptions")
      .def(nb::init<>())
      .def_rw("structures", &PlanOptions::structures)
      .def_rw("scheme", &PlanOptions::scheme)
      .def_rw("decisions_path", &PlanOptions::decisions_path)
      .def_rw("min_seat_weights", &PlanOptions::min_seat_weights)
      .def_rw("account_weights", &PlanOptions::account_weights)
      .def_rw("source_forms", &PlanOptions::source_forms)
      .def_rw("source_refusals", &PlanOptions::source_refusals)
      .def_rw("source", &PlanOptions::source);

  nb::class_<Plan>(m, "Plan")
      .def_ro("scheme", &Plan::scheme)
      .def_ro("seats", &Plan::seats)
      .def_ro("keep_host", &Plan::keep_host)
      .def_ro("refused", &Plan::refused)
      .def_ro("assumed", &Plan::assumed)
      .def_ro("kernel_unavailable", &Plan::kernel_unavailable)
      .def_ro("seams_found", &Plan::seams_found);

  m.def("discover", &discover, nb::arg("graph"), nb::arg("catalog"), nb::arg("structures"));
  m.def(
      "plan",
      [](const HostGraph& g, const Catalog& c, const PlanOptions& o) {
        return plan(g, c, o, process_hub());
      },
      nb::arg("graph"), nb::arg("catalog"), nb::arg("options"),
      nb::call_guard<nb::gil_scoped_release>());
  m.def("explain", nb::overload_cast<const Plan&, bool>(&explain), nb::arg("plan"),
        nb::arg("verbose") = false);
  m.def("scheme_names", &scheme_names, nb::arg("catalog"));
}

}  // namespace frt::py
