#include <flashrt/pack.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include "convert.h"

namespace nb = nanobind;

namespace frt::py {

void bind_quant(nb::module_& m) {
  nb::class_<PackStats>(m, "PackStats")
      .def_ro("max_abs_err", &PackStats::max_abs_err)
      .def_ro("rms_err", &PackStats::rms_err)
      .def_ro("rel_err", &PackStats::rel_err);

  nb::class_<PackedLinear>(m, "PackedLinear")
      .def_prop_ro("n", &PackedLinear::n)
      .def_prop_ro("k", &PackedLinear::k)
      .def_prop_ro("group", &PackedLinear::group)
      .def_prop_ro("symmetric", &PackedLinear::symmetric)
      .def_prop_ro("nbytes", &PackedLinear::nbytes)
      .def_prop_ro("form", &PackedLinear::form)
      .def_prop_ro("stats", &PackedLinear::stats)
      .def("dequantize", [](const PackedLinear& p) {
        auto* data = new std::vector<float>(p.dequantize());
        nb::capsule owner(data,
                          [](void* v) noexcept { delete static_cast<std::vector<float>*>(v); });
        return nb::ndarray<nb::numpy, float, nb::ndim<2>>(
            data->data(), {static_cast<size_t>(p.n()), static_cast<size_t>(p.k())}, owner);
      });

  // Packing reads the host's weight in place (any strides) and never keeps a pointer to it.
  m.def(
      "pack_int8",
      [](nb::handle w) {
        const TensorView v = view_of(w, "weight");
        nb::gil_scoped_release release;
        return PackedLinear::int8(v);
      },
      nb::arg("weight"));
  m.def(
      "pack_int8_gemm",
      [](nb::handle w) {
        const TensorView v = view_of(w, "weight");
        nb::gil_scoped_release release;
        return PackedLinear::int8_gemm(v);
      },
      nb::arg("weight"));
  m.def(
      "pack_int4",
      [](nb::handle w, int group, bool symmetric) {
        const TensorView v = view_of(w, "weight");
        nb::gil_scoped_release release;
        return PackedLinear::int4(v, group, symmetric);
      },
      nb::arg("weight"), nb::arg("group"), nb::arg("symmetric"));
}

}  // namespace frt::py
