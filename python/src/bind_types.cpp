// The core's vocabulary enums (flashrt/types.h, host_graph.h) as nb::enum_: what a plan, a seat
// form and a host graph carry across the binding instead of strings.
#include <flashrt/host_graph.h>
#include <flashrt/types.h>
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace frt::py {

void bind_types(nb::module_& m) {
  nb::enum_<DType>(m, "DType")
      .value("f32", DType::f32)
      .value("bf16", DType::bf16)
      .value("f16", DType::f16)
      .value("f64", DType::f64)
      .value("other", DType::other);
  nb::enum_<Activation>(m, "Activation")
      .value("silu", Activation::silu)
      .value("gelu_tanh", Activation::gelu_tanh)
      .value("gelu", Activation::gelu)
      .value("relu", Activation::relu)
      .value("unknown", Activation::unknown);
  nb::enum_<WeightFormat>(m, "WeightFormat")
      .value("int8_channel", WeightFormat::int8_channel)
      .value("int4_group", WeightFormat::int4_group)
      .value("int8_group", WeightFormat::int8_group)
      .value("int8_gemm", WeightFormat::int8_gemm)
      .value("int4_gemm", WeightFormat::int4_gemm);
  nb::enum_<OpKind>(m, "OpKind")
      .value("linear", OpKind::linear)
      .value("gated_ffn", OpKind::gated_ffn)
      .value("ffn", OpKind::ffn)
      .value("rmsnorm", OpKind::rmsnorm)
      .value("rotary", OpKind::rotary)
      .value("attention", OpKind::attention)
      .value("dense", OpKind::dense);
  nb::enum_<OutputKind>(m, "OutputKind")
      .value("values", OutputKind::values)
      .value("distribution", OutputKind::distribution);
  nb::enum_<ModuleKind>(m, "ModuleKind")
      .value("linear", ModuleKind::linear)
      .value("embedding", ModuleKind::embedding)
      .value("activation", ModuleKind::activation)
      .value("norm", ModuleKind::norm)
      .value("module", ModuleKind::module);
}

}  // namespace frt::py
