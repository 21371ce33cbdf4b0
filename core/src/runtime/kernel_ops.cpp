#include <flashrt/errors.h>
#include <flashrt/kernel_ops.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>

#include "quant/weight_memory.h"
#include "runtime/kernel_ops_unchecked.h"
#include "runtime/run_on_threads.h"

namespace frt {
namespace {

// The op's own per-call checks: "" or its reason with the form appended. The form is named
// only on a refusal: these checks run on every seated call, and building the words each time
// cost microseconds per call (a decode step makes ~200 calls).
template <typename Args, typename Form>
std::string op_refusal(const frt_op& op, const Args& a, Form form) {
  frt_error err{};
  if (op.supports(&a, &err) != FRT_REASON_OK) return std::string(err.message) + " (" + form() + ")";
  return "";
}

std::string not_owned(const frt_kernel_table& table, OpKind kind) {
  return std::string("package '") + table.package + "' provides no " + name_of(kind) + " op";
}

// The form checks that belong to the core (the kernel's own supports() follows): a row-major
// matrix whose inner dimension is contiguous. A strided row is fine; anything else would need a
// hidden copy, which a seat never makes (DESIGN §6).
std::string matrix_refusal(const char* what, const TensorView& t, int64_t cols) {
  if (t.data != nullptr && t.rank == 2 && t.shape[1] == cols && t.strides[1] == 1 &&
      (t.shape[0] <= 1 || t.strides[0] >= cols))
    return "";  // the common case, without a stream
  std::ostringstream s;
  if (t.data == nullptr) {
    s << what << ": no data";
  } else if (t.rank != 2) {
    s << what << ' ' << t.describe() << ": expected a 2-D [rows, " << cols << "] matrix";
  } else if (t.shape[1] != cols) {
    s << what << ' ' << t.describe() << ": width " << t.shape[1] << ", expected " << cols;
  } else if (t.strides[1] != 1 || (t.shape[0] > 1 && t.strides[0] < cols)) {
    s << what << ' ' << t.describe() << ": inner dimension not contiguous";
  }
  return s.str();
}

// Workspace reused across calls by each calling thread: no allocation per call at steady state.
void* workspace(int64_t bytes) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<void, Free> buffer;
  thread_local int64_t capacity = 0;
  if (bytes <= capacity) return buffer.get();
  const int64_t size = (bytes + 4095) / 4096 * 4096;
  buffer.reset(std::aligned_alloc(64, static_cast<size_t>(size)));
  if (!buffer) throw std::bad_alloc();
  capacity = size;
  return buffer.get();
}

template <typename Args>
void run_phases(Parallel& pool, int threads, const frt_op& op, Args& args) {
  args.workspace = op.workspace != nullptr ? workspace(op.workspace(&args)) : nullptr;
  const int nth = threads > 0 ? std::min(threads, pool.size()) : pool.size();
  for (int32_t phase = 0; phase < op.phases; ++phase)
    detail::run_on_threads(pool, nth, "kernel failed", [&](int ith, int n, frt_error* err) {
      return op.run(&args, phase, ith, n, err);
    });
}

frt_linear_args linear_args(const PackedLinear& w, const float* bias, const TensorView& x,
                            const TensorView& y) {
  frt_linear_args a{};
  a.x_dtype = abi_dtype(x.dtype);
  a.y_dtype = abi_dtype(y.dtype);
  a.m = x.shape[0];
  a.x = x.data;
  a.ldx = x.shape[0] > 1 ? x.strides[0] : w.k();
  a.y = y.data;
  a.ldy = y.shape[0] > 1 ? y.strides[0] : w.n();
  a.bias = bias;
  a.w = &w.view();
  return a;
}

frt_ffn_args ffn_args(const FfnOperands& f, const TensorView& x, const TensorView& y) {
  frt_ffn_args a{};
  a.x_dtype = abi_dtype(x.dtype);
  a.y_dtype = abi_dtype(y.dtype);
  a.act = static_cast<int32_t>(f.act);
  a.m = x.shape[0];
  a.x = x.data;
  a.ldx = x.shape[0] > 1 ? x.strides[0] : f.up->k();
  a.y = y.data;
  a.ldy = y.shape[0] > 1 ? y.strides[0] : f.down->n();
  a.gate = f.gate != nullptr ? &f.gate->view() : nullptr;
  a.up = &f.up->view();
  a.down = &f.down->view();
  a.up_bias = f.up_bias;
  a.down_bias = f.down_bias;
  return a;
}

std::string rows_refusal(const TensorView& x, const TensorView& y) {
  if (y.shape[0] != x.shape[0])
    return "output " + y.describe() + " has a different row count than input " + x.describe();
  return "";
}

// The routing weights as the op reads them, fp32 [rows][top_k]: the host's own when they are
// fp32, else widened into a per-thread buffer (at most FRT_MAX_ROWS x FRT_MAX_TOP_K values).
const float* routing_weights(const TensorView& w) {
  if (w.dtype == DType::f32) return static_cast<const float*>(w.data);
  thread_local std::vector<float> wide;
  const int64_t n = w.shape[0] * w.shape[1];
  wide.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) wide[static_cast<size_t>(i)] = w.element(i);
  return wide.data();
}

frt_moe_args moe_args(const ExpertBank& bank, const TensorView& x, const Routing& r,
                      const TensorView& y) {
  frt_moe_args a{};
  a.x_dtype = abi_dtype(x.dtype);
  a.y_dtype = abi_dtype(y.dtype);
  a.act = static_cast<int32_t>(bank.activation());
  a.top_k = static_cast<int32_t>(r.index.shape[1]);
  a.m = x.shape[0];
  a.x = x.data;
  a.ldx = x.shape[0] > 1 ? x.strides[0] : bank.hidden();
  a.y = y.data;
  a.ldy = y.shape[0] > 1 ? y.strides[0] : bank.hidden();
  a.index = static_cast<const int64_t*>(r.index.data);
  a.weight = routing_weights(r.weights);
  a.experts = bank.experts();
  a.gate = bank.gate_views();
  a.up = bank.up_views();
  a.down = bank.down_views();
  return a;
}

// The routing's own form: i64 indices and f32/bf16 weights, [rows, top_k], contiguous.
std::string routing_refusal(const TensorView& x, const Routing& r) {
  const auto compact = [&](const TensorView& t) {
    return t.rank == 2 && t.shape[0] == x.shape[0] && t.shape[1] >= 1 && t.strides[1] == 1 &&
           (t.shape[0] <= 1 || t.strides[0] == t.shape[1]);
  };
  if (r.index.rank == 2 && r.index.shape[1] == 0) return "routing picks no expert (top-0)";
  if (r.index.data == nullptr || r.weights.data == nullptr) return "routing: no index or weights";
  if (r.index.dtype != DType::i64)
    return "routing index " + r.index.describe() + ": expected int64 expert indices";
  if (r.weights.dtype != DType::f32 && r.weights.dtype != DType::bf16)
    return "routing weights " + r.weights.describe() + ": expected f32 or bf16";
  if (!compact(r.index) || !compact(r.weights) || r.index.shape[1] != r.weights.shape[1])
    return "routing index " + r.index.describe() + ", weights " + r.weights.describe() +
           ": expected contiguous [" + std::to_string(x.shape[0]) + ", top_k] each";
  return "";
}

// The four views of a sequence attention as the op's strides: [batch, heads, positions, dims]
// with dims contiguous, every view bf16 and its sizes agreeing with q's.
std::string attention_view_refusal(const char* what, const TensorView& t, int64_t batch,
                                   int64_t positions, int64_t dims) {
  std::ostringstream s;
  if (t.data == nullptr) {
    s << what << ": no data";
  } else if (t.rank != 4) {
    s << what << ' ' << t.describe() << ": expected a 4-D [batch, heads, positions, head_dim] view";
  } else if (t.dtype != DType::bf16) {
    s << what << ' ' << t.describe() << ": takes bf16";
  } else if (t.shape[0] != batch || t.shape[2] != positions || t.shape[3] != dims) {
    s << what << ' ' << t.describe() << ": expected batch " << batch << ", " << positions
      << " positions of " << dims;
  } else if (t.strides[3] != 1) {
    s << what << ' ' << t.describe() << ": head_dim not contiguous";
  }
  return s.str();
}

frt_sequence_attention_args sequence_attention_args(const SequenceAttention& a) {
  frt_sequence_attention_args r{};
  r.batch = a.q.shape[0];
  r.heads = a.q.shape[1];
  r.kv_heads = a.k.shape[1];
  r.head_dim = a.q.shape[3];
  r.q_len = a.q.shape[2];
  r.kv_len = a.k.shape[2];
  r.dtype = abi_dtype(a.q.dtype);
  const auto strides = [](const TensorView& t, int64_t ld[3]) {
    ld[0] = t.strides[0], ld[1] = t.strides[2], ld[2] = t.strides[1];
  };
  r.q = a.q.data;
  strides(a.q, r.q_ld);
  r.k = a.k.data;
  strides(a.k, r.k_ld);
  r.v = a.v.data;
  strides(a.v, r.v_ld);
  r.out = a.out.data;
  strides(a.out, r.out_ld);
  r.scale = a.scale;
  return r;
}

}  // namespace

ExpertBank::ExpertBank(std::vector<PackedLinear> gate, std::vector<PackedLinear> up,
                       std::vector<PackedLinear> down, Activation act)
    : gate_(std::move(gate)), up_(std::move(up)), down_(std::move(down)), act_(act) {
  if (gate_.empty() || up_.size() != gate_.size() || down_.size() != gate_.size())
    throw InvalidArgument("ExpertBank: " + std::to_string(gate_.size()) + " gate, " +
                          std::to_string(up_.size()) + " up and " + std::to_string(down_.size()) +
                          " down packs; expected one of each per expert, at least one expert");
  const PackedLinear& g0 = gate_.front();
  for (size_t e = 0; e < gate_.size(); ++e) {
    for (const PackedLinear* w : {&gate_[e], &up_[e], &down_[e]})
      if (w->format() != g0.format() || w->group() != g0.group() ||
          w->view().scale_dtype != g0.view().scale_dtype)
        throw InvalidArgument("ExpertBank: expert " + std::to_string(e) + " holds " + w->form() +
                              ", expert 0 " + g0.form());
    if (gate_[e].n() != g0.n() || gate_[e].k() != g0.k() || up_[e].n() != g0.n() ||
        up_[e].k() != g0.k() || down_[e].n() != g0.k() || down_[e].k() != g0.n())
      throw InvalidArgument("ExpertBank: expert " + std::to_string(e) +
                            "'s shapes differ from expert 0's");
  }
  // Note [A bank in one region]
  // An expert's matrix is ~1-2 MiB packed, and a call streams the top-k experts' matrices in
  // whichever order routing picks. When packs below 2 MiB lay in 4 KiB pages, each was a TLB miss
  // (two page-table walks under a hypervisor) every 4 KiB, so the bank moves every pack into one
  // region, expert after expert (gate, up, down), in huge pages wherever the system gives them;
  // the packs' values and views are otherwise unchanged. On Zen 4 (THP "madvise") a
  // Qwen3-30B-A3B bank's call at one row ran 4-5% faster so (w8 and w4, paired). Every pack now
  // lies in huge pages (Note [Weights in huge pages]); the region still keeps a bank's bytes
  // together and its experts in the order they are packed.
  int64_t total = 0;
  for (size_t e = 0; e < gate_.size(); ++e)
    total += gate_[e].region_bytes() + up_[e].region_bytes() + down_[e].region_bytes();
  region_.reset(alloc_weight_memory(total));
  auto* at = static_cast<char*>(region_.get());
  for (size_t e = 0; e < gate_.size(); ++e) {
    for (PackedLinear* w : {&gate_[e], &up_[e], &down_[e]}) {
      const int64_t bytes = w->region_bytes();
      w->relocate(at);
      at += bytes;
    }
    gate_views_.push_back(gate_[e].view());
    up_views_.push_back(up_[e].view());
    down_views_.push_back(down_[e].view());
  }
}

void ExpertBank::FreeRegion::operator()(void* p) const { free_weight_memory(p); }

int64_t ExpertBank::expert_nbytes() const {
  return gate_.front().nbytes() + up_.front().nbytes() + down_.front().nbytes();
}

int64_t ExpertBank::nbytes() const { return expert_nbytes() * experts(); }

std::string moe_refusal(const frt_kernel_table& table, const ExpertBank& bank, const TensorView& x,
                        const Routing& routing, const TensorView& y) {
  const frt_op* op = find_op(table, OpKind::moe_ffn);
  if (op == nullptr) return not_owned(table, OpKind::moe_ffn);
  for (const std::string& r : {matrix_refusal("input", x, bank.hidden()),
                               matrix_refusal("output", y, bank.hidden()), rows_refusal(x, y)})
    if (!r.empty()) return r;
  if (std::string r = routing_refusal(x, routing); !r.empty()) return r;
  return op_refusal(*op, moe_args(bank, x, routing, y), [&] {
    return std::to_string(bank.experts()) + " experts, " + bank.form() + ", input " + x.describe();
  });
}

void detail::run_moe_unchecked(const frt_kernel_table& table, Parallel& pool,
                               const ExpertBank& bank, const TensorView& x, const Routing& routing,
                               const TensorView& y, int threads) {
  frt_moe_args a = moe_args(bank, x, routing, y);
  run_phases(pool, threads, *find_op(table, OpKind::moe_ffn), a);
}

void run_moe(const frt_kernel_table& table, Parallel& pool, const ExpertBank& bank,
             const TensorView& x, const Routing& routing, const TensorView& y, int threads) {
  if (std::string why = moe_refusal(table, bank, x, routing, y); !why.empty()) throw Refused(why);
  detail::run_moe_unchecked(table, pool, bank, x, routing, y, threads);
}

const frt_op* find_op(const frt_kernel_table& table, OpKind kind) {
  for (int32_t i = 0; i < table.n_ops; ++i)
    if (table.ops[i].kind == static_cast<int32_t>(kind)) return &table.ops[i];
  return nullptr;
}

std::string form_refusal(const frt_kernel_table& table, const frt_op_desc& desc) {
  if (find_op(table, static_cast<OpKind>(desc.op)) == nullptr)
    return not_owned(table, static_cast<OpKind>(desc.op));
  frt_error err{};
  if (table.supports_op(&desc, &err) != FRT_REASON_OK) return err.message;
  return "";
}

std::string linear_refusal(const frt_kernel_table& table, const PackedLinear& w,
                           const TensorView& x, const TensorView& y) {
  const frt_op* op = find_op(table, OpKind::linear);
  if (op == nullptr) return not_owned(table, OpKind::linear);
  for (const std::string& r :
       {matrix_refusal("input", x, w.k()), matrix_refusal("output", y, w.n()), rows_refusal(x, y)})
    if (!r.empty()) return r;
  return op_refusal(*op, linear_args(w, nullptr, x, y), [&] {
    return w.form() + " " + std::to_string(w.n()) + "x" + std::to_string(w.k()) + ", input " +
           x.describe();
  });
}

void detail::run_linear_unchecked(const frt_kernel_table& table, Parallel& pool,
                                  const PackedLinear& w, const float* bias, const TensorView& x,
                                  const TensorView& y, int threads) {
  frt_linear_args a = linear_args(w, bias, x, y);
  run_phases(pool, threads, *find_op(table, OpKind::linear), a);
}

void run_linear(const frt_kernel_table& table, Parallel& pool, const PackedLinear& w,
                const float* bias, const TensorView& x, const TensorView& y, int threads) {
  if (std::string why = linear_refusal(table, w, x, y); !why.empty()) throw Refused(why);
  detail::run_linear_unchecked(table, pool, w, bias, x, y, threads);
}

// Note [Projection groups]: a decode step's projections are small (1-3 MiB on Qwen3-0.6B: 16-50
// us at 65 GB/s), and each call paid a parallel region per phase, a first phase (quantizing one
// activation row) on one thread while the others waited, and the tail of the slower thread:
// the layer's projections read 68-72% of the bandwidth where the 157 MiB head read 89%. A group
// runs every call's phase p in one region, back to back on each thread. Each call's thread
// indices are rotated by its place in the group (a valid split is any numbering of the team),
// so the one-row phase 0s of q, k and v land on different threads; and a thread done with its
// share of one weight starts on the next one's while its partner finishes. Phases keep the ABI's
// order per call: all of phase p before any of p + 1.
void run_linears(Parallel& pool, const std::vector<LinearCall>& calls) {
  std::vector<frt_linear_args> args;
  std::vector<const frt_op*> ops;
  args.reserve(calls.size());
  int64_t total = 0;
  std::vector<int64_t> offsets;
  int32_t phases = 0;
  for (const LinearCall& c : calls) {
    if (std::string why = linear_refusal(*c.table, *c.w, c.x, c.y); !why.empty())
      throw Refused(why);
    const frt_op* op = find_op(*c.table, OpKind::linear);
    ops.push_back(op);
    args.push_back(linear_args(*c.w, c.bias, c.x, c.y));
    offsets.push_back(total);
    if (op->workspace != nullptr) total += (op->workspace(&args.back()) + 63) / 64 * 64;
    phases = std::max(phases, op->phases);
  }
  auto* space = static_cast<char*>(total > 0 ? workspace(total) : nullptr);
  for (size_t j = 0; j < calls.size(); ++j)
    args[j].workspace = ops[j]->workspace != nullptr ? space + offsets[j] : nullptr;
  const int n = static_cast<int>(calls.size());
  for (int32_t phase = 0; phase < phases; ++phase)
    detail::run_on_threads(
        pool, pool.size(), "kernel failed", [&](int ith, int team, frt_error* err) {
          for (int j = 0; j < n; ++j) {
            if (phase >= ops[j]->phases) continue;
            if (int32_t st = ops[j]->run(&args[j], phase, (ith + j) % team, team, err);
                st != FRT_OK)
              return st;
          }
          return static_cast<int32_t>(FRT_OK);
        });
}

std::string ffn_refusal(const frt_kernel_table& table, const FfnOperands& f, const TensorView& x,
                        const TensorView& y) {
  const frt_op* op = find_op(table, f.kind());
  if (op == nullptr) return not_owned(table, f.kind());
  for (const std::string& r : {matrix_refusal("input", x, f.up->k()),
                               matrix_refusal("output", y, f.down->n()), rows_refusal(x, y)})
    if (!r.empty()) return r;
  return op_refusal(*op, ffn_args(f, x, y),
                    [&] { return f.up->form() + ", input " + x.describe(); });
}

void detail::run_ffn_unchecked(const frt_kernel_table& table, Parallel& pool, const FfnOperands& f,
                               const TensorView& x, const TensorView& y, int threads) {
  frt_ffn_args a = ffn_args(f, x, y);
  run_phases(pool, threads, *find_op(table, f.kind()), a);
}

void run_ffn(const frt_kernel_table& table, Parallel& pool, const FfnOperands& f,
             const TensorView& x, const TensorView& y, int threads) {
  if (std::string why = ffn_refusal(table, f, x, y); !why.empty()) throw Refused(why);
  detail::run_ffn_unchecked(table, pool, f, x, y, threads);
}

void choose_experts(float* logits, int64_t rows, int64_t experts, int64_t k, bool renormalise,
                    int64_t* index, float* weight) {
  for (int64_t r = 0; r < rows; ++r) {
    float* p = logits + r * experts;
    float top = p[0];
    for (int64_t e = 1; e < experts; ++e) top = std::max(top, p[e]);
    float sum = 0;
    for (int64_t e = 0; e < experts; ++e) sum += (p[e] = std::exp(p[e] - top));
    for (int64_t e = 0; e < experts; ++e) p[e] /= sum;
    int64_t* chosen = index + r * k;
    float* w = weight + r * k;
    // k passes, each taking the largest probability not yet taken (the lower expert, on a tie).
    float total = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t e = 0; e < experts; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j && !taken; ++i) taken = chosen[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = e;
      }
      chosen[j] = best;
      w[j] = p[best];
      total += p[best];
    }
    if (renormalise)
      for (int64_t j = 0; j < k; ++j) w[j] /= total;
  }
}

void mix_shared_expert(const float* gate_logits, const float* shared, int64_t rows, int64_t hidden,
                       float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float s = 1.0f / (1.0f + std::exp(-gate_logits[r]));
    for (int64_t c = 0; c < hidden; ++c) y[r * hidden + c] += s * shared[r * hidden + c];
  }
}

std::string sequence_attention_refusal(const frt_kernel_table& table, const SequenceAttention& a) {
  const frt_op* op = find_op(table, OpKind::sequence_attention);
  if (op == nullptr) return not_owned(table, OpKind::sequence_attention);
  // In this order each view's rank is checked before a later one reads its sizes (a view's
  // sizes past its rank are 0).
  const int64_t batch = a.q.shape[0], dims = a.q.shape[3];
  for (const std::string& r : {attention_view_refusal("query", a.q, batch, a.q.shape[2], dims),
                               attention_view_refusal("key", a.k, batch, a.k.shape[2], dims),
                               attention_view_refusal("value", a.v, batch, a.k.shape[2], dims),
                               attention_view_refusal("output", a.out, batch, a.q.shape[2], dims)})
    if (!r.empty()) return r;
  if (a.v.shape[1] != a.k.shape[1] || a.out.shape[1] != a.q.shape[1])
    return "value " + a.v.describe() + " / output " + a.out.describe() +
           ": heads differ from the key's / the query's";
  return op_refusal(*op, sequence_attention_args(a),
                    [&] { return "query " + a.q.describe() + ", key " + a.k.describe(); });
}

void run_sequence_attention(const frt_kernel_table& table, Parallel& pool,
                            const SequenceAttention& a, int threads) {
  if (std::string why = sequence_attention_refusal(table, a); !why.empty()) throw Refused(why);
  frt_sequence_attention_args args = sequence_attention_args(a);
  run_phases(pool, threads, *find_op(table, OpKind::sequence_attention), args);
}

}  // namespace frt
