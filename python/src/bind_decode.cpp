#include <flashrt/catalog.h>
#include <flashrt/decode.h>
#include <flashrt/decode_plan.h>
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <map>
#include <memory>
#include <set>
#include <string_view>

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

// A bank from the door: a seated bank of experts (a MoeSeat), or the host's (gate, up, down)
// [experts, out, in] tensors, borrowed.
BankWeights bank_of(nb::handle weight, Activation act, const std::string& what) {
  BankWeights b;
  b.act = act;
  if (nb::isinstance<Seat>(weight)) {
    b.seat = dynamic_cast<const MoeSeat*>(nb::cast<const Seat*>(weight));
    if (b.seat == nullptr)
      throw Refused("decode_loop: " + what + " is seated, but not as a bank of experts");
    return b;
  }
  if (!nb::isinstance<nb::tuple>(weight) || nb::len(weight) != 3)
    throw Refused("decode_loop: " + what + ": expected a bank seat or (gate, up, down) tensors");
  const nb::tuple t = nb::borrow<nb::tuple>(weight);
  b.gate = view_of(t[0], (what + " gate").c_str());
  b.up = view_of(t[1], (what + " up").c_str());
  b.down = view_of(t[2], (what + " down").c_str());
  return b;
}

// Note [Decode tensors]: what the door hands the program crosses as one object built against
// the plan. The door resolves every path the plan names (embed, head, each stack and layer slot)
// to what stands there: a seat, the host's weight and bias, or None for a module with neither
// (the rotary, an activation). It never names a slot; the program reads the ones it uses, by the
// names the core declares (kDecode*Slots). The program keeps the DecodeTensors alive
// (keep_alive in make_decode_program), and a DecodeTensors a program was built from takes no
// further put: what the program points into stays what was handed.
struct SlotTensor {
  nb::object weight;  // a LinearSeat / FfnSeat, a host tensor, or None
  nb::object bias;    // a host bias tensor or None
};

class DecodeTensors {
 public:
  explicit DecodeTensors(const DecodePlan& plan) : plan_(plan) {
    // Every module the plan names, once (a module may fill several slots).
    const auto add = [&](const std::string& path) {
      if (known_.insert(path).second) paths_.push_back(path);
    };
    add(plan_.embed);
    add(plan_.head);
    for (const auto& [slot, path] : plan_.stack) add(path);
    for (const DecodeLayerPlan& L : plan_.layers)
      for (const auto& [slot, path] : L.slots) add(path);
  }

  void put(const std::string& path, nb::object weight, nb::object bias) {
    if (built_)
      throw InvalidArgument("decode_loop: a program was built from these tensors; '" + path +
                            "' cannot be replaced under it");
    if (!known_.count(path))
      throw InvalidArgument("decode_loop: '" + path + "' is not a module the decode plan names");
    by_path_[path] = SlotTensor{std::move(weight), std::move(bias)};
  }

  const std::vector<std::string>& paths() const { return paths_; }
  const DecodePlan& plan() const { return plan_; }

  ModelWeights weights() const {
    built_ = true;
    const DecodeConfig& cfg = plan_.config;
    ModelWeights w;
    w.embed = view_of(at(plan_.embed).weight, "embedding");
    w.final_norm = vector_of(at(plan_.stack.at("final_norm")).weight, cfg.hidden, "final norm");
    w.head = proj_of(at(plan_.head).weight, nb::none(), "head");
    for (size_t i = 0; i < plan_.layers.size(); ++i) {
      const DecodeLayerPlan& P = plan_.layers[i];
      const std::string where = "layer " + std::to_string(i) + " ";
      const auto slot = [&](const char* name) -> SlotTensor {
        const auto it = P.slots.find(name);
        return it == P.slots.end() ? SlotTensor{nb::none(), nb::none()} : at(it->second);
      };
      LayerWeights L;
      for (auto [name, norm] :
           {std::pair{"attn_in_norm", &L.attn_in_norm},
            std::pair{"attn_out_norm", &L.attn_out_norm}, std::pair{"ffn_in_norm", &L.ffn_in_norm},
            std::pair{"ffn_out_norm", &L.ffn_out_norm}})
        *norm = vector_of(slot(name).weight, cfg.hidden, where + name);
      const QkNorm qk = cfg.layer.at(i).qk_norm;
      L.q_norm = vector_of(slot("q_norm").weight, qk_norm_width(qk, cfg.heads, cfg.head_dim),
                           where + "q norm");
      L.k_norm = vector_of(slot("k_norm").weight, qk_norm_width(qk, cfg.kv_heads, cfg.head_dim),
                           where + "k norm");
      const bool fused = P.slots.count("qkv") > 0;
      for (auto [name, proj] : {std::pair{"q", &L.q}, std::pair{"k", &L.k}, std::pair{"v", &L.v},
                                std::pair{"qkv", &L.qkv}, std::pair{"o", &L.o}}) {
        if (std::string_view(name) != "o" && fused != (std::string_view(name) == "qkv")) continue;
        const SlotTensor t = slot(name);
        *proj = proj_of(t.weight, t.bias, where + name);
      }
      // A gated feed-forward: one seat at `module`, or its projections.
      const auto gated = [&](bool seated, const char* module, std::array<const char*, 3> parts,
                             Activation act, const std::string& what) {
        FfnWeights f;
        if (seated) {
          f.seat = nb::cast<const FfnSeat*>(slot(module).weight);
          return f;
        }
        if (std::string_view(module) == "mlp" && P.slots.count("gate_up")) {
          f.gate_up = proj_of(slot("gate_up").weight, nb::none(), what + "gate_up");
        } else {
          f.gate = proj_of(slot(parts[0]).weight, nb::none(), what + "gate");
          f.up = proj_of(slot(parts[1]).weight, nb::none(), what + "up");
        }
        f.down = proj_of(slot(parts[2]).weight, nb::none(), what + "down");
        f.act = act;
        return f;
      };
      if (!P.routed) {
        L.mlp = gated(P.mlp_seated, "mlp", {"gate", "up", "down"}, P.activation, where);
        w.layers.push_back(L);
        continue;
      }
      const DecodeMoePlan& M = P.moe;
      L.routed = true;
      L.moe.router = proj_of(slot("router").weight, nb::none(), where + "router");
      L.moe.top_k = M.top_k;
      L.moe.renormalise = M.renormalise;
      L.moe.bank = bank_of(slot("experts").weight, M.activation, where + "experts");
      if (M.shared) {
        L.moe.shared = true;
        L.moe.shared_expert = gated(M.shared_seated, "shared",
                                    {"shared_gate_proj", "shared_up_proj", "shared_down_proj"},
                                    M.shared_activation, where + "shared ");
        const SlotTensor g = slot("shared_expert_gate");
        L.moe.shared_gate = proj_of(g.weight, g.bias, where + "shared expert gate");
      }
      w.layers.push_back(L);
    }
    return w;
  }

 private:
  const SlotTensor& at(const std::string& path) const {
    const auto it = by_path_.find(path);
    if (it == by_path_.end())
      throw InvalidArgument("decode_loop: nothing was put for '" + path + "'");
    return it->second;
  }

  DecodePlan plan_;
  std::vector<std::string> paths_;
  std::set<std::string> known_;
  mutable bool built_ = false;
  std::map<std::string, SlotTensor> by_path_;
};

}  // namespace

void bind_decode(nb::module_& m) {
  nb::enum_<QkNorm>(m, "QkNorm")
      .value("none", QkNorm::none)
      .value("per_head", QkNorm::per_head)
      .value("whole", QkNorm::whole);
  nb::class_<DecodeRotary>(m, "DecodeRotary")
      .def_ro("inv_freq", &DecodeRotary::inv_freq)
      .def_ro("attention_scaling", &DecodeRotary::attention_scaling);
  nb::class_<DecodeLayerConfig>(m, "DecodeLayerConfig")
      .def_ro("window", &DecodeLayerConfig::window)
      .def_ro("rotary", &DecodeLayerConfig::rotary)
      .def_ro("qk_norm", &DecodeLayerConfig::qk_norm);
  nb::class_<DecodeConfig>(m, "DecodeConfig")
      .def(nb::init<>())
      .def_ro("layers", &DecodeConfig::layers)
      .def_ro("hidden", &DecodeConfig::hidden)
      .def_ro("heads", &DecodeConfig::heads)
      .def_ro("kv_heads", &DecodeConfig::kv_heads)
      .def_ro("head_dim", &DecodeConfig::head_dim)
      .def_ro("intermediate", &DecodeConfig::intermediate)
      .def_ro("vocab", &DecodeConfig::vocab)
      .def_ro("max_len", &DecodeConfig::max_len)
      .def_ro("sequences", &DecodeConfig::sequences)
      .def_ro("cache_dtype", &DecodeConfig::cache_dtype)
      .def_ro("eps", &DecodeConfig::eps)
      .def_ro("norm_plus_one", &DecodeConfig::norm_plus_one)
      .def_ro("rotary_dim", &DecodeConfig::rotary_dim)
      .def_ro("rotaries", &DecodeConfig::rotaries)
      .def_ro("layer", &DecodeConfig::layer)
      .def_ro("embed_scale", &DecodeConfig::embed_scale)
      .def_ro("residual_scale", &DecodeConfig::residual_scale)
      .def_ro("attention_scale", &DecodeConfig::attention_scale)
      .def_ro("attention_softcap", &DecodeConfig::attention_softcap)
      .def_ro("logits_divisor", &DecodeConfig::logits_divisor)
      .def_ro("final_softcap", &DecodeConfig::final_softcap);

  nb::class_<DecodeMoePlan>(m, "DecodeMoePlan")
      .def_ro("experts", &DecodeMoePlan::experts)
      .def_ro("top_k", &DecodeMoePlan::top_k)
      .def_ro("intermediate", &DecodeMoePlan::intermediate)
      .def_ro("renormalise", &DecodeMoePlan::renormalise)
      .def_ro("bank_seated", &DecodeMoePlan::bank_seated)
      .def_ro("activation", &DecodeMoePlan::activation)
      .def_ro("shared", &DecodeMoePlan::shared)
      .def_ro("shared_intermediate", &DecodeMoePlan::shared_intermediate)
      .def_ro("shared_seated", &DecodeMoePlan::shared_seated)
      .def_ro("shared_activation", &DecodeMoePlan::shared_activation);
  nb::class_<DecodeLayerPlan>(m, "DecodeLayerPlan")
      .def_ro("slots", &DecodeLayerPlan::slots)
      .def_ro("mlp_seated", &DecodeLayerPlan::mlp_seated)
      .def_ro("activation", &DecodeLayerPlan::activation)
      .def_ro("routed", &DecodeLayerPlan::routed)
      .def_ro("moe", &DecodeLayerPlan::moe);
  nb::class_<DecodePlan>(m, "DecodePlan")
      .def_ro("binding", &DecodePlan::binding)
      .def_ro("fits", &DecodePlan::fits)
      .def_ro("decode_package", &DecodePlan::decode_package)
      .def_ro("linear_package", &DecodePlan::linear_package)
      .def_ro("ffn_package", &DecodePlan::ffn_package)
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
        nb::arg("max_len"), nb::arg("sequences") = 1,
        nb::arg("kv_cache") = "f32");  // binding "": the core chooses (Note [Choosing a binding])
  m.def("explain_decode", nb::overload_cast<const DecodePlan&, bool>(&explain), nb::arg("plan"),
        nb::arg("verbose") = false);

  nb::class_<DecodeProgram>(m, "DecodeProgram")
      .def("step", &DecodeProgram::step, nb::arg("token"), nb::arg("pos"), nb::arg("seq") = 0,
           nb::call_guard<nb::gil_scoped_release>())
      .def(
          "prefill",
          [](DecodeProgram& p, const std::vector<int64_t>& tokens, int64_t pos0, int64_t seq) {
            if (tokens.empty()) throw InvalidArgument("decode_loop: an empty prompt");
            nb::gil_scoped_release release;
            return p.prefill(tokens.data(), static_cast<int64_t>(tokens.size()), pos0, seq);
          },
          nb::arg("tokens"), nb::arg("pos0") = 0, nb::arg("seq") = 0)
      // One token of each of several sequences: [(token, seq, pos)] rows -> each row's argmax.
      .def(
          "step_batch",
          [](DecodeProgram& p, const std::vector<int64_t>& tokens, const std::vector<int64_t>& seqs,
             const std::vector<int64_t>& positions) {
            if (tokens.size() != seqs.size() || tokens.size() != positions.size())
              throw InvalidArgument(
                  "decode_loop: step_batch takes one sequence and position per token");
            std::vector<int64_t> next(tokens.size());
            nb::gil_scoped_release release;
            p.step_batch(tokens.data(), seqs.data(), positions.data(),
                         static_cast<int64_t>(tokens.size()), next.data());
            return next;
          },
          nb::arg("tokens"), nb::arg("seqs"), nb::arg("positions"))
      .def(
          "load_cache",
          [](DecodeProgram& p, int64_t layer, nb::handle k, nb::handle v, int64_t first,
             int64_t seq) {
            const TensorView kv = view_of(k, "k cache"), vv = view_of(v, "v cache");
            const DecodeConfig& c = p.config();
            for (const TensorView* t : {&kv, &vv})
              if (t->dtype != DType::f32 || t->rank != 3 || t->shape[1] != c.kv_heads ||
                  t->shape[2] != c.head_dim || t->strides[2] != 1 || t->strides[1] != c.head_dim ||
                  t->strides[0] != c.kv_heads * c.head_dim)
                throw Refused("decode_loop: cache " + t->describe() +
                              ", expected contiguous f32[positions, kv_heads, head_dim]");
            if (kv.shape[0] != vv.shape[0])
              throw Refused("decode_loop: cache keys hold " + std::to_string(kv.shape[0]) +
                            " positions and values " + std::to_string(vv.shape[0]));
            p.load_cache(layer, kv.shape[0], static_cast<const float*>(kv.data),
                         static_cast<const float*>(vv.data), first, seq);
          },
          nb::arg("layer"), nb::arg("k"), nb::arg("v"), nb::arg("first") = 0, nb::arg("seq") = 0)
      // Positions [0, n) of a layer's cache as two [n, kv_heads, head_dim] fp32 arrays (copies).
      .def(
          "read_cache",
          [](const DecodeProgram& p, int64_t layer, int64_t n, int64_t seq) {
            const DecodeConfig& c = p.config();
            if (layer < 0 || layer >= c.layers || n < 0 || n > c.max_len)  // before allocating
              throw InvalidArgument("decode_loop: cache of layer " + std::to_string(layer) +
                                    " with " + std::to_string(n) +
                                    " positions does not fit the window of " +
                                    std::to_string(c.max_len));
            const size_t count =
                static_cast<size_t>(n * c.kv_heads * c.head_dim);  // n checked above
            auto k = std::make_unique<std::vector<float>>(count);
            auto v = std::make_unique<std::vector<float>>(count);
            p.read_cache(layer, n, k->data(), v->data(), seq);  // throws before anyone owns them
            const auto array = [&](std::unique_ptr<std::vector<float>> owned) {
              std::vector<float>* data = owned.release();
              nb::capsule owner(
                  data, [](void* d) noexcept { delete static_cast<std::vector<float>*>(d); });
              return nb::ndarray<nb::numpy, float, nb::ndim<3>>(
                  data->data(),
                  {static_cast<size_t>(n), static_cast<size_t>(c.kv_heads),
                   static_cast<size_t>(c.head_dim)},
                  owner);
            };
            return std::make_pair(array(std::move(k)), array(std::move(v)));
          },
          nb::arg("layer"), nb::arg("n"), nb::arg("seq") = 0)
      // The last call's logits (a copy, [vocab] fp32; a batch step's row `row`): for scoring,
      // not the hot path.
      .def(
          "logits",
          [](const DecodeProgram& p, int64_t row) {
            const std::span<const float> l = p.logits(row);
            auto* data = new std::vector<float>(l.begin(), l.end());
            nb::capsule owner(data,
                              [](void* v) noexcept { delete static_cast<std::vector<float>*>(v); });
            return nb::ndarray<nb::numpy, float, nb::ndim<1>>(data->data(), {data->size()}, owner);
          },
          nb::arg("row") = 0)
      .def_prop_ro("weight_bytes", &DecodeProgram::weight_bytes)
      .def_prop_ro("config", &DecodeProgram::config);

  nb::class_<DecodeTensors>(m, "DecodeTensors")
      .def(nb::init<const DecodePlan&>(), nb::arg("plan"))
      .def("paths", &DecodeTensors::paths)
      .def("put", &DecodeTensors::put, nb::arg("path"), nb::arg("weight").none(),
           nb::arg("bias").none());

  // The program over what `tensors` holds, with the kernel packages the plan names; `tensors`
  // must outlive it (the door keeps both on its DecodeLoop).
  m.def(
      "make_decode_program",
      // The program is built from the plan the tensors were resolved against: one plan for
      // both, so no configuration can differ from the tensors under it.
      [](const DecodeTensors& tensors) {
        const DecodePlan& plan = tensors.plan();
        if (!plan.ok())
          throw Refused("decode_loop: the plan is refused: " + plan.refused.front().second);
        ModelWeights w = tensors.weights();
        KernelHub& hub = process_hub();
        const frt_kernel_table& decode = hub.table(plan.decode_package);
        const frt_kernel_table* linear = hub.resolve(plan.linear_package).table;
        const frt_kernel_table* ffn = hub.resolve(plan.ffn_package).table;
        return std::make_unique<DecodeProgram>(plan.config, std::move(w), decode, linear, ffn);
      },
      nb::arg("tensors"), nb::keep_alive<0, 1>());
}

}  // namespace frt::py
