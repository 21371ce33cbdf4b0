#include <flashrt/cpu_features.h>
#include <flashrt/hub.h>
#include <flashrt/utf8.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

namespace nb = nanobind;

namespace frt::py {
namespace {

// A getter for a text field. The hub already escapes what it records (issue 13); this is the
// last line of defence, because nanobind's str conversion of bytes that are not UTF-8 raises
// UnicodeDecodeError and takes the whole report down with it.
template <typename C>
auto text(std::string C::*member) {
  return [member](const C& c) { return escape_invalid_utf8(c.*member); };
}

}  // namespace

void bind_hub(nb::module_& m) {
  nb::class_<CpuFeatures>(m, "CpuFeatures")
      .def_ro("arch", &CpuFeatures::arch)
      .def_ro("os", &CpuFeatures::os)
      .def_ro("model", &CpuFeatures::model)
      .def_ro("features", &CpuFeatures::features)
      .def_prop_ro("tier", &CpuFeatures::tier);

  nb::class_<UnavailableEntry>(m, "UnavailableEntry")
      .def_prop_ro("repo", text(&UnavailableEntry::repo))
      .def_prop_ro("version", text(&UnavailableEntry::version))
      .def_prop_ro("error", text(&UnavailableEntry::error))
      .def_prop_ro("detail", text(&UnavailableEntry::detail));

  nb::class_<VariantDecision>(m, "VariantDecision")
      .def_prop_ro("name", text(&VariantDecision::name))
      .def_prop_ro("isa", text(&VariantDecision::isa))
      .def_prop_ro("library", text(&VariantDecision::library))
      .def_ro("sha256", &VariantDecision::sha256)
      .def_ro("chosen", &VariantDecision::chosen)
      .def_prop_ro("reason", text(&VariantDecision::reason));

  nb::class_<PackageResolution>(m, "PackageResolution")
      .def_prop_ro("repo", text(&PackageResolution::repo))
      .def_prop_ro("version", text(&PackageResolution::version))
      .def_prop_ro("revision", text(&PackageResolution::revision))
      .def_prop_ro("dir", text(&PackageResolution::dir))
      .def_prop_ro("source", text(&PackageResolution::source))
      .def_ro("variants", &PackageResolution::variants)
      .def_prop_ro("chosen", text(&PackageResolution::chosen))
      .def_prop_ro("available", [](const PackageResolution& r) { return r.table != nullptr; });

  m.def("set_bundled_root", &set_bundled_root, nb::arg("root"));
  m.def("cpu", [] { return detect_cpu(); });
  m.def(
      "resolve", [](const std::string& repo) { return process_hub().resolve(repo); },
      nb::arg("repo"), nb::call_guard<nb::gil_scoped_release>());
  m.def("unavailable_report", [] { return process_hub().unavailable_report(); });
  m.def("clear_unavailable_report", [] { process_hub().clear_unavailable_report(); });
  m.def("visible_packages", [] {
    std::vector<std::string> names = process_hub().visible_packages();
    for (std::string& n : names) n = escape_invalid_utf8(n);
    return names;
  });
  m.def("pin_variable", &pin_variable, nb::arg("repo"));
}

}  // namespace frt::py
