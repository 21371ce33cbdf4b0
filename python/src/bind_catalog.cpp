// The catalog seen from Python: read-only views of the parsed specs. Validation lives in the
// core; a bad file surfaces as ValueError (InvalidArgument) with the file and field.
#include <flashrt/catalog.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <tuple>

namespace nb = nanobind;

namespace frt::py {

void bind_catalog(nb::module_& m) {
  nb::class_<DimSpec>(m, "DimSpec")
      .def_ro("name", &DimSpec::name)
      .def_ro("min", &DimSpec::min)
      .def_ro("max", &DimSpec::max, "-1: unbounded")
      .def_ro("multiple_of", &DimSpec::multiple_of)
      .def_ro("decode_band", &DimSpec::decode_band)
      .def("__repr__", [](const DimSpec& d) {
        return "DimSpec(" + d.name + ", min=" + std::to_string(d.min) +
               ", max=" + std::to_string(d.max) + ", multiple_of=" + std::to_string(d.multiple_of) +
               (d.decode_band ? ", decode_band" : "") + ")";
      });

  nb::class_<TensorSpec>(m, "TensorSpec")
      .def_ro("name", &TensorSpec::name)
      .def_ro("shape", &TensorSpec::shape)
      .def_ro("dtypes", &TensorSpec::dtypes)
      .def_ro("required", &TensorSpec::required)
      .def_ro("dtype_of", &TensorSpec::dtype_of);

  nb::class_<GateSpec>(m, "GateSpec")
      .def_ro("kind", &GateSpec::kind)
      .def_ro("pass_", &GateSpec::pass)  // `pass` is a Python keyword
      .def_ro("warn", &GateSpec::warn)
      .def_ro("min_speedup", &GateSpec::min_speedup);

  nb::class_<StructureSpec>(m, "StructureSpec")
      .def_ro("name", &StructureSpec::name)
      .def_ro("version", &StructureSpec::version)
      .def_ro("kind", &StructureSpec::kind)
      .def_ro("description", &StructureSpec::description)
      .def_ro("digest", &StructureSpec::digest)
      .def_ro("reference", &StructureSpec::reference)
      .def_ro("tied_allowed", &StructureSpec::tied_allowed)
      .def_ro("dims", &StructureSpec::dims)
      .def_ro("inputs", &StructureSpec::inputs)
      .def_ro("outputs", &StructureSpec::outputs)
      .def_prop_ro(
          "slots",
          [](const StructureSpec& s) {
            std::vector<std::tuple<std::string, std::vector<std::string>, bool>> out;
            for (const TensorSpec& t : s.slots) out.emplace_back(t.name, t.shape, t.required);
            return out;
          },
          "(name, shape, required) per weight slot, in spec order")
      .def_ro("attributes", &StructureSpec::attributes)
      .def_ro("points", &StructureSpec::points)
      .def_ro("gate", &StructureSpec::gate)
      .def_ro("boundary_excludes", &StructureSpec::boundary_excludes)
      .def(
          "dim", [](const StructureSpec& s, const std::string& name) { return s.dim(name); },
          nb::arg("name"), nb::rv_policy::reference_internal)
      .def(
          "slot", [](const StructureSpec& s, const std::string& name) { return s.slot(name); },
          nb::arg("name"), nb::rv_policy::reference_internal)
      .def("__repr__", [](const StructureSpec& s) {
        return "StructureSpec(" + s.name + " v" + std::to_string(s.version) + ", " + s.digest + ")";
      });

  nb::class_<WeightForm>(m, "WeightForm")
      .def(nb::init<>())
      .def_rw("name", &WeightForm::name)
      .def_rw("format", &WeightForm::format)
      .def_rw("group", &WeightForm::group)
      .def_rw("symmetric", &WeightForm::symmetric)
      .def_rw("scale_dtype", &WeightForm::scale_dtype)
      .def_rw("tag", &WeightForm::tag)
      .def_rw("calibrated", &WeightForm::calibrated)
      .def_rw("rows_min", &WeightForm::rows_min)
      .def_rw("rows_max", &WeightForm::rows_max)
      .def("describe", &WeightForm::describe);

  nb::class_<SchemeSpec>(m, "SchemeSpec")
      .def_ro("name", &SchemeSpec::name)
      .def_ro("description", &SchemeSpec::description)
      .def_ro("formats", &SchemeSpec::formats)
      .def_ro("requires_packages", &SchemeSpec::requires_packages)
      .def_ro("indivisible", &SchemeSpec::indivisible)
      .def_ro("statistics", &SchemeSpec::statistics)
      .def_ro("calibration_rows", &SchemeSpec::calibration_rows)
      .def_ro("calibration_span", &SchemeSpec::calibration_span);

  nb::class_<SchemePolicy>(m, "SchemePolicy")
      .def_ro("forms", &SchemePolicy::forms)
      .def_ro("schemes", &SchemePolicy::schemes)
      .def_ro("auto_order", &SchemePolicy::auto_order)
      .def_ro("gated_auto", &SchemePolicy::gated_auto)
      .def_ro("min_seat_weights", &SchemePolicy::min_seat_weights);

  nb::class_<Rung>(m, "Rung")
      .def_ro("impl", &Rung::impl)
      .def_ro("package", &Rung::package)
      .def_ro("op", &Rung::op)
      .def_ro("per_node", &Rung::per_node)
      .def_ro("packed", &Rung::packed);

  nb::class_<OutputBand>(m, "OutputBand")
      .def_ro("kind", &OutputBand::kind)
      .def_ro("metric", &OutputBand::metric)
      .def_ro("pass_", &OutputBand::pass)
      .def_ro("warn", &OutputBand::warn);

  nb::class_<SelfCheckSpec>(m, "SelfCheckSpec")
      .def_ro("probe_tokens", &SelfCheckSpec::probe_tokens)
      .def_ro("top1_agreement", &SelfCheckSpec::top1_agreement)
      .def_ro("logits_cosine", &SelfCheckSpec::logits_cosine)
      .def_ro("keys_cosine", &SelfCheckSpec::keys_cosine);

  nb::class_<BindingSlot>(m, "BindingSlot")
      .def_ro("name", &BindingSlot::name)
      .def_ro("path", &BindingSlot::path)
      .def_ro("required", &BindingSlot::required);

  nb::class_<BindingSpec>(m, "BindingSpec")
      .def_ro("name", &BindingSpec::name)
      .def_ro("description", &BindingSpec::description)
      .def_ro("layers", &BindingSpec::layers)
      .def_ro("stack", &BindingSpec::stack)
      .def_ro("layer", &BindingSpec::layer)
      .def_ro("fused_forms", &BindingSpec::fused_forms)
      .def_ro("norm_forms", &BindingSpec::norm_forms)
      .def_ro("activations", &BindingSpec::activations)
      .def_ro("rope_kinds", &BindingSpec::rope_kinds);

  nb::class_<Catalog>(m, "Catalog")
      .def("names", &Catalog::names)
      .def("get", &Catalog::get, nb::arg("name"), nb::rv_policy::reference_internal)
      .def_prop_ro("dir", &Catalog::dir)
      .def_prop_ro("schemes", &Catalog::schemes, nb::rv_policy::reference_internal)
      .def("ladder", &Catalog::ladder, nb::arg("structure"), nb::rv_policy::reference_internal)
      .def("band", &Catalog::band, nb::arg("kind"), nb::rv_policy::reference_internal)
      .def_prop_ro("decode_self_check", &Catalog::decode_self_check,
                   nb::rv_policy::reference_internal)
      .def("binding", &Catalog::binding, nb::arg("name"), nb::rv_policy::reference_internal)
      .def_prop_ro("bindings",
                   [](const Catalog& c) {
                     std::vector<std::string> out;
                     for (const auto& kv : c.bindings()) out.push_back(kv.first);
                     return out;
                   })
      .def("missing_packages", &Catalog::missing_packages, nb::arg("visible"));

  m.def("load_catalog", &Catalog::load, nb::arg("dir"));
}

}  // namespace frt::py
