// The function seats: a module's gated delta rule and its causal convolution, replaced where the
// module calls them, its attention and rotary functions, and a norm module's forward. None packs a
// weight; each call's views are checked against the dims the plan bound (the core's part), then
// against the kernel's own per-call supports().
#include <flashrt/errors.h>
#include <flashrt/seat.h>
#include <flashrt/thread_pool.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>

#include "runtime/run_on_threads.h"

namespace frt {
namespace {

std::string shape_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// "" when `t` has rank dims.size() and those dims (-1: any), else what differs.
std::string shape_refusal(const char* what, const TensorView& t, const std::vector<int64_t>& dims) {
  bool ok = t.data != nullptr && t.rank == static_cast<int>(dims.size());
  for (size_t i = 0; ok && i < dims.size(); ++i) ok = dims[i] < 0 || t.shape[i] == dims[i];
  if (ok) return "";
  return std::string(what) + " " + (t.data == nullptr ? "missing" : t.describe()) + ", expected " +
         shape_text(dims);
}

bool contiguous(const TensorView& t) {
  int64_t expect = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    if (t.shape[i] != 1 && t.strides[i] != expect) return false;
    expect *= t.shape[i];
  }
  return true;
}

// Runs a single-phase op of the table on the process's team, after its own per-call check.
template <typename Args>
std::string kernel_refusal(const frt_kernel_table& table, OpKind kind, const Args& a) {
  const frt_op* op = find_op(table, kind);
  if (op == nullptr) return std::string(table.package) + " owns no " + name_of(kind) + " op";
  frt_error err{};
  if (op->supports(&a, &err) != FRT_REASON_OK) return err.message;
  return "";
}

template <typename Args>
void run_single(const frt_kernel_table& table, OpKind kind, const Args& a) {
  const frt_op& op = *find_op(table, kind);
  detail::run_on_threads(
      process_parallel(), process_parallel().size(), "kernel failed",
      [&](int ith, int n, frt_error* err) { return op.run(&a, 0, ith, n, err); });
}

frt_gated_delta_args delta_args(const GatedDeltaCall& c) {
  frt_gated_delta_args a{};
  a.batch = c.q.shape[0];
  a.tokens = c.q.shape[1];
  a.k_heads = c.q.shape[2];
  a.k_dim = c.q.shape[3];
  a.v_heads = c.v.shape[2];
  a.v_dim = c.v.shape[3];
  a.x_dtype = abi_dtype(c.q.dtype);
  a.beta_dtype = abi_dtype(c.beta.dtype);
  a.l2norm = c.l2norm ? 1 : 0;
  a.l2_eps = 1e-6f;
  a.scale = c.scale;
  a.q = c.q.data;
  a.k = c.k.data;
  a.v = c.v.data;
  for (int i = 0; i < 3; ++i) {
    a.q_ld[i] = c.q.strides[i];
    a.k_ld[i] = c.k.strides[i];
    a.v_ld[i] = c.v.strides[i];
  }
  a.q_inc = c.q.strides[3];
  a.k_inc = c.k.strides[3];
  a.v_inc = c.v.strides[3];
  a.g = static_cast<const float*>(c.g.data);
  a.g_ld[0] = c.g.strides[0];
  a.g_ld[1] = c.g.strides[1];
  a.beta = c.beta.data;
  a.beta_ld[0] = c.beta.strides[0];
  a.beta_ld[1] = c.beta.strides[1];
  a.initial_state = c.initial_state ? static_cast<const float*>(c.initial_state->data) : nullptr;
  a.final_state = static_cast<float*>(c.final_state.data);
  a.out = c.out.data;
  return a;
}

frt_causal_conv1d_args conv_args(const ConvCall& c) {
  frt_causal_conv1d_args a{};
  a.batch = c.x.shape[0];
  a.channels = c.x.shape[1];
  a.tokens = c.x.shape[2];
  a.kernel = c.weight.shape[1];
  a.dtype = abi_dtype(c.x.dtype);
  a.act = c.activated ? static_cast<int32_t>(c.activation) : -1;
  a.x = c.x.data;
  a.weight = c.weight.data;
  a.bias = c.bias ? c.bias->data : nullptr;
  a.state = c.state ? c.state->data : nullptr;
  a.state_len = c.state ? c.state->shape[2] : 0;
  a.y = c.y.data;
  for (int i = 0; i < 3; ++i) {
    a.x_ld[i] = c.x.strides[i];
    a.y_ld[i] = c.y.strides[i];
    a.state_ld[i] = c.state ? c.state->strides[i] : 0;
  }
  return a;
}

// What the scan of one row of a mask found (Note [Mask as a range]).
enum class MaskRange { one, unapplied, holes, empty };

// The one range [first, last) of a row's attended positions: `mark(t)` is 0 where position t is
// attended, 1 where it is hidden, -1 where the mask holds a value the op cannot apply. Both masks
// the attention seat reads, a decode row's and a sequence's key padding, scan this way.
template <typename Mark>
MaskRange attended_range(int64_t positions, const Mark& mark, int64_t& first, int64_t& last) {
  first = -1;
  last = positions;
  for (int64_t t = 0; t < positions; ++t) {
    const int m = mark(t);
    if (m < 0) return MaskRange::unapplied;
    if (m == 1) {
      if (first >= 0 && last == positions) last = t;
    } else if (first < 0) {
      first = t;
    } else if (last != positions) {
      return MaskRange::holes;
    }
  }
  return first < 0 ? MaskRange::empty : MaskRange::one;
}

}  // namespace

std::string GatedDeltaSeat::call_refusal(const GatedDeltaCall& c) const {
  const int64_t hk = dims_.at("k_heads"), hv = dims_.at("v_heads"), dk = dims_.at("k_dim"),
                dv = dims_.at("v_dim");
  if (std::string why = shape_refusal("q", c.q, {-1, -1, hk, dk}); !why.empty()) return why;
  const int64_t b = c.q.shape[0], t = c.q.shape[1];
  for (auto [what, view, dims] :
       {std::tuple{"k", &c.k, std::vector<int64_t>{b, t, hk, dk}},
        std::tuple{"v", &c.v, std::vector<int64_t>{b, t, hv, dv}},
        std::tuple{"g", &c.g, std::vector<int64_t>{b, t, hv}},
        std::tuple{"beta", &c.beta, std::vector<int64_t>{b, t, hv}},
        std::tuple{"out", &c.out, std::vector<int64_t>{b, t, hv, dv}},
        std::tuple{"final state", &c.final_state, std::vector<int64_t>{b, hv, dk, dv}}})
    if (std::string why = shape_refusal(what, *view, dims); !why.empty()) return why;
  if (c.initial_state)
    if (std::string why = shape_refusal("initial state", *c.initial_state, {b, hv, dk, dv});
        !why.empty())
      return why;
  for (auto [what, view] : {std::pair{"q", &c.q}, std::pair{"k", &c.k}, std::pair{"v", &c.v}}) {
    if (view->dtype != c.q.dtype)
      return std::string(what) + " " + view->describe() + ": q, k and v differ in dtype";
    // A head's elements may stand apart (a host's [batch, channels, tokens] convolution output,
    // transposed): the kernel gathers them. Overlapping or reversed ones it does not take.
    if (view->strides[3] < 1 || (view->shape[2] > 1 && view->strides[2] < 1))
      return std::string(what) + " " + view->describe() + ": strides the kernel does not read";
  }
  if (c.g.dtype != DType::f32) return "g " + c.g.describe() + ": the decay is read in fp32";
  if (c.g.strides[2] != 1 || c.beta.strides[2] != 1)
    return "g / beta: heads not contiguous (" + c.g.describe() + ", " + c.beta.describe() + ")";
  if (c.out.dtype != c.q.dtype || !contiguous(c.out))
    return "out " + c.out.describe() + ": expected contiguous, in q's dtype";
  for (const TensorView* s : {c.initial_state ? &*c.initial_state : nullptr, &c.final_state})
    if (s != nullptr && (s->dtype != DType::f32 || !contiguous(*s)))
      return "state " + s->describe() + ": the state is contiguous fp32";
  return kernel_refusal(table_, OpKind::gated_delta, delta_args(c));
}

Verdict GatedDeltaSeat::call(const GatedDeltaCall& c, bool training) {
  return run_call(
      training, c.q.dtype, [&] { return call_refusal(c); },
      [&] { run_single(table_, OpKind::gated_delta, delta_args(c)); });
}

std::string ConvSeat::call_refusal(const ConvCall& c) const {
  if (std::string why = shape_refusal("x", c.x, {-1, channels_, -1}); !why.empty()) return why;
  const int64_t b = c.x.shape[0], t = c.x.shape[2];
  if (std::string why = shape_refusal("weight", c.weight, {channels_, taps_}); !why.empty())
    return why;
  if (std::string why = shape_refusal("y", c.y, {b, channels_, t}); !why.empty()) return why;
  if (c.bias)
    if (std::string why = shape_refusal("bias", *c.bias, {channels_}); !why.empty()) return why;
  if (c.state)
    if (std::string why = shape_refusal("state", *c.state, {b, channels_, -1}); !why.empty())
      return why;
  for (const TensorView* v :
       {&c.weight, &c.y, c.bias ? &*c.bias : nullptr, c.state ? &*c.state : nullptr})
    if (v != nullptr && v->dtype != c.x.dtype)
      return "x " + c.x.describe() + " and " + v->describe() + " differ in dtype";
  if (!contiguous(c.weight) || (c.bias && !contiguous(*c.bias)))
    return "weight " + c.weight.describe() + ": expected contiguous";
  // Written in place by several threads: its elements must not overlap (an expanded state).
  if (c.state && !contiguous(*c.state))
    return "state " + c.state->describe() + ": expected contiguous";
  if (c.activated && c.activation != Activation::silu)
    return std::string("activation ") + name_of(c.activation) + "; the op applies silu or none";
  return kernel_refusal(table_, OpKind::causal_conv1d, conv_args(c));
}

Verdict ConvSeat::call(const ConvCall& c, bool training) {
  return run_call(
      training, c.x.dtype, [&] { return call_refusal(c); },
      [&] { run_single(table_, OpKind::causal_conv1d, conv_args(c)); });
}

std::string NormSeat::refusal(const TensorView& x, const TensorView& y,
                              const Routing* routing) const {
  if (routing != nullptr) return "a norm takes no routing";
  const int64_t width = static_cast<int64_t>(weight_.size());
  if (x.rank != 2 || x.shape[1] != width || x.strides[1] != 1 ||
      (x.shape[0] > 1 && x.strides[0] < width))
    return "input " + x.describe() + ": expected rows of " + std::to_string(width) + " contiguous";
  if (y.rank != 2 || y.shape[0] != x.shape[0] || y.shape[1] != width || y.strides[1] != 1 ||
      (y.shape[0] > 1 && y.strides[0] < width) || y.dtype != DType::f32)
    return "output " + y.describe() + ": expected f32 rows of " + std::to_string(width);
  if (x.dtype != DType::f32) return "input " + x.describe() + ": the op reads f32";
  return "";
}

void NormSeat::execute(const TensorView& x, const TensorView& y, const Routing*) {
  frt_rmsnorm_args a{};
  a.rows = x.shape[0];
  a.width = x.shape[1];
  a.x = static_cast<const float*>(x.data);
  a.ldx = x.strides[0];
  a.weight = weight_.data();
  a.eps = eps_;
  a.y = static_cast<float*>(y.data);
  a.ldy = y.strides[0];
  // A decode row's norm is a few microseconds of work: waking the team would cost more.
  if (a.rows * a.width <= (int64_t{1} << 16)) {
    const frt_op& op = *find_op(table_, OpKind::rmsnorm);
    frt_error err{};
    if (op.run(&a, 0, 0, 1, &err) != FRT_OK)
      throw InvalidArgument(std::string("kernel failed: ") + err.message);
    return;
  }
  run_single(table_, OpKind::rmsnorm, a);
}

// Note [Mask as a range]: the attention op reads a run of consecutive cached positions, so a mask
// is taken when each row's attended positions are one range: [first, last) is then what the op
// reads, starting first positions into the cache. That covers what hosts pass for decode rows: a
// causal mask over a preallocated (static) cache hides the positions after the last written one,
// left padding hides a prefix, a sliding window hides everything before it. A float mask must
// hold exactly 0 where attended and -inf or the f32 lowest where hidden (a bias of other values,
// ALiBi's, is a form the op does not compute). Scanning it is positions bytes per row, against
// the heads x positions x head_dim the op reads.
std::string AttentionSeat::attended(const AttentionCall& c, int64_t r, int64_t& first,
                                    int64_t& last) const {
  const int64_t positions = c.k.shape[2];
  first = 0;
  last = positions;
  if (!c.mask) return "";
  const TensorView& m = *c.mask;
  const char* base = static_cast<const char*>(m.data);
  const int64_t size = m.dtype == DType::boolean ? 1 : 4;
  const int64_t row = m.shape[0] == 1 ? 0 : r;
  const auto mark = [&](int64_t t) {
    const char* p = base + (row * m.strides[0] + t * m.strides[3]) * size;
    if (m.dtype == DType::boolean) return *reinterpret_cast<const uint8_t*>(p) == 0 ? 1 : 0;
    float v;
    std::memcpy(&v, p, sizeof v);
    if (v == 0.0f) return 0;
    return v == -std::numeric_limits<float>::infinity() || v == std::numeric_limits<float>::lowest()
               ? 1
               : -1;
  };
  switch (attended_range(positions, mark, first, last)) {
    case MaskRange::one:
      return "";
    case MaskRange::unapplied:
      return "the mask adds values other than 0 and -inf (a bias)";
    case MaskRange::holes:
      return "the mask's attended positions are not one range (row " + std::to_string(r) + ")";
    case MaskRange::empty:
      break;
  }
  return "the mask hides every position (row " + std::to_string(r) + ")";
}

std::string AttentionSeat::grouping_refusal(float scale, float softcap) const {
  if (!(scale > 0) || !(softcap >= 0))
    return "scale " + std::to_string(scale) + ", softcap " + std::to_string(softcap) +
           ": expected a positive scale and a softcap >= 0";
  if (kv_heads_ < 1 || heads_ % kv_heads_ != 0)
    return std::to_string(heads_) + " query heads over " + std::to_string(kv_heads_) +
           " kv heads: not whole groups";
  return "";
}

std::string AttentionSeat::call_refusal(const AttentionCall& c) const {
  if (std::string why = shape_refusal("q", c.q, {-1, heads_, 1, dim_}); !why.empty()) return why;
  const int64_t b = c.q.shape[0];
  if (std::string why = shape_refusal("k", c.k, {b, kv_heads_, -1, dim_}); !why.empty()) return why;
  const int64_t positions = c.k.shape[2];
  if (std::string why = shape_refusal("v", c.v, {b, kv_heads_, positions, dim_}); !why.empty())
    return why;
  if (std::string why = shape_refusal("out", c.out, {b, 1, heads_, dim_}); !why.empty()) return why;
  if (positions < 1) return "k " + c.k.describe() + ": no positions to attend";
  for (const TensorView* t : {&c.q, &c.k, &c.v, &c.out})
    if (t->dtype != DType::f32) return t->describe() + ": the op reads and writes f32";
  if (c.q.strides[3] != 1 || (heads_ > 1 && c.q.strides[1] != dim_))
    return "q " + c.q.describe() + ": a row's heads are not head_dim apart";
  for (const TensorView* t : {&c.k, &c.v})
    if (t->strides[3] != 1 || t->strides[2] < dim_ || (kv_heads_ > 1 && t->strides[1] < dim_))
      return t->describe() + ": strides the op does not read (head_dim contiguous, positions " +
             "and heads apart)";
  if (c.k.strides[1] != c.v.strides[1] || c.k.strides[2] != c.v.strides[2])
    return "k " + c.k.describe() + " and v " + c.v.describe() + " differ in layout";
  if (!contiguous(c.out)) return "out " + c.out.describe() + ": expected contiguous";
  if (std::string why = grouping_refusal(c.scale, c.softcap); !why.empty()) return why;
  const OpKind op = c.softcap > 0 ? OpKind::capped_attention : OpKind::attention;
  if (find_op(table_, op) == nullptr)
    return std::string(table_.package) + " owns no " + name_of(op) + " op";
  if (c.mask) {
    const TensorView& m = *c.mask;
    if (m.rank != 4 || (m.shape[0] != 1 && m.shape[0] != b) || m.shape[1] != 1 || m.shape[2] != 1 ||
        m.shape[3] != positions || (m.dtype != DType::boolean && m.dtype != DType::f32))
      return "mask " + m.describe() + ": expected bool or f32 [" + std::to_string(b) +
             " or 1, 1, 1, " + std::to_string(positions) + "]";
    for (int64_t r = 0; r < b; ++r) {
      int64_t first = 0, last = 0;
      if (std::string why = attended(c, r, first, last); !why.empty()) return why;
    }
  }
  return "";
}

void AttentionSeat::run_rows(const AttentionCall& c) {
  const int64_t positions = c.k.shape[2];
  const size_t need = static_cast<size_t>(heads_ * positions);
  if (scores_.size() < need) scores_.resize(need + need / 2);  // a cache grows a row a step
  for (int64_t r = 0; r < c.q.shape[0]; ++r) {
    int64_t first = 0, last = positions;
    attended(c, r, first, last);  // call_refusal() found every row's range readable
    frt_attention_args a{};
    a.heads = heads_;
    a.kv_heads = kv_heads_;
    a.head_dim = dim_;
    a.positions = last - first;
    a.q = static_cast<const float*>(c.q.data) + r * c.q.strides[0];
    a.k_cache = static_cast<const float*>(c.k.data) + r * c.k.strides[0] + first * c.k.strides[2];
    a.v_cache = static_cast<const float*>(c.v.data) + r * c.v.strides[0] + first * c.v.strides[2];
    a.scale = c.scale;
    a.out = static_cast<float*>(c.out.data) + r * heads_ * dim_;
    a.scores = scores_.data();
    a.scores_stride = positions;
    a.ld_pos = c.k.strides[2];
    a.ld_head = kv_heads_ > 1 ? c.k.strides[1] : dim_;
    if (c.softcap > 0) {
      frt_capped_attention_args capped{};
      capped.attention = a;
      capped.softcap = c.softcap;
      run_single(table_, OpKind::capped_attention, capped);
    } else {
      run_single(table_, OpKind::attention, a);
    }
  }
}

Verdict AttentionSeat::call(const AttentionCall& c, bool training) {
  return run_call(
      training, c.q.dtype, [&] { return call_refusal(c); }, [&] { run_rows(c); });
}

std::string AttentionSeat::paged_refusal(const PagedAttentionCall& c) const {
  if (std::string why = shape_refusal("q", c.q, {-1, heads_, dim_}); !why.empty()) return why;
  const int64_t b = c.q.shape[0];
  if (b < 1) return "q " + c.q.describe() + ": no rows";
  for (const auto& [what, pool] :
       {std::pair{"k_pool", &c.k_pool}, std::pair{"v_pool", &c.v_pool}}) {
    if (std::string why = shape_refusal(what, *pool, {-1, kv_heads_, dim_}); !why.empty())
      return why;
    if (pool->dtype != DType::f32 && pool->dtype != DType::bf16)
      return std::string(what) + " " + pool->describe() + ": the op reads f32 or bf16 pools";
    if (pool->strides[2] != 1 || pool->strides[0] < dim_ ||
        (kv_heads_ > 1 && pool->strides[1] < dim_))
      return std::string(what) + " " + pool->describe() +
             ": strides the op does not read (head_dim contiguous, slots and heads apart)";
  }
  if (c.k_pool.dtype != c.v_pool.dtype || c.k_pool.shape[0] != c.v_pool.shape[0] ||
      c.k_pool.strides[0] != c.v_pool.strides[0] ||
      (kv_heads_ > 1 && c.k_pool.strides[1] != c.v_pool.strides[1]))
    return "k_pool " + c.k_pool.describe() + " and v_pool " + c.v_pool.describe() +
           " differ in dtype or layout";
  if (c.q.dtype != DType::f32 || c.q.strides[2] != 1 || (heads_ > 1 && c.q.strides[1] != dim_) ||
      (b > 1 && c.q.strides[0] < heads_ * dim_))
    return "q " + c.q.describe() + ": expected f32 with a row's heads head_dim apart, rows apart";
  if (std::string why = shape_refusal("out", c.out, {b, heads_, dim_}); !why.empty()) return why;
  if (c.out.dtype != DType::f32 || !contiguous(c.out))
    return "out " + c.out.describe() + ": expected contiguous f32";
  if (std::string why = shape_refusal("table", c.table, {-1, -1}); !why.empty()) return why;
  if (c.table.dtype != DType::i32 || c.table.strides[1] != 1 || c.table.shape[1] < 1 ||
      (c.table.shape[0] > 1 && c.table.strides[0] < c.table.shape[1]))
    return "table " + c.table.describe() + ": expected int32 lines, positions contiguous";
  for (const auto& [what, v] : {std::pair{"rows", &c.rows}, std::pair{"lengths", &c.lengths}}) {
    if (std::string why = shape_refusal(what, *v, {b}); !why.empty()) return why;
    if (v->dtype != DType::i64 || (b > 1 && v->strides[0] != 1))
      return std::string(what) + " " + v->describe() + ": expected contiguous int64";
  }
  if (std::string why = grouping_refusal(c.scale, c.softcap); !why.empty()) return why;
  if (find_op(table_, OpKind::paged_attention) == nullptr)
    return std::string(table_.package) + " owns no paged_attention op";
  // Every slot a row reads lies in the pool: the engine's table is read, never trusted.
  const auto* rows = static_cast<const int64_t*>(c.rows.data);
  const auto* lengths = static_cast<const int64_t*>(c.lengths.data);
  const auto* table = static_cast<const int32_t*>(c.table.data);
  const int64_t slots = c.k_pool.shape[0];
  for (int64_t r = 0; r < b; ++r) {
    if (rows[r] < 0 || rows[r] >= c.table.shape[0] || lengths[r] < 1 ||
        lengths[r] > c.table.shape[1])
      return "row " + std::to_string(r) + ": table line " + std::to_string(rows[r]) + ", length " +
             std::to_string(lengths[r]) + " outside table " + c.table.describe();
    const int32_t* line = table + rows[r] * c.table.strides[0];
    for (int64_t t = 0; t < lengths[r]; ++t)
      if (line[t] < 0 || line[t] >= slots)
        return "row " + std::to_string(r) + ", position " + std::to_string(t) + ": slot " +
               std::to_string(line[t]) + " outside the pool of " + std::to_string(slots);
  }
  return "";
}

void AttentionSeat::run_paged(const PagedAttentionCall& c) {
  const int64_t b = c.q.shape[0];
  const auto* lengths = static_cast<const int64_t*>(c.lengths.data);
  const int64_t longest = *std::max_element(lengths, lengths + b);
  const size_t need = static_cast<size_t>(b * heads_ * longest);
  if (scores_.size() < need) scores_.resize(need + need / 2);  // the rows grow a position a step
  frt_paged_attention_args a{};
  a.batch = b;
  a.heads = heads_;
  a.kv_heads = kv_heads_;
  a.head_dim = dim_;
  a.cache_dtype = abi_dtype(c.k_pool.dtype);
  a.q = static_cast<const float*>(c.q.data);
  a.ld_q = b > 1 ? c.q.strides[0] : heads_ * dim_;  // one row: its stride is never used
  a.k_pool = c.k_pool.data;
  a.v_pool = c.v_pool.data;
  a.slots = c.k_pool.shape[0];
  a.ld_slot = c.k_pool.strides[0];
  a.ld_head = kv_heads_ > 1 ? c.k_pool.strides[1] : dim_;
  a.table = static_cast<const int32_t*>(c.table.data);
  a.table_lines = c.table.shape[0];
  a.table_width = c.table.shape[1];
  a.ld_table = c.table.shape[0] > 1 ? c.table.strides[0] : c.table.shape[1];
  a.rows = static_cast<const int64_t*>(c.rows.data);
  a.lengths = lengths;
  a.scale = c.scale;
  a.softcap = c.softcap;
  a.out = static_cast<float*>(c.out.data);
  a.ld_out = heads_ * dim_;
  a.scores = scores_.data();
  a.scores_stride = longest;
  run_single(table_, OpKind::paged_attention, a);
}

Verdict AttentionSeat::call_paged(const PagedAttentionCall& c, bool training) {
  // The seat is planned at the engine's precision, which its pool holds (q arrives in f32).
  return run_call(
      training, c.k_pool.dtype, [&] { return paged_refusal(c); }, [&] { run_paged(c); });
}

namespace {

// Note [Key padding as a range]: a DiT's processor hides a caption's padding with attn_mask
// [batch or 1, heads or 1, 1, keys]: the same keys for every query and head of a sequence. The op
// attends every key it is handed, so such a mask is taken when each sequence's attended keys are
// one range, which the op then reads alone. 0 (or bool true) attends; bool false, -inf and the
// lowest finite value hide exactly. diffusers writes a finite bias, -10000 (1 - mask), which is
// -9984 in bf16: torch's softmax gives such a key exp(s + bias - max), 0 in f32 whenever the
// key's score s is below the largest attended one by less than -bias - 104 (exp underflows past
// -104). The seat takes a bias of kHiddenBias or below only where the call's scores cannot
// differ by that much: |s| <= scale |q| |k|, so 2 scale max|q| max|k| must stay below it. Any
// other value (a bias the op does not add), a mask over queries, or keys of several ranges is
// refused. Scanning it is heads x keys values per sequence; the bound reads q and k once. A
// hidden key's k or v is never read, so a NaN there (which torch's 0 x NaN would spread) stays
// out of the result, as Note [Mask as a range] has it for decode rows. Sequences sharing one
// range run as one call.
constexpr float kHiddenBias = -1000.0f;
constexpr double kUnderflow = 104.0;  // exp(-104) is below f32's least denormal

// 0 attended, 1 hidden, -1 a bias the op does not apply; `bias` gets a finite hiding value.
int key_mark(const TensorView& m, int64_t offset, float& bias) {
  if (m.dtype == DType::boolean) return static_cast<const uint8_t*>(m.data)[offset] != 0 ? 0 : 1;
  const float v = m.element(offset);
  if (v == 0.0f) return 0;
  if (v == -std::numeric_limits<float>::infinity() || v == std::numeric_limits<float>::lowest())
    return 1;
  if (v <= kHiddenBias) {
    bias = std::max(bias, v);
    return 1;
  }
  return -1;
}

// The largest |row| over a [1, heads, tokens, dim] slice of a bf16 view.
double max_row_norm(const TensorView& t, int64_t b) {
  double most = 0;
  for (int64_t h = 0; h < t.shape[1]; ++h)
    for (int64_t i = 0; i < t.shape[2]; ++i) {
      const int64_t at = b * t.strides[0] + h * t.strides[1] + i * t.strides[2];
      double ss = 0;
      for (int64_t d = 0; d < t.shape[3]; ++d) {
        const double x = t.element(at + d);
        ss += x * x;
      }
      most = std::max(most, ss);
    }
  return std::sqrt(most);
}

// `t` moved `elements` on and its dim `dim` cut to `size` (a bf16 view).
TensorView slice_of(TensorView t, int64_t elements, int dim, int64_t size) {
  t.data = static_cast<uint16_t*>(t.data) + elements;
  t.shape[dim] = size;
  return t;
}

}  // namespace

std::string AttentionSeat::sequence_refusal(
    const SequenceAttention& c, const std::optional<TensorView>& mask,
    std::vector<std::pair<int64_t, int64_t>>& ranges) const {
  // The seat was planned for the heads its module's calls showed; the op checks the rest.
  if (std::string why = shape_refusal("q", c.q, {-1, heads_, -1, dim_}); !why.empty()) return why;
  if (std::string why = shape_refusal("k", c.k, {-1, kv_heads_, -1, dim_}); !why.empty())
    return why;
  // grouping, strides, dtype, the scale
  if (std::string why = sequence_attention_refusal(table_, c); !why.empty()) return why;
  ranges.clear();
  if (!mask) return "";
  const TensorView& m = *mask;
  const int64_t batch = c.q.shape[0], keys = c.k.shape[2];
  if (m.rank != 4 || (m.shape[0] != 1 && m.shape[0] != batch) ||
      (m.shape[1] != 1 && m.shape[1] != heads_) || m.shape[2] != 1 || m.shape[3] != keys ||
      (m.dtype != DType::boolean && m.dtype != DType::f32 && m.dtype != DType::bf16))
    return "attn_mask " + m.describe() + ": expected bool, f32 or bf16 [" + std::to_string(batch) +
           " or 1, " + std::to_string(heads_) + " or 1, 1, " + std::to_string(keys) +
           "] (the same keys for every query)";
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t row = m.shape[0] == 1 ? 0 : b * m.strides[0];
    float bias = -std::numeric_limits<float>::infinity();
    bool heads_differ = false;
    const auto mark = [&](int64_t t) {  // every head must hide the same keys
      const int first_head = key_mark(m, row + t * m.strides[3], bias);
      for (int64_t h = 1; h < m.shape[1] && first_head >= 0; ++h) {
        const int other = key_mark(m, row + h * m.strides[1] + t * m.strides[3], bias);
        if (other < 0) return -1;
        if (other != first_head) {
          heads_differ = true;
          return -1;
        }
      }
      return first_head;
    };
    int64_t first = 0, last = 0;
    switch (attended_range(keys, mark, first, last)) {
      case MaskRange::one:
        break;
      case MaskRange::unapplied:
        if (heads_differ)
          return "attn_mask " + m.describe() + ": heads hide different keys (sequence " +
                 std::to_string(b) + ")";
        return "attn_mask " + m.describe() + ": a bias other than 0 and values of " +
               std::to_string(static_cast<int>(kHiddenBias)) + " or below, which hide a key";
      case MaskRange::holes:
        return "attn_mask " + m.describe() + ": the attended keys are not one range (sequence " +
               std::to_string(b) + ")";
      case MaskRange::empty:
        return "attn_mask " + m.describe() + ": every key hidden (sequence " + std::to_string(b) +
               ")";
    }
    if (std::isfinite(bias)) {  // a finite bias hides only where the scores cannot outweigh it
      const double reach = 2.0 * std::fabs(c.scale) * max_row_norm(c.q, b) * max_row_norm(c.k, b);
      if (!(reach < -static_cast<double>(bias) - kUnderflow))
        return "attn_mask's bias " + std::to_string(bias) + " hides a key only while scores " +
               "differ by less than " + std::to_string(-bias - kUnderflow) +
               "; this call's may differ by " + std::to_string(reach);
    }
    ranges.emplace_back(first, last);
  }
  return "";
}

Verdict AttentionSeat::call_sequence(const SequenceAttention& c,
                                     const std::optional<TensorView>& mask, bool training) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  return run_call(
      training, c.q.dtype, [&] { return sequence_refusal(c, mask, ranges); },
      [&] {
        // Sequences [b0, b0 + n) over keys [first, last) in one call.
        const auto run = [&](int64_t b0, int64_t n, int64_t first, int64_t last) {
          SequenceAttention r = c;
          r.q = slice_of(c.q, b0 * c.q.strides[0], 0, n);
          r.out = slice_of(c.out, b0 * c.out.strides[0], 0, n);
          r.k = slice_of(slice_of(c.k, b0 * c.k.strides[0], 0, n), first * c.k.strides[2], 2,
                         last - first);
          r.v = slice_of(slice_of(c.v, b0 * c.v.strides[0], 0, n), first * c.v.strides[2], 2,
                         last - first);
          run_sequence_attention(table_, process_parallel(), r);
        };
        const int64_t batch = c.q.shape[0];
        if (ranges.empty()) return run(0, batch, 0, c.k.shape[2]);
        // Every sequence the same keys (a mask broadcast over the batch): one call; else one
        // call each over its own range of keys (Note [Key padding as a range]).
        if (std::all_of(ranges.begin(), ranges.end(),
                        [&](const auto& r) { return r == ranges[0]; }))
          return run(0, batch, ranges[0].first, ranges[0].second);
        for (int64_t b = 0; b < batch; ++b) run(b, 1, ranges[b].first, ranges[b].second);
      });
}

namespace {

// A [batch or 1, tokens, head_dim] table's row for (b, t).
const float* table_row(const TensorView& t, int64_t b, int64_t tok) {
  return static_cast<const float*>(t.data) + (t.shape[0] == 1 ? 0 : b * t.strides[0]) +
         tok * t.strides[1];
}

}  // namespace

std::string RotarySeat::call_refusal(const RotaryCall& c) const {
  if (std::string why = shape_refusal("q", c.q, {-1, heads_, -1, dim_}); !why.empty()) return why;
  const int64_t b = c.q.shape[0], tokens = c.q.shape[2];
  if (std::string why = shape_refusal("k", c.k, {b, kv_heads_, tokens, dim_}); !why.empty())
    return why;
  for (const auto& [what, out, heads] :
       {std::tuple{"q_out", &c.q_out, heads_}, std::tuple{"k_out", &c.k_out, kv_heads_}}) {
    if (std::string why = shape_refusal(what, *out, {b, heads, tokens, dim_}); !why.empty())
      return why;
    if (out->strides[3] != 1 || (heads > 1 && out->strides[1] != dim_))
      return std::string(what) + " " + out->describe() + ": a row's heads are not head_dim apart";
  }
  for (const auto& [what, t] : {std::pair{"cos", &c.cos}, std::pair{"sin", &c.sin}}) {
    if (t->data == nullptr || t->rank != 3 || (t->shape[0] != 1 && t->shape[0] != b) ||
        t->shape[1] != tokens || t->shape[2] != dim_ || t->strides[2] != 1)
      return std::string(what) + " " + (t->data ? t->describe() : std::string("missing")) +
             ": expected [" + std::to_string(b) + " or 1, " + std::to_string(tokens) + ", " +
             std::to_string(dim_) + "], head_dim contiguous";
  }
  for (const TensorView* t : {&c.q, &c.k, &c.cos, &c.sin, &c.q_out, &c.k_out})
    if (t->dtype != DType::f32) return t->describe() + ": the op reads and writes f32";
  if (c.q.strides[3] != 1 || c.k.strides[3] != 1)
    return "q " + c.q.describe() + ", k " + c.k.describe() + ": head_dim not contiguous";
  if (dim_ % 2 != 0) return "head_dim " + std::to_string(dim_) + " is odd";
  // The op applies cos[i] to both halves of a pair: the table's halves must be one table twice.
  const int64_t half = dim_ / 2;
  for (const TensorView* tab : {&c.cos, &c.sin})
    for (int64_t r = 0; r < tab->shape[0]; ++r)
      for (int64_t t = 0; t < tokens; ++t) {
        const float* row = table_row(*tab, r, t);
        if (std::memcmp(row, row + half, static_cast<size_t>(half) * sizeof(float)) != 0)
          return "the cos/sin halves differ (row " + std::to_string(r) + ", token " +
                 std::to_string(t) + "): not the rotate-half table the op applies";
      }
  frt_rotary_args a{};
  a.heads = heads_;
  a.head_dim = dim_;
  a.x = static_cast<float*>(c.q_out.data);
  a.cos = table_row(c.cos, 0, 0);
  a.sin = table_row(c.sin, 0, 0);
  return kernel_refusal(table_, OpKind::rotary, a);
}

// Per (batch, token): each head's vector gathered into the output row, then rotated there in
// place (the op rotates heads laid head_dim apart). A row is a few hundred multiply-adds: the
// calling thread does it.
void RotarySeat::run_rows(const RotaryCall& c) const {
  const frt_op& op = *find_op(table_, OpKind::rotary);
  const int64_t b = c.q.shape[0], tokens = c.q.shape[2];
  const size_t bytes = static_cast<size_t>(dim_) * sizeof(float);
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < tokens; ++t)
      for (const auto& [in, out, heads] :
           {std::tuple{&c.q, &c.q_out, heads_}, std::tuple{&c.k, &c.k_out, kv_heads_}}) {
        const float* src =
            static_cast<const float*>(in->data) + r * in->strides[0] + t * in->strides[2];
        float* dst = static_cast<float*>(out->data) + r * out->strides[0] + t * out->strides[2];
        for (int64_t h = 0; h < heads; ++h)
          std::memcpy(dst + h * dim_, src + h * in->strides[1], bytes);
        frt_rotary_args a{};
        a.heads = heads;
        a.head_dim = dim_;
        a.x = dst;
        a.cos = table_row(c.cos, r, t);
        a.sin = table_row(c.sin, r, t);
        frt_error err{};
        if (op.run(&a, 0, 0, 1, &err) != FRT_OK)
          throw InvalidArgument(std::string("kernel failed: ") + err.message);
      }
}

Verdict RotarySeat::call(const RotaryCall& c, bool training) {
  return run_call(
      training, c.q.dtype, [&] { return call_refusal(c); }, [&] { run_rows(c); });
}

}  // namespace frt
