#include <flashrt/errors.h>
#include <flashrt/pack.h>
#include <flashrt/weight_memory.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "convert.h"

namespace nb = nanobind;

namespace frt::py {
namespace {

using QArray = nb::ndarray<const int8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using ScaleArray = nb::ndarray<nb::ro, nb::c_contig, nb::device::cpu>;

DType scale_dtype(const std::string& name) {
  if (name == "f32") return DType::f32;
  if (name == "f16") return DType::f16;
  throw InvalidArgument("scales '" + name + "': supported f32, f16");
}

DType array_dtype(const ScaleArray& a) {
  if (a.dtype() == nb::dtype<float>()) return DType::f32;
  if (a.dtype().code == static_cast<uint8_t>(nb::dlpack::dtype_code::Float) &&
      a.dtype().bits == 16 && a.dtype().lanes == 1)
    return DType::f16;
  throw InvalidArgument("adopt: scales must be float32 or float16 arrays");
}

// scales/mins: [n] or [n, 1] for one scale per row, else [n, groups].
void check_parts_shape(const ScaleArray& a, int64_t n, int64_t groups, const char* what) {
  const int64_t rows = a.ndim() >= 1 ? static_cast<int64_t>(a.shape(0)) : -1;
  const int64_t cols = a.ndim() == 2 ? static_cast<int64_t>(a.shape(1)) : 1;
  if (a.ndim() < 1 || a.ndim() > 2 || rows != n || cols != groups)
    throw InvalidArgument(std::string("adopt: ") + what + " must be [" + std::to_string(n) + ", " +
                          std::to_string(groups) + "]");
}

// The super forms' parts: int4_super's uint8 scale and min codes [n, k/32] under f16 d and
// dmin [n, k/256]; int8_super's int8 scale codes [n, k/16] under f16 d, no mins.
void super_parts(QuantizedParts& parts, const ScaleArray& codes,
                 const std::optional<ScaleArray>& mins, const std::optional<ScaleArray>& d,
                 const std::optional<ScaleArray>& dmin) {
  const bool int4 = parts.format == WeightFormat::int4_super ||
                    parts.format == WeightFormat::int4_super_gemm ||
                    parts.format == WeightFormat::int5_super_gemm;
  const std::string form = name_of(parts.format);
  if (!d || int4 != mins.has_value() || int4 != dmin.has_value())
    throw InvalidArgument("adopt: " + form +
                          (int4 ? " needs scale codes, min codes, super_scales and super_mins"
                                : " needs scale codes and super_scales, no mins"));
  const int64_t groups = parts.k / (int4 ? 32 : 16), supers = parts.k / 256;
  const auto code_type = int4 ? nb::dtype<uint8_t>() : nb::dtype<int8_t>();
  if (codes.dtype() != code_type || (mins && mins->dtype() != code_type))
    throw InvalidArgument("adopt: " + form + " scale and min codes must be " +
                          (int4 ? "uint8" : "int8") + " arrays");
  if (array_dtype(*d) != DType::f16 || (dmin && array_dtype(*dmin) != DType::f16))
    throw InvalidArgument("adopt: " + form + " super scales must be float16 arrays");
  check_parts_shape(codes, parts.n, groups, "scales");
  check_parts_shape(*d, parts.n, supers, "super_scales");
  parts.scale_dtype = DType::f16;
  parts.scales = codes.data();
  parts.super_scales = static_cast<const uint16_t*>(d->data());
  if (int4) {
    check_parts_shape(*mins, parts.n, groups, "mins");
    check_parts_shape(*dmin, parts.n, supers, "super_mins");
    parts.mins = mins->data();
    parts.super_mins = static_cast<const uint16_t*>(dmin->data());
  }
}

}  // namespace

void bind_quant(nb::module_& m) {
  nb::class_<PackStats>(m, "PackStats")
      .def_ro("max_abs_err", &PackStats::max_abs_err)
      .def_ro("rms_err", &PackStats::rms_err)
      .def_ro("rel_err", &PackStats::rel_err)
      .def_ro("max_abs_ref", &PackStats::max_abs_ref)
      .def_ro("out_rel_err", &PackStats::out_rel_err)
      .def_ro("out_rel_err_plain", &PackStats::out_rel_err_plain)
      .def_ro("calibration_rows", &PackStats::calibration_rows);

  // The door hands each projection's input rows as they pass; the core keeps the sums.
  nb::class_<InputMoments>(m, "InputMoments")
      .def(nb::init<int64_t, int64_t>(), nb::arg("width"), nb::arg("span"))
      .def_static("span_for", &InputMoments::span_for, nb::arg("width"), nb::arg("group"),
                  nb::arg("cap"))
      .def(
          "add",
          [](InputMoments& im, nb::handle x) {
            const TensorView v = view_of(x, "x");
            nb::gil_scoped_release release;
            im.add(v);
          },
          nb::arg("x"))
      .def_prop_ro("width", &InputMoments::width)
      .def_prop_ro("span", &InputMoments::span)
      .def_prop_ro("rows", &InputMoments::rows)
      .def("mean_square", &InputMoments::mean_square);

  // Where the packs lie: the arena's bytes and how many the kernel backs with huge pages.
  nb::class_<WeightMemoryPages>(m, "WeightMemoryPages")
      .def_ro("known", &WeightMemoryPages::known)
      .def_ro("arena_bytes", &WeightMemoryPages::arena_bytes)
      .def_ro("resident_bytes", &WeightMemoryPages::resident_bytes)
      .def_ro("huge_bytes", &WeightMemoryPages::huge_bytes);
  m.def("weight_memory_pages", &weight_memory_pages, nb::call_guard<nb::gil_scoped_release>());
  m.def("settle_weight_memory", &settle_weight_memory, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<PackedLinear>(m, "PackedLinear")
      .def_prop_ro("n", &PackedLinear::n)
      .def_prop_ro("k", &PackedLinear::k)
      .def_prop_ro("group", &PackedLinear::group)
      .def_prop_ro("symmetric", &PackedLinear::symmetric)
      .def_prop_ro("nbytes", &PackedLinear::nbytes)
      .def_prop_ro("form", &PackedLinear::form)
      .def_prop_ro("format", &PackedLinear::format)
      .def(
          "compare",
          [](const PackedLinear& p, nb::handle w) { return p.compare(view_of(w, "weight")); },
          nb::arg("weight"))
      .def_prop_ro("stats", &PackedLinear::stats)
      .def("copy",
           [](const PackedLinear& p) {
             nb::gil_scoped_release release;
             return p.copy();
           })
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
      [](nb::handle w, int group, const std::string& scales) {
        const TensorView v = view_of(w, "weight");
        const DType dt = scale_dtype(scales);
        nb::gil_scoped_release release;
        return PackedLinear::int8(v, group, dt);
      },
      nb::arg("weight"), nb::arg("group") = 0, nb::arg("scales") = "f32");
  m.def(
      "pack_int8_gemm",
      [](nb::handle w, int act_block) {
        const TensorView v = view_of(w, "weight");
        nb::gil_scoped_release release;
        return PackedLinear::int8_gemm(v, act_block);
      },
      nb::arg("weight"), nb::arg("act_block") = 0);
  m.def(
      "pack_int4_gemm",
      [](nb::handle w, bool symmetric, const InputMoments* moments) {
        const TensorView v = view_of(w, "weight");
        nb::gil_scoped_release release;
        return PackedLinear::int4_gemm(v, symmetric, moments);
      },
      nb::arg("weight"), nb::arg("symmetric") = true, nb::arg("moments") = nb::none());
  m.def(
      "pack_int8_super",
      [](nb::handle w) {
        const TensorView v = view_of(w, "weight");
        nb::gil_scoped_release release;
        return PackedLinear::int8_super(v);
      },
      nb::arg("weight"));
  m.def(
      "pack_int4_super",
      [](nb::handle w) {
        const TensorView v = view_of(w, "weight");
        nb::gil_scoped_release release;
        return PackedLinear::int4_super(v);
      },
      nb::arg("weight"));
  m.def(
      "pack_int4_super_gemm",
      [](nb::handle w) {
        const TensorView v = view_of(w, "weight");
        nb::gil_scoped_release release;
        return PackedLinear::int4_super_gemm(v);
      },
      nb::arg("weight"));
  m.def(
      "pack_int6_super_gemm",
      [](nb::handle w) {
        const TensorView v = view_of(w, "weight");
        nb::gil_scoped_release release;
        return PackedLinear::int6_super_gemm(v);
      },
      nb::arg("weight"));
  m.def(
      "pack_int4",
      [](nb::handle w, int group, bool symmetric, const std::string& scales,
         const InputMoments* moments) {
        const TensorView v = view_of(w, "weight");
        const DType dt = scale_dtype(scales);
        nb::gil_scoped_release release;
        return PackedLinear::int4(v, group, symmetric, dt, moments);
      },
      nb::arg("weight"), nb::arg("group"), nb::arg("symmetric"), nb::arg("scales") = "f32",
      nb::arg("moments") = nb::none());

  // A checkpoint's own quantised values (numpy, C-contiguous), laid out without requantising.
  m.def(
      "from_quantized",
      [](WeightFormat format, int group, QArray q, ScaleArray scales,
         std::optional<ScaleArray> mins, std::optional<ScaleArray> super_scales,
         std::optional<ScaleArray> super_mins) {
        QuantizedParts parts;
        parts.format = format;
        parts.group = group;
        parts.n = static_cast<int64_t>(q.shape(0));
        parts.k = static_cast<int64_t>(q.shape(1));
        parts.q = q.data();
        if (is_super_format(format)) {
          super_parts(parts, scales, mins, super_scales, super_mins);
          nb::gil_scoped_release release;
          return PackedLinear::from_quantized(parts);
        }
        if (super_scales || super_mins)
          throw InvalidArgument(
              "adopt: super scales belong to the super-block forms (int4_super, int8_super and "
              "their gemm layouts)");
        parts.scale_dtype = array_dtype(scales);
        parts.scales = scales.data();
        const int64_t groups =
            format == WeightFormat::int8_channel || group <= 0 ? 1 : parts.k / group;
        check_parts_shape(scales, parts.n, groups, "scales");
        if (mins) {
          if (array_dtype(*mins) != parts.scale_dtype)
            throw InvalidArgument("adopt: mins and scales must share a dtype");
          check_parts_shape(*mins, parts.n, groups, "mins");
          parts.mins = mins->data();
        }
        nb::gil_scoped_release release;
        return PackedLinear::from_quantized(parts);
      },
      nb::arg("format"), nb::arg("group"), nb::arg("q"), nb::arg("scales"),
      nb::arg("mins").none() = nb::none(), nb::arg("super_scales").none() = nb::none(),
      nb::arg("super_mins").none() = nb::none());
}

}  // namespace frt::py
