// The core's vocabulary enums (flashrt/types.h, host_graph.h) as nb::enum_: what a plan, a seat
// form and a host graph carry across the binding instead of strings.
#include <flashrt/calibration.h>
#include <flashrt/host_graph.h>
#include <flashrt/types.h>
#include <nanobind/nanobind.h>

#include <string>

namespace nb = nanobind;

namespace frt::py {

namespace {

// An enum bound from the core's own name table (types.cpp): its values are defined once.
template <typename E>
void bind_enum(nb::module_& m, const char* name) {
  nb::enum_<E> e(m, name);
  for (const auto& [value, text] : enum_entries<E>()) e.value(std::string(text).c_str(), value);
}

}  // namespace

void bind_types(nb::module_& m) {
  bind_enum<DType>(m, "DType");
  bind_enum<Activation>(m, "Activation");
  bind_enum<WeightFormat>(m, "WeightFormat");
  bind_enum<OpKind>(m, "OpKind");
  bind_enum<OutputKind>(m, "OutputKind");
  bind_enum<NormForm>(m, "NormForm");
  bind_enum<RopeKind>(m, "RopeKind");
  bind_enum<RecurrenceForm>(m, "RecurrenceForm");
  bind_enum<AttentionForm>(m, "AttentionForm");
  bind_enum<AttentionCache>(m, "AttentionCache");
  bind_enum<RotaryForm>(m, "RotaryForm");
  bind_enum<BlockForm>(m, "BlockForm");
  nb::enum_<Statistic>(m, "Statistic").value("input_moments", Statistic::input_moments);
  nb::enum_<ModuleKind>(m, "ModuleKind")
      .value("linear", ModuleKind::linear)
      .value("embedding", ModuleKind::embedding)
      .value("activation", ModuleKind::activation)
      .value("norm", ModuleKind::norm)
      .value("experts", ModuleKind::experts)
      .value("recurrence", ModuleKind::recurrence)
      .value("conv", ModuleKind::conv)
      .value("attention", ModuleKind::attention)
      .value("rotary", ModuleKind::rotary)
      .value("block", ModuleKind::block)
      .value("module", ModuleKind::module);
  nb::enum_<RouterForm>(m, "RouterForm")
      .value("unknown", RouterForm::unknown)
      .value("softmax_topk", RouterForm::softmax_topk)
      .value("softmax_topk_renormalised", RouterForm::softmax_topk_renormalised)
      .value("other", RouterForm::other);
}

}  // namespace frt::py
