#include <flashrt/catalog.h>
#include <flashrt/decode.h>
#include <flashrt/decode_plan.h>
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>

#include "convert.h"

namespace nb = nanobind;

namespace frt::py {
namespace {

// A 1-D fp32 contiguous host vector (a norm weight, a bias), borrowed.
const float* vector_of(nb::handle t, int64_t n, const std::string& what) {
  if (t.is_none()) return nullptr;
  const TensorView v = view_of(t, what.c_str());
  if (v.dtype != DType::f32 || v.rank != 1 || v.shape[0] != n || v.strides[0] != 1)
    throw Refused("decode_loop: " + what + " " + v.describe() + ", expected contiguous f32[" +
                  std::to_string(n) + "]");
  return static_cast<const float*>(v.data);
}

// A projection from the door: a LinearSeat, or the host's weight tensor (and optional bias).
ProjWeights proj_of(nb::handle weight_or_seat, nb::handle bias, const std::string& what) {
  ProjWeights p;
  if (nb::isinstance<LinearSeat>(weight_or_seat)) {
    p.seat = nb::cast<const LinearSeat*>(weight_or_seat);
    return p;
  }
  p.host = view_of(weight_or_seat, what.c_str());
  if (p.host.rank == 2) p.bias = vector_of(bias, p.host.shape[0], what + " bias");
  return p;
}

}  // namespace

void bind_decode(nb::module_& m) {
  nb::class_<DecodeConfig>(m, "DecodeConfig")
      .def(nb::init<>())
      .def_rw("layers", &DecodeConfig::layers)
      .def_rw("hidden", &DecodeConfig::hidden)
      .def_rw("heads", &DecodeConfig::heads)
      .def_rw("kv_heads", &DecodeConfig::kv_heads)
      .def_rw("head_dim", &DecodeConfig::head_dim)
      .def_rw("intermediate", &DecodeConfig::intermediate)
      .def_rw("vocab", &DecodeConfig::vocab)
      .def_rw("max_len", &DecodeConfig::max_len)
      .def_rw("eps", &DecodeConfig::eps)
      .def_rw("qk_norm", &DecodeConfig::qk_norm)
      .def_rw("inv_freq", &DecodeConfig::inv_freq)
      .def_rw("attention_scaling", &DecodeConfig::attention_scaling);

  nb::class_<DecodeLayerPlan>(m, "DecodeLayerPlan")
      .def_ro("slots", &DecodeLayerPlan::slots)
      .def_ro("mlp_seated", &DecodeLayerPlan::mlp_seated)
      .def_ro("activation", &DecodeLayerPlan::activation);
  nb::class_<DecodePlan>(m, "DecodePlan")
      .def_ro("binding", &DecodePlan::binding)
      .def_ro("config", &DecodePlan::config)
      .def_ro("embed", &DecodePlan::embed)
      .def_ro("head", &DecodePlan::head)
      .def_ro("stack", &DecodePlan::stack)
      .def_ro("layers", &DecodePlan::layers)
      .def_ro("seated", &DecodePlan::seated)
      .def_ro("refused", &DecodePlan::refused)
      .def_ro("assumed", &DecodePlan::assumed)
      .def_prop_ro("ok", &DecodePlan::ok);
  m.def("plan_decode", &plan_decode, nb::arg("graph"), nb::arg("catalog"), nb::arg("binding"),
        nb::arg("max_len"));
  m.def("explain_decode", nb::overload_cast<const DecodePlan&>(&explain), nb::arg("plan"));

  nb::class_<DecodeProgram>(m, "DecodeProgram")
      .def("step", &DecodeProgram::step, nb::arg("token"), nb::arg("pos"),
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "prefill",
          [](DecodeProgram& p, const std::vector<int64_t>& tokens, int64_t pos0) {
            if (tokens.empty()) throw InvalidArgument("decode_loop: an empty prompt");
            nb::gil_scoped_release release;
            return p.prefill(tokens.data(), static_cast<int64_t>(tokens.size()), pos0);
          },
          nb::arg("tokens"), nb::arg("pos0") = 0)
      .def(
          "load_cache",
          [](DecodeProgram& p, int64_t layer, nb::handle k, nb::handle v) {
            const TensorView kv = view_of(k, "k cache"), vv = view_of(v, "v cache");
            const DecodeConfig& c = p.config();
            for (const TensorView* t : {&kv, &vv})
              if (t->dtype != DType::f32 || t->rank != 3 || t->shape[1] != c.kv_heads ||
                  t->shape[2] != c.head_dim || t->strides[2] != 1 || t->strides[1] != c.head_dim ||
                  t->strides[0] != c.kv_heads * c.head_dim)
                throw Refused("decode_loop: cache " + t->describe() +
                              ", expected contiguous f32[positions, kv_heads, head_dim]");
            p.load_cache(layer, kv.shape[0], static_cast<const float*>(kv.data),
                         static_cast<const float*>(vv.data));
          },
          nb::arg("layer"), nb::arg("k"), nb::arg("v"))
      // The last step's logits (a copy, [vocab] fp32): for scoring, not the hot path.
      .def("logits",
           [](const DecodeProgram& p) {
             auto* data = new std::vector<float>(p.logits());
             nb::capsule owner(
                 data, [](void* v) noexcept { delete static_cast<std::vector<float>*>(v); });
             return nb::ndarray<nb::numpy, float, nb::ndim<1>>(data->data(), {data->size()}, owner);
           })
      .def_prop_ro("weight_bytes", &DecodeProgram::weight_bytes)
      .def_prop_ro("config", &DecodeProgram::config);

  // layers: one dict per layer with keys input_norm, post_norm, q_norm, k_norm (tensor or None),
  // q, k, v, o (tensor or LinearSeat), q_bias, k_bias, v_bias, o_bias (tensor or None), and
  // either ffn (an FfnSeat) or gate, up, down (tensor or LinearSeat) with act ("silu" | ...).
  m.def(
      "make_decode_program",
      [](const DecodeConfig& cfg, nb::handle embed, nb::handle final_norm, nb::handle head,
         nb::list layers) {
        ModelWeights w;
        w.embed = view_of(embed, "embedding");
        w.final_norm = vector_of(final_norm, cfg.hidden, "final norm");
        w.head = proj_of(head, nb::none(), "head");
        for (size_t i = 0; i < layers.size(); ++i) {
          nb::dict d = nb::cast<nb::dict>(layers[i]);
          const std::string at = "layer " + std::to_string(i) + " ";
          auto get = [&](const char* key) -> nb::handle {
            return d.contains(key) ? nb::handle(d[key]) : nb::handle(nb::none());
          };
          LayerWeights L;
          L.input_norm = vector_of(get("input_norm"), cfg.hidden, at + "input norm");
          L.post_norm = vector_of(get("post_norm"), cfg.hidden, at + "post-attention norm");
          L.q_norm = vector_of(get("q_norm"), cfg.head_dim, at + "q norm");
          L.k_norm = vector_of(get("k_norm"), cfg.head_dim, at + "k norm");
          L.q = proj_of(get("q"), get("q_bias"), at + "q");
          L.k = proj_of(get("k"), get("k_bias"), at + "k");
          L.v = proj_of(get("v"), get("v_bias"), at + "v");
          L.o = proj_of(get("o"), get("o_bias"), at + "o");
          if (nb::isinstance<FfnSeat>(get("ffn"))) {
            L.mlp.seat = nb::cast<const FfnSeat*>(get("ffn"));
          } else {
            L.mlp.gate = proj_of(get("gate"), nb::none(), at + "gate");
            L.mlp.up = proj_of(get("up"), nb::none(), at + "up");
            L.mlp.down = proj_of(get("down"), nb::none(), at + "down");
            L.mlp.act = nb::cast<Activation>(get("act"));
          }
          w.layers.push_back(L);
        }
        KernelHub& hub = process_hub();
        const frt_kernel_table& decode = hub.table("flashrt/decode");
        const frt_kernel_table* linear = hub.resolve("flashrt/linear").table;
        const frt_kernel_table* ffn = hub.resolve("flashrt/ffn").table;
        return std::make_unique<DecodeProgram>(cfg, std::move(w), decode, linear, ffn);
      },
      nb::arg("config"), nb::arg("embed"), nb::arg("final_norm"), nb::arg("head"),
      nb::arg("layers"));
}

}  // namespace frt::py
