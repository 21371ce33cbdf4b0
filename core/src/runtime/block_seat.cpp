// The decoder block seat: a layer's decode rows through the seats of its parts, in two halves
// around the host's cache update (seat.h, BlockSeat; Note [Decoder block assembly] in
// planner/plan.cpp says when a plan assembles one; Note [Routed decoder block] there, when its
// feed-forward is a router and a bank of experts).
#include <flashrt/errors.h>
#include <flashrt/seat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "runtime/run_on_threads.h"

namespace frt {
namespace {

bool contiguous_rows(const TensorView& t, int64_t width) {
  return t.rank == 2 && t.shape[1] == width && t.strides[1] == 1 &&
         (t.shape[0] == 1 || t.strides[0] == width);
}

// "" when t is f32 [rows, heads, 1, dim], contiguous.
std::string head_view_refusal(const char* what, const TensorView& t, int64_t rows, int64_t heads,
                              int64_t dim) {
  const bool ok = t.data != nullptr && t.rank == 4 && t.dtype == DType::f32 && t.shape[0] == rows &&
                  t.shape[1] == heads && t.shape[2] == 1 && t.shape[3] == dim &&
                  t.strides[3] == 1 && (heads == 1 || t.strides[1] == dim) &&
                  (rows == 1 || t.strides[0] == heads * dim);
  if (ok) return "";
  return std::string(what) + " " + (t.data ? t.describe() : std::string("missing")) +
         ": expected f32 [" + std::to_string(rows) + ", " + std::to_string(heads) + ", 1, " +
         std::to_string(dim) + "] contiguous";
}

// A [rows, heads, 1, dim] view of `heads * dim` columns of rows `ld` apart.
TensorView heads_view(float* data, int64_t rows, int64_t heads, int64_t dim, int64_t ld) {
  TensorView v;
  v.data = data;
  v.dtype = DType::f32;
  v.rank = 4;
  v.shape = {rows, heads, 1, dim};
  v.strides = {ld, dim, dim, 1};
  return v;
}

// Copies `cols` columns starting at `from` of rows `ld` apart into contiguous rows.
void gather_columns(const float* src, int64_t rows, int64_t ld, int64_t from, int64_t cols,
                    float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * cols, src + r * ld + from, static_cast<size_t>(cols) * sizeof(float));
}

}  // namespace

BlockSeat::BlockSeat(SeatForm form, const frt_kernel_table& table, GuardMode mode, BlockParts parts,
                     BlockGeometry geometry)
    : Seat(std::move(form), table, mode), parts_(std::move(parts)), geo_(geometry) {
  const BlockParts& p = parts_;
  if (p.input_norm == nullptr || p.post_norm == nullptr || p.rotary == nullptr ||
      p.attention == nullptr || p.o == nullptr || (p.ffn == nullptr) == (p.bank == nullptr) ||
      (p.qkv.size() != 1 && p.qkv.size() != 3) ||
      std::any_of(p.qkv.begin(), p.qkv.end(), [](const LinearSeat* s) { return s == nullptr; }) ||
      (p.q_norm == nullptr) != (p.k_norm == nullptr))
    throw InvalidArgument(
        "a decoder block needs its norms, q/k/v (one pack or three), o, rotary, attention and "
        "one feed-forward seat (dense, or a bank of experts), and q and k norms both or neither");
  const int64_t q = geo_.heads * geo_.head_dim, kv = geo_.kv_heads * geo_.head_dim;
  if (geo_.hidden < 1 || q < 1 || kv < 1 || geo_.heads % geo_.kv_heads != 0 || !(geo_.scale > 0))
    throw InvalidArgument("a decoder block's geometry: hidden " + std::to_string(geo_.hidden) +
                          ", heads " + std::to_string(geo_.heads) + "/" +
                          std::to_string(geo_.kv_heads) + " of " + std::to_string(geo_.head_dim) +
                          ", scale " + std::to_string(geo_.scale));
  const int64_t qkv_out = p.qkv.size() == 1
                              ? p.qkv[0]->form().out
                              : p.qkv[0]->form().out + p.qkv[1]->form().out + p.qkv[2]->form().out;
  if (p.q_norm != nullptr &&
      (p.q_norm->form().width != geo_.head_dim || p.k_norm->form().width != geo_.head_dim))
    throw InvalidArgument("a decoder block's q/k norms are " +
                          std::to_string(p.q_norm->form().width) + " and " +
                          std::to_string(p.k_norm->form().width) + " wide; the block norms each " +
                          "head of " + std::to_string(geo_.head_dim));
  const Seat& ffn = p.ffn != nullptr ? static_cast<const Seat&>(*p.ffn) : *p.bank;
  if (qkv_out != q + 2 * kv || p.o->form().width != q || p.o->form().out != geo_.hidden ||
      ffn.form().width != geo_.hidden || ffn.form().out != geo_.hidden)
    throw InvalidArgument(
        "a decoder block's parts do not chain: q/k/v out " + std::to_string(qkv_out) + " for " +
        std::to_string(q) + " + 2x" + std::to_string(kv) + ", o [" +
        std::to_string(p.o->form().width) + " -> " + std::to_string(p.o->form().out) + "], " +
        (p.ffn != nullptr ? "ffn [" : "bank [") + std::to_string(ffn.form().width) + " -> " +
        std::to_string(ffn.form().out) + "], hidden " + std::to_string(geo_.hidden));
  if (p.bank == nullptr) {
    if (p.shared != nullptr || !p.shared_gate.empty())
      throw InvalidArgument("a decoder block's shared expert stands beside a bank of experts");
    return;
  }
  const BlockRouter& r = p.router;
  const int64_t experts = p.bank->bank().experts();
  if (r.experts != experts || r.top_k < 1 || r.top_k > experts ||
      static_cast<int64_t>(r.weight.size()) != experts * geo_.hidden)
    throw InvalidArgument("a decoder block's router: " + std::to_string(r.weight.size()) +
                          " weights for " + std::to_string(r.experts) + " experts, top-" +
                          std::to_string(r.top_k) + ", where its bank holds " +
                          std::to_string(experts) + " experts of hidden " +
                          std::to_string(geo_.hidden));
  if (p.shared != nullptr &&
      (p.shared->form().width != geo_.hidden || p.shared->form().out != geo_.hidden ||
       static_cast<int64_t>(p.shared_gate.size()) != geo_.hidden))
    throw InvalidArgument(
        "a decoder block's shared expert: [" + std::to_string(p.shared->form().width) + " -> " +
        std::to_string(p.shared->form().out) + "] with a gate of " +
        std::to_string(p.shared_gate.size()) + " weights, hidden " + std::to_string(geo_.hidden));
  router_op_ = find_op(p.attention->table(), OpKind::dense);
  if (router_op_ == nullptr)
    throw InvalidArgument("a decoder block's router: the attention seat's package (" +
                          std::string(p.attention->table().package) + ") runs no dense op");
}

std::string BlockSeat::part_miss(const char* part, const Seat& seat, Verdict v) const {
  const std::string why = v == Verdict::band ? "rows outside its band" : seat.ledger().last_reason;
  return std::string(part) + " " + seat.form().site + ": " + why;
}

std::string BlockSeat::entry_refusal(const TensorView& x, bool training) const {
  if (training) return "training mode";
  if (std::this_thread::get_id() != owner()) return "called from a second thread";
  if (x.dtype != DType::f32 || !contiguous_rows(x, geo_.hidden))
    return "x " + x.describe() + ": expected f32 rows of " + std::to_string(geo_.hidden) +
           ", contiguous";
  if (x.shape[0] < form().band_min || x.shape[0] > form().band_max)
    return "rows " + std::to_string(x.shape[0]) + " outside the band " +
           std::to_string(form().band_min) + ".." + std::to_string(form().band_max);
  return "";
}

Verdict BlockSeat::head(const TensorView& x, const TensorView& cos, const TensorView& sin,
                        const TensorView& q, const TensorView& k, const TensorView& v,
                        bool training) {
  if (std::string why = entry_refusal(x, training); !why.empty()) return miss(why);
  const int64_t rows = x.shape[0];
  const int64_t dim = geo_.head_dim, qw = geo_.heads * dim, kw = geo_.kv_heads * dim;
  for (const auto& [what, t, heads] :
       {std::tuple{"q", &q, geo_.heads}, std::tuple{"k", &k, geo_.kv_heads},
        std::tuple{"v", &v, geo_.kv_heads}})
    if (std::string why = head_view_refusal(what, *t, rows, heads, dim); !why.empty())
      return miss(why);
  const int64_t width = qw + 2 * kw;
  normed_.resize(static_cast<size_t>(rows * geo_.hidden));
  qkv_.resize(static_cast<size_t>(rows * width));
  q_normed_.resize(static_cast<size_t>(rows * qw));
  k_normed_.resize(static_cast<size_t>(rows * kw));
  // Where the rotary will read q and k: the per-head norms' output, or the projections'.
  const bool normed = parts_.q_norm != nullptr;
  const RotaryCall rc{normed ? heads_view(q_normed_.data(), rows, geo_.heads, dim, qw)
                             : heads_view(qkv_.data(), rows, geo_.heads, dim, width),
                      normed ? heads_view(k_normed_.data(), rows, geo_.kv_heads, dim, kw)
                             : heads_view(qkv_.data() + qw, rows, geo_.kv_heads, dim, width),
                      cos,
                      sin,
                      q,
                      k};
  // The one part whose form a call's own operands decide (the tables): asked before any part
  // runs, so a miss is the block's alone and the host's layer then calls each part once.
  if (std::string why = parts_.rotary->call_refusal(rc); !why.empty())
    return miss("rotary " + parts_.rotary->form().site + ": " + why);
  const TensorView n1 =
      TensorView::matrix(normed_.data(), DType::f32, rows, geo_.hidden, geo_.hidden);
  if (Verdict r = parts_.input_norm->run(x, n1, false); r != Verdict::ran)
    return miss(part_miss("input_norm", *parts_.input_norm, r));
  int64_t column = 0;
  for (LinearSeat* s : parts_.qkv) {
    const TensorView out =
        TensorView::matrix(qkv_.data() + column, DType::f32, rows, s->form().out, width);
    if (Verdict r = s->run(n1, out, false); r != Verdict::ran)
      return miss(part_miss("projection", *s, r));
    column += s->form().out;
  }
  // q and k through their per-head norms (rows of head_dim), into where rc reads them.
  if (normed) {
    std::vector<float>& gathered = attended_;  // free until tail()
    gathered.resize(static_cast<size_t>(rows * std::max(qw, kw)));
    for (const auto& [norm, from, cols, heads, out] :
         {std::tuple{parts_.q_norm, int64_t{0}, qw, geo_.heads, &q_normed_},
          std::tuple{parts_.k_norm, qw, kw, geo_.kv_heads, &k_normed_}}) {
      gather_columns(qkv_.data(), rows, width, from, cols, gathered.data());
      const TensorView in = TensorView::matrix(gathered.data(), DType::f32, rows * heads, dim, dim);
      const TensorView by_head =
          TensorView::matrix(out->data(), DType::f32, rows * heads, dim, dim);
      if (Verdict r = norm->run(in, by_head, false); r != Verdict::ran)
        return miss(part_miss(norm == parts_.q_norm ? "q_norm" : "k_norm", *norm, r));
    }
  }
  if (Verdict r = parts_.rotary->call(rc, false); r != Verdict::ran)
    return miss(part_miss("rotary", *parts_.rotary, r));
  float* vo = static_cast<float*>(v.data);
  gather_columns(qkv_.data(), rows, width, qw + kw, kw, vo);
  return Verdict::ran;
}

Verdict BlockSeat::tail(const TensorView& x, const TensorView& q, const TensorView& k,
                        const TensorView& v, const std::optional<TensorView>& mask,
                        const TensorView& y, bool training) {
  if (std::string why = entry_refusal(x, training); !why.empty()) return miss(why);
  const int64_t rows = x.shape[0];
  if (y.dtype != DType::f32 || !contiguous_rows(y, geo_.hidden) || y.shape[0] != rows)
    return miss("y " + y.describe() + ": expected f32 rows of " + std::to_string(geo_.hidden) +
                ", contiguous");
  const int64_t qw = geo_.heads * geo_.head_dim, hidden = geo_.hidden;
  attended_.resize(static_cast<size_t>(rows * qw));
  TensorView out;
  out.data = attended_.data();
  out.dtype = DType::f32;
  out.rank = 4;
  out.shape = {rows, 1, geo_.heads, geo_.head_dim};
  out.strides = {qw, qw, geo_.head_dim, 1};
  const AttentionCall call{q, k, v, out, mask, geo_.scale, geo_.softcap};
  // Checked before anything is written, so a miss leaves the door the whole rest of the layer.
  if (std::string why = parts_.attention->call_refusal(call); !why.empty())
    return miss("attention " + parts_.attention->form().site + ": " + why);
  if (Verdict r = parts_.attention->call(call, false); r != Verdict::ran)
    return miss(part_miss("attention", *parts_.attention, r));
  projected_.resize(static_cast<size_t>(rows * hidden));
  residual_.resize(static_cast<size_t>(rows * hidden));
  post_normed_.resize(static_cast<size_t>(rows * hidden));
  ffn_out_.resize(static_cast<size_t>(rows * hidden));
  const auto rows_of = [&](std::vector<float>& b, int64_t w) {
    return TensorView::matrix(b.data(), DType::f32, rows, w, w);
  };
  // Past the attention the parts take these views by construction (rows in all their bands,
  // f32, contiguous, the owner's thread); a miss now would leave the layer half run, so it is an
  // internal error rather than a fallback.
  const auto must = [&](const char* part, Seat& s, Verdict r) {
    if (r != Verdict::ran)
      throw InvalidArgument("decoder block " + form().site + ": " + part_miss(part, s, r));
  };
  must("o", *parts_.o, parts_.o->run(rows_of(attended_, qw), rows_of(projected_, hidden), false));
  const float* xs = static_cast<const float*>(x.data);
  for (int64_t i = 0; i < rows * hidden; ++i) residual_[i] = xs[i] + projected_[i];
  must("post_norm", *parts_.post_norm,
       parts_.post_norm->run(rows_of(residual_, hidden), rows_of(post_normed_, hidden), false));
  if (parts_.ffn != nullptr)
    must("ffn", *parts_.ffn,
         parts_.ffn->run(rows_of(post_normed_, hidden), rows_of(ffn_out_, hidden), false));
  else
    routed_ffn(rows_of(post_normed_, hidden), rows_of(ffn_out_, hidden));
  float* ys = static_cast<float*>(y.data);
  for (int64_t i = 0; i < rows * hidden; ++i) ys[i] = residual_[i] + ffn_out_[i];
  count_ran();
  return Verdict::ran;
}

// The router's logits on the dense op over the team (a [experts, hidden] weight: 1 MiB at
// Qwen3-30B-A3B's widths, a bandwidth read worth both threads), its choice on this thread (rows x
// experts values), then the bank's call with that choice.
void BlockSeat::routed_ffn(const TensorView& x, const TensorView& y) {
  const BlockRouter& r = parts_.router;
  const int64_t rows = x.shape[0], hidden = geo_.hidden;
  logits_.resize(static_cast<size_t>(rows * r.experts));
  route_index_.resize(static_cast<size_t>(rows * r.top_k));
  route_weight_.resize(static_cast<size_t>(rows * r.top_k));
  frt_dense_args a{};
  a.w_dtype = FRT_F32;
  a.m = rows;
  a.n = r.experts;
  a.k = hidden;
  a.x = static_cast<const float*>(x.data);
  a.ldx = hidden;
  a.w = r.weight.data();
  a.ldw = hidden;
  a.y = logits_.data();
  a.ldy = r.experts;
  Parallel& team = process_parallel();
  detail::run_on_threads(team, team.size(), "router", [&](int ith, int n, frt_error* err) {
    return router_op_->run(&a, 0, ith, n, err);
  });
  choose_experts(logits_.data(), rows, r.experts, r.top_k, r.renormalise, route_index_.data(),
                 route_weight_.data());
  const Routing routing{
      TensorView::matrix(route_index_.data(), DType::i64, rows, r.top_k, r.top_k),
      TensorView::matrix(route_weight_.data(), DType::f32, rows, r.top_k, r.top_k)};
  if (Verdict v = parts_.bank->run(x, y, false, &routing); v != Verdict::ran)
    throw InvalidArgument("decoder block " + form().site + ": " +
                          part_miss("bank", *parts_.bank, v));
  if (parts_.shared == nullptr) return;
  // y += sigmoid(x g) * shared(x), as the layer's feed-forward mixes it: the gate's dot in
  // double (one [hidden] row; fp32 rounding of its sum is the only difference from the host's
  // linear), the mix as the decode program's.
  shared_out_.resize(static_cast<size_t>(rows * hidden));
  shared_logits_.resize(static_cast<size_t>(rows));
  const TensorView shared =
      TensorView::matrix(shared_out_.data(), DType::f32, rows, hidden, hidden);
  if (Verdict v = parts_.shared->run(x, shared, false); v != Verdict::ran)
    throw InvalidArgument("decoder block " + form().site + ": " +
                          part_miss("shared", *parts_.shared, v));
  const float* xs = static_cast<const float*>(x.data);
  for (int64_t row = 0; row < rows; ++row) {
    double dot = 0;
    for (int64_t i = 0; i < hidden; ++i)
      dot += static_cast<double>(xs[row * hidden + i]) * parts_.shared_gate[i];
    shared_logits_[row] = static_cast<float>(dot);
  }
  mix_shared_expert(shared_logits_.data(), shared_out_.data(), rows, hidden,
                    static_cast<float*>(y.data));
}

std::string BlockSeat::judge(const std::vector<std::pair<std::string, double>>& cosines,
                             double pass) {
  std::string out;
  for (const auto& [what, cosine] : cosines)
    if (!(cosine >= pass))
      out += (out.empty() ? "" : ", ") + what + " cosine " + std::to_string(cosine);
  if (!out.empty())
    out = "self-check against the host's layer: " + out + " below " + std::to_string(pass);
  return out;
}

std::unique_ptr<BlockSeat> build_block_seat(const SeatPlan& plan,
                                            const std::map<std::string, Seat*>& parts,
                                            GuardMode mode, const TensorView* router,
                                            const TensorView* shared_gate) {
  if (plan.op != OpKind::block)
    throw InvalidArgument(plan.site + ": op " + name_of(plan.op) + " is not a decoder block");
  const auto part = [&]<typename T>(const char* role, bool required) -> T* {
    const auto it = parts.find(role);
    if (it == parts.end() || it->second == nullptr) {
      if (required) throw Refused(plan.site + ": the block's " + role + " seat is missing");
      return nullptr;
    }
    T* s = dynamic_cast<T*>(it->second);
    if (s == nullptr)
      throw Refused(plan.site + ": the block's " + role + " seat (" + it->second->form().site +
                    ") runs " + name_of(it->second->form().op));
    return s;
  };
  BlockParts b;
  b.input_norm = part.operator()<NormSeat>("input_norm", true);
  b.post_norm = part.operator()<NormSeat>("post_norm", true);
  b.bank = part.operator()<MoeSeat>("bank", false);
  b.ffn = part.operator()<FfnSeat>("ffn", b.bank == nullptr);
  if (b.bank != nullptr) {
    // Note [Routed decoder block]: the router's weight, as the plan measured its form.
    const RouterFacts& f = plan.seam.router;
    const int64_t experts = b.bank->bank().experts(), hidden = b.bank->bank().hidden();
    if (f.form != RouterForm::softmax_topk && f.form != RouterForm::softmax_topk_renormalised)
      throw Refused(plan.site + ": the plan holds no softmax top-k router for its bank");
    // A copy of the host weight `w` the block reads itself, f32 [rows, hidden] contiguous.
    const auto copied = [&](const char* what, const TensorView* w, int64_t rows) {
      if (w == nullptr || w->data == nullptr || w->dtype != DType::f32 || w->rank != 2 ||
          w->shape[0] != rows || w->shape[1] != hidden || w->strides[1] != 1 ||
          (rows > 1 && w->strides[0] != hidden))
        throw Refused(
            plan.site + ": its " + what + " weight " +
            (w != nullptr && w->data != nullptr ? w->describe() : std::string("missing")) +
            ": expected f32 [" + std::to_string(rows) + ", " + std::to_string(hidden) +
            "] contiguous");
      const float* data = static_cast<const float*>(w->data);
      return std::vector<float>(data, data + rows * hidden);
    };
    b.router.weight = copied("router", router, experts);
    b.router.experts = experts;
    b.router.top_k = f.top_k;
    b.router.renormalise = f.form == RouterForm::softmax_topk_renormalised;
    b.shared = part.operator()<FfnSeat>("shared", false);
    if (b.shared != nullptr) b.shared_gate = copied("shared expert's gate", shared_gate, 1);
  }
  b.attention = part.operator()<AttentionSeat>("attention", true);
  b.o = part.operator()<LinearSeat>("o", true);
  b.rotary = part.operator()<RotarySeat>("rotary", true);
  b.q_norm = part.operator()<NormSeat>("q_norm", false);
  b.k_norm = part.operator()<NormSeat>("k_norm", false);
  if (LinearSeat* pack = part.operator()<LinearSeat>("qkv", false); pack != nullptr)
    b.qkv = {pack};
  else
    b.qkv = {part.operator()<LinearSeat>("q", true), part.operator()<LinearSeat>("k", true),
             part.operator()<LinearSeat>("v", true)};
  const AttentionFacts& a = plan.seam.attention;
  BlockGeometry g;
  g.hidden = plan.seam.dims.count("hidden") ? plan.seam.dims.at("hidden") : 0;
  g.heads = a.heads;
  g.kv_heads = a.kv_heads;
  g.head_dim = a.head_dim;
  // The scaling the module's calls passed; none passed is the interface's default.
  g.scale =
      static_cast<float>(a.scale > 0 ? a.scale : 1.0 / std::sqrt(static_cast<double>(a.head_dim)));
  g.softcap = static_cast<float>(a.softcap);
  SeatForm form = seat_form(plan);
  form.width = form.out = g.hidden;
  form.weights = "its parts' seats";
  try {
    return std::make_unique<BlockSeat>(form, b.attention->table(), mode, std::move(b), g);
  } catch (const InvalidArgument& e) {
    throw Refused(plan.site + ": " + e.what());
  }
}

}  // namespace frt
