// flashrt_structures._core: one file per core area binds it; bindings convert, call, convert
// back, and decide nothing.
#include <flashrt/errors.h>
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace frt::py {
void bind_types(nb::module_& m);
void bind_convert(nb::module_& m);
void bind_catalog(nb::module_& m);
void bind_hub(nb::module_& m);
void bind_quant(nb::module_& m);
void bind_ops(nb::module_& m);
void bind_planner(nb::module_& m);
void bind_runtime(nb::module_& m);
void bind_gates(nb::module_& m);
void bind_decode(nb::module_& m);
}  // namespace frt::py

NB_MODULE(_core, m) {
  m.doc() = "flashrt core: kernel path, packers and kernel ops";
  // The one translator: InvalidArgument -> ValueError (nanobind's default for
  // std::invalid_argument), Refused and KernelUnavailable -> their own classes.
  nb::exception<frt::Refused>(m, "Refused", PyExc_RuntimeError);
  nb::exception<frt::KernelUnavailable>(m, "KernelUnavailable", PyExc_ValueError);
  frt::py::bind_types(m);
  frt::py::bind_convert(m);
  frt::py::bind_catalog(m);
  frt::py::bind_hub(m);
  frt::py::bind_quant(m);
  frt::py::bind_ops(m);
  frt::py::bind_planner(m);
  frt::py::bind_runtime(m);
  frt::py::bind_gates(m);
  frt::py::bind_decode(m);
}
