#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/op_dispatch.h>
#include <flashrt/thread_pool.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <optional>

#include "convert.h"

namespace nb = nanobind;

namespace frt::py {
namespace {

Activation activation(const std::string& name) {
  const std::optional<Activation> a = parse_activation(name);
  if (!a || !kernel_activation(*a))
    throw InvalidArgument("activation '" + name + "': kernels compute silu, gelu_tanh, gelu");
  return *a;
}

// gate None: the ungated form down(act(up(x) + up_bias)) + down_bias.
FfnOperands operands(const PackedLinear* gate, const PackedLinear& up, const PackedLinear& down,
                     const float* up_bias, const float* down_bias, const std::string& act) {
  FfnOperands f;
  f.gate = gate;
  f.up = &up;
  f.down = &down;
  f.up_bias = up_bias;
  f.down_bias = down_bias;
  f.act = activation(act);
  return f;
}

const float* bias_data(nb::handle bias, int64_t n) {
  if (bias.is_none()) return nullptr;
  const TensorView b = view_of(bias, "bias");
  if (b.dtype != DType::f32 || b.rank != 1 || b.shape[0] != n || b.strides[0] != 1)
    throw Refused("bias " + b.describe() + ": expected contiguous f32[" + std::to_string(n) + "]");
  return static_cast<const float*>(b.data);
}

// The views of a sequence attention call.
SequenceAttention attention_call(nb::handle q, nb::handle k, nb::handle v, nb::handle out,
                                 float scale) {
  return {view_of(q, "query"), view_of(k, "key"), view_of(v, "value"), view_of(out, "output"),
          scale};
}
// A query of another rank is refused before its head_dim picks the package.
std::string query_rank_refusal(const SequenceAttention& a) {
  return a.q.rank == 4 ? std::string()
                       : "query " + a.q.describe() +
                             ": expected a 4-D [batch, heads, positions, head_dim] view";
}

}  // namespace

void bind_ops(nb::module_& m) {
  m.def("num_threads", [] { return process_parallel().size(); });
  m.def("parallel_backend", [] { return process_parallel().describe(); });
  // The door passes the addresses of the host's libgomp entry points (found with ctypes).
  m.def(
      "use_host_openmp",
      [](uintptr_t parallel, uintptr_t thread_num, uintptr_t num_threads, uintptr_t max_threads,
         const std::string& library) {
        OpenMpRuntime rt;
        rt.parallel = reinterpret_cast<decltype(rt.parallel)>(parallel);
        rt.thread_num = reinterpret_cast<decltype(rt.thread_num)>(thread_num);
        rt.num_threads = reinterpret_cast<decltype(rt.num_threads)>(num_threads);
        rt.max_threads = reinterpret_cast<decltype(rt.max_threads)>(max_threads);
        rt.library = library;
        use_host_openmp(rt);
      },
      nb::arg("parallel"), nb::arg("thread_num"), nb::arg("num_threads"), nb::arg("max_threads"),
      nb::arg("library"));
  m.def("use_own_threads", &use_own_threads);

  m.def(
      "linear_refusal",
      [](nb::handle x, const PackedLinear& w, nb::handle out) {
        try {
          return linear_refusal(linear_table(process_hub(), w, false), w, view_of(x, "input"),
                                view_of(out, "output"));
        } catch (const KernelUnavailable& e) {
          return std::string(e.what());
        }
      },
      nb::arg("x"), nb::arg("w"), nb::arg("out"));
  m.def(
      "linear",
      [](nb::handle x, const PackedLinear& w, nb::handle bias, nb::handle out, int threads) {
        const float* b = bias_data(bias, w.n());
        const frt_kernel_table& t = linear_table(process_hub(), w, b != nullptr);
        const TensorView xv = view_of(x, "input"), yv = view_of(out, "output");
        nb::gil_scoped_release release;
        run_linear(t, process_parallel(), w, b, xv, yv, threads);
      },
      nb::arg("x"), nb::arg("w"), nb::arg("bias").none(), nb::arg("out"), nb::arg("threads") = 0);

  // q [batch, heads, q_len, head_dim], k and v [batch, kv_heads, kv_len, head_dim], out like q:
  // torch's scaled_dot_product_attention layout, bf16, no mask.
  m.def(
      "sequence_attention_refusal",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, float scale) {
        const SequenceAttention a = attention_call(q, k, v, out, scale);
        if (std::string why = query_rank_refusal(a); !why.empty()) return why;
        try {
          return sequence_attention_refusal(
              sequence_attention_table(process_hub(), a.q.dtype, a.q.shape[3]), a);
        } catch (const KernelUnavailable& e) {
          return std::string(e.what());
        }
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("scale"));
  m.def(
      "sequence_attention",
      [](nb::handle q, nb::handle k, nb::handle v, nb::handle out, float scale, int threads) {
        const SequenceAttention a = attention_call(q, k, v, out, scale);
        if (std::string why = query_rank_refusal(a); !why.empty()) throw Refused(why);
        const frt_kernel_table& t =
            sequence_attention_table(process_hub(), a.q.dtype, a.q.shape[3]);
        nb::gil_scoped_release release;
        run_sequence_attention(t, process_parallel(), a, threads);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("scale"),
      nb::arg("threads") = 0);

  m.def(
      "ffn_refusal",
      [](nb::handle x, const PackedLinear* gate, const PackedLinear& up, const PackedLinear& down,
         const std::string& act, nb::handle out, nb::handle up_bias, nb::handle down_bias) {
        const FfnOperands f = operands(gate, up, down, bias_data(up_bias, up.n()),
                                       bias_data(down_bias, down.n()), act);
        try {
          return ffn_refusal(ffn_table(process_hub(), f), f, view_of(x, "input"),
                             view_of(out, "output"));
        } catch (const KernelUnavailable& e) {
          return std::string(e.what());
        }
      },
      nb::arg("x"), nb::arg("gate").none(), nb::arg("up"), nb::arg("down"), nb::arg("act"),
      nb::arg("out"), nb::arg("up_bias").none() = nb::none(),
      nb::arg("down_bias").none() = nb::none());
  m.def(
      "ffn",
      [](nb::handle x, const PackedLinear* gate, const PackedLinear& up, const PackedLinear& down,
         const std::string& act, nb::handle out, int threads, nb::handle up_bias,
         nb::handle down_bias) {
        const FfnOperands f = operands(gate, up, down, bias_data(up_bias, up.n()),
                                       bias_data(down_bias, down.n()), act);
        const frt_kernel_table& t = ffn_table(process_hub(), f);
        const TensorView xv = view_of(x, "input"), yv = view_of(out, "output");
        nb::gil_scoped_release release;
        run_ffn(t, process_parallel(), f, xv, yv, threads);
      },
      nb::arg("x"), nb::arg("gate").none(), nb::arg("up"), nb::arg("down"), nb::arg("act"),
      nb::arg("out"), nb::arg("threads") = 0, nb::arg("up_bias").none() = nb::none(),
      nb::arg("down_bias").none() = nb::none());

  m.def("measure_read_bandwidth", &measure_read_bandwidth, nb::arg("bytes"), nb::arg("threads"),
        nb::arg("repeats"), nb::call_guard<nb::gil_scoped_release>());
}

}  // namespace frt::py
