#include <flashrt/cpu_features.h>
#include <flashrt/hub.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace frt::py {

void bind_hub(nb::module_& m) {
  nb::class_<CpuFeatures>(m, "CpuFeatures")
      .def_ro("arch", &CpuFeatures::arch)
      .def_ro("os", &CpuFeatures::os)
      .def_ro("features", &CpuFeatures::features)
      .def_prop_ro("tier", &CpuFeatures::tier);

  nb::class_<UnavailableEntry>(m, "UnavailableEntry")
      .def_ro("repo", &UnavailableEntry::repo)
      .def_ro("version", &UnavailableEntry::version)
      .def_ro("error", &UnavailableEntry::error)
      .def_ro("detail", &UnavailableEntry::detail);

  nb::class_<VariantDecision>(m, "VariantDecision")
      .def_ro("name", &VariantDecision::name)
      .def_ro("isa", &VariantDecision::isa)
      .def_ro("library", &VariantDecision::library)
      .def_ro("chosen", &VariantDecision::chosen)
      .def_ro("reason", &VariantDecision::reason);

  nb::class_<PackageResolution>(m, "PackageResolution")
      .def_ro("repo", &PackageResolution::repo)
      .def_ro("version", &PackageResolution::version)
      .def_ro("revision", &PackageResolution::revision)
      .def_ro("dir", &PackageResolution::dir)
      .def_ro("source", &PackageResolution::source)
      .def_ro("variants", &PackageResolution::variants)
      .def_ro("chosen", &PackageResolution::chosen)
      .def_prop_ro("available", [](const PackageResolution& r) { return r.table != nullptr; });

  m.def("set_bundled_root", &set_bundled_root, nb::arg("root"));
  m.def("cpu", [] { return detect_cpu(); });
  m.def(
      "resolve", [](const std::string& repo) { return process_hub().resolve(repo); },
      nb::arg("repo"), nb::call_guard<nb::gil_scoped_release>());
  m.def("unavailable_report", [] { return process_hub().unavailable_report(); });
  m.def("clear_unavailable_report", [] { process_hub().clear_unavailable_report(); });
  m.def("visible_packages", [] { return process_hub().visible_packages(); });
  m.def("pin_variable", &pin_variable, nb::arg("repo"));
}

}  // namespace frt::py
