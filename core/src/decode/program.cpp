#include <flashrt/decode.h>
#include <flashrt/errors.h>
#include <flashrt/thread_pool.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>

#include "quant/weight_memory.h"
#include "runtime/run_on_threads.h"

namespace frt {
namespace {

// A single-phase primitive of flashrt/decode on the process team, or on the calling thread
// alone for a small one: a decode row's norms and rotations touch a few KiB, less work than
// waking the team for it (a region per call, ~170 of them per step on Qwen3-0.6B's shapes).
template <typename Args>
void parallel(const frt_op* op, const Args& args, const char* what, int64_t elements) {
  constexpr int64_t kWorthATeam = 16384;
  Parallel& par = process_parallel();
  const int nth = elements < kWorthATeam ? 1 : par.size();
  detail::run_on_threads(par, nth, what, [&](int ith, int n, frt_error* err) {
    return op->run(&args, 0, ith, n, err);
  });
}

void check(bool ok, const std::string& what) {
  if (!ok) throw Refused("decode_loop: " + what);
}

}  // namespace

bool ProjWeights::present() const { return seat != nullptr || host.data != nullptr; }
int64_t ProjWeights::n() const { return seat != nullptr ? seat->weight().n() : host.shape[0]; }
int64_t ProjWeights::k() const { return seat != nullptr ? seat->weight().k() : host.shape[1]; }
int64_t BankWeights::experts() const {
  return seat != nullptr ? seat->bank().experts() : gate.shape[0];
}
int64_t BankWeights::inner() const {
  return seat != nullptr ? seat->bank().intermediate() : gate.shape[1];
}
int64_t BankWeights::hidden() const {
  return seat != nullptr ? seat->bank().hidden() : gate.shape[2];
}

DecodeProgram::DecodeProgram(DecodeConfig config, ModelWeights weights,
                             const frt_kernel_table& decode, const frt_kernel_table* linear,
                             const frt_kernel_table* ffn)
    : cfg_(std::move(config)), w_(std::move(weights)), decode_(decode), linear_(linear), ffn_(ffn) {
  const DecodeConfig& c = cfg_;
  dense_ = find_op(decode_, OpKind::dense);
  rmsnorm_ = find_op(decode_, OpKind::rmsnorm);
  rotary_ = find_op(decode_, OpKind::rotary);
  attention_ = find_op(decode_, OpKind::attention);
  gated_act_ = find_op(decode_, OpKind::gated_act);
  check(dense_ && rmsnorm_ && rotary_ && attention_ && gated_act_,
        std::string("package '") + decode_.package + "' lacks a decode primitive");
  if (c.attention_softcap > 0) {
    capped_attention_ = find_op(decode_, OpKind::capped_attention);
    check(capped_attention_ != nullptr, std::string("package '") + decode_.package +
                                            "' has no softcapped attention (kernel ABI 4.2)");
  }
  check(c.cache_dtype == DType::f32 || c.cache_dtype == DType::bf16,
        std::string("a KV cache of ") + dtype_name(c.cache_dtype) + "; the loop keeps f32 or bf16");
  if (c.cache_dtype == DType::bf16) {
    cache_attention_ = find_op(decode_, OpKind::cache_attention);
    check(cache_attention_ != nullptr, std::string("package '") + decode_.package +
                                           "' has no attention over a bf16 cache (kernel ABI 4.8)");
  }
  check(c.layers == static_cast<int64_t>(w_.layers.size()) && c.layers > 0, "layer count");
  check(c.hidden > 0 && c.heads > 0 && c.kv_heads > 0 && c.head_dim > 0 && c.vocab > 0 &&
            c.max_len > 0 && c.intermediate >= 0,
        "sizes must be positive (hidden " + std::to_string(c.hidden) + ", heads " +
            std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) + " x " +
            std::to_string(c.head_dim) + ", vocab " + std::to_string(c.vocab) + ", window " +
            std::to_string(c.max_len) + ")");
  check(c.sequences >= 1 && c.sequences <= kBlock, std::to_string(c.sequences) +
                                                       " sequences (a batch step runs 1.." +
                                                       std::to_string(kBlock) + " rows)");
  check(static_cast<int64_t>(c.layer.size()) == c.layers, "a layer configuration per layer");
  check(c.heads % c.kv_heads == 0, "heads " + std::to_string(c.heads) +
                                       " not a multiple of kv heads " + std::to_string(c.kv_heads));
  check(c.rotary_dim > 0 && c.rotary_dim % 2 == 0 && c.rotary_dim <= c.head_dim,
        "rotary over " + std::to_string(c.rotary_dim) + " of a head's " +
            std::to_string(c.head_dim) + " dims");
  for (const DecodeRotary& r : c.rotaries)
    check(static_cast<int64_t>(r.inv_freq.size()) * 2 == c.rotary_dim,
          "rotary frequencies for " + std::to_string(c.rotary_dim) + " rotated dims");
  check(c.embed_scale > 0 && c.residual_scale > 0 && c.logits_divisor > 0 &&
            c.attention_scale >= 0 && c.attention_softcap >= 0 && c.final_softcap >= 0,
        "scales must be positive");
  check(w_.embed.rank == 2 && w_.embed.dtype == DType::f32 && w_.embed.shape[1] == c.hidden &&
            w_.embed.strides[1] == 1,
        "embedding " + w_.embed.describe() + ", expected f32[vocab, " + std::to_string(c.hidden) +
            "] with contiguous rows");
  auto proj = [&](const ProjWeights& p, int64_t n, int64_t k, const std::string& name) {
    check(p.n() == n && p.k() == k, name + " is [" + std::to_string(p.n()) + "x" +
                                        std::to_string(p.k()) + "], expected [" +
                                        std::to_string(n) + "x" + std::to_string(k) + "]");
    if (p.seat == nullptr)
      check(p.host.rank == 2 && p.host.strides[1] == 1 && p.host.data != nullptr,
            name + " weight " + p.host.describe() + " needs contiguous rows");
    else
      check(linear_ != nullptr, name + " is seated but the linear package is unavailable");
  };
  bool fused_qkv = false, fused_gate_up = false;
  const auto gated = [&](const FfnWeights& f, int64_t inner, const std::string& at) {
    if (f.seat != nullptr) {
      check(ffn_ != nullptr, at + "ffn is seated but the ffn package is unavailable");
      check(f.seat->gate() != nullptr, at + "ffn seat is not a gated feed-forward");
      check(f.seat->up().k() == c.hidden && f.seat->down().n() == c.hidden,
            at + "seated ffn widths");
      return;
    }
    if (f.gate_up.present()) {
      proj(f.gate_up, 2 * inner, c.hidden, at + "gate_up");
      fused_gate_up = true;
    } else {
      proj(f.gate, inner, c.hidden, at + "gate");
      proj(f.up, inner, c.hidden, at + "up");
    }
    proj(f.down, c.hidden, inner, at + "down");
  };
  // The widest feed-forward and the largest bank and top-k: the buffers' sizes.
  int64_t inner = c.intermediate, experts = 0, top_k = 0;
  const int64_t qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  for (int64_t l = 0; l < c.layers; ++l) {
    LayerWeights& L = w_.layers[l];
    const DecodeLayerConfig& lc = c.layer[l];
    const std::string at = "layer " + std::to_string(l) + " ";
    check(L.attn_in_norm || L.attn_out_norm, at + "attention has no norm before or after it");
    check(L.ffn_in_norm || L.ffn_out_norm, at + "feed-forward has no norm before or after it");
    check(lc.rotary < static_cast<int32_t>(c.rotaries.size()), at + "rotary table");
    check(lc.window >= 0, at + "window");
    check((lc.qk_norm == QkNorm::none) == (L.q_norm == nullptr && L.k_norm == nullptr) &&
              (L.q_norm == nullptr) == (L.k_norm == nullptr),
          at + "q/k norm weights");
    for (const float** norm : {&L.attn_in_norm, &L.attn_out_norm, &L.ffn_in_norm, &L.ffn_out_norm})
      *norm = norm_weight(*norm, c.hidden);
    L.q_norm = norm_weight(L.q_norm, qk_norm_width(lc.qk_norm, c.heads, c.head_dim));
    L.k_norm = norm_weight(L.k_norm, qk_norm_width(lc.qk_norm, c.kv_heads, c.head_dim));
    if (L.qkv.present()) {
      proj(L.qkv, qd + 2 * kvd, c.hidden, at + "qkv");
      fused_qkv = true;
    } else {
      proj(L.q, qd, c.hidden, at + "q");
      proj(L.k, kvd, c.hidden, at + "k");
      proj(L.v, kvd, c.hidden, at + "v");
    }
    proj(L.o, c.hidden, qd, at + "o");
    if (!L.routed) {
      gated(L.mlp, c.intermediate, at);
      continue;
    }
    const MoeWeights& M = L.moe;
    const BankWeights& b = M.bank;
    if (b.seat == nullptr) {
      const auto bank = [&](const TensorView& t, int64_t out, int64_t in, const char* what) {
        check(t.rank == 3 && t.data != nullptr && t.shape[0] == b.experts() && t.shape[1] == out &&
                  t.shape[2] == in && t.strides[2] == 1 &&
                  (t.dtype == DType::f32 || t.dtype == DType::bf16),
              at + what + " bank " + t.describe() + ", expected f32 or bf16 [" +
                  std::to_string(b.experts()) + ", " + std::to_string(out) + ", " +
                  std::to_string(in) + "] with contiguous rows");
      };
      bank(b.gate, b.inner(), c.hidden, "gate");
      bank(b.up, b.inner(), c.hidden, "up");
      bank(b.down, c.hidden, b.inner(), "down");
      check(b.act == Activation::silu || b.act == Activation::gelu_tanh,
            at + "bank activation " + name_of(b.act));
    } else {
      check(b.hidden() == c.hidden, at + "seated bank reads " + std::to_string(b.hidden()) +
                                        " features, expected " + std::to_string(c.hidden));
    }
    check(M.router.seat == nullptr, at + "router must be the host's own weight");
    proj(M.router, b.experts(), c.hidden, at + "router");
    check(M.top_k >= 1 && M.top_k <= b.experts() && M.top_k <= FRT_MAX_TOP_K,
          at + "top-" + std::to_string(M.top_k) + " of " + std::to_string(b.experts()));
    inner = std::max(inner, b.inner());
    experts = std::max(experts, b.experts());
    top_k = std::max(top_k, M.top_k);
    if (M.shared) {
      const FfnWeights& f = M.shared_expert;
      const int64_t shared = f.seat != nullptr ? f.seat->up().n() : f.down.k();
      gated(f, shared, at + "shared ");
      proj(M.shared_gate, 1, c.hidden, at + "shared expert gate");
      inner = std::max(inner, shared);
    }
  }
  check(w_.final_norm != nullptr, "final norm weight");
  w_.final_norm = norm_weight(w_.final_norm, c.hidden);
  proj(w_.head, c.vocab, c.hidden, "head");
  const int64_t B = kPromptBlock;
  h_.resize(B * c.hidden);
  xn_.resize(B * c.hidden);
  q_.resize(B * qd);
  k_.resize(B * kvd);
  v_.resize(B * kvd);
  if (fused_qkv) qkv_.resize(B * (qd + 2 * kvd));
  attn_.resize(B * qd);
  o_.resize(B * c.hidden);
  gate_.resize(B * inner);
  up_.resize(B * inner);
  if (fused_gate_up) gate_up_.resize(B * 2 * inner);
  mlp_out_.resize(B * c.hidden);
  if (experts > 0) {
    router_.resize(B * experts);
    route_w_.resize(B * top_k);
    route_i_.resize(B * top_k);
    xg_.resize(B * c.hidden);
    yg_.resize(B * c.hidden);
    shared_out_.resize(B * c.hidden);
    shared_g_.resize(B);
  }
  scores_.resize(c.heads * c.max_len);
  logits_.resize(c.sequences * c.vocab);
  written_.assign(c.sequences, 0);
  cos_.resize(c.rotaries.size() * B * c.rotary_dim / 2);
  sin_.resize(c.rotaries.size() * B * c.rotary_dim / 2);
  // Every factor is positive and bounded by what was allocated above but the window: the product
  // is checked before it is asked for.
  cache_elem_ = c.cache_dtype == DType::bf16 ? 2 : 4;
  int64_t cache_bytes = c.sequences * c.layers * 2 * kvd * cache_elem_;
  check(c.max_len <= INT64_MAX / cache_bytes,
        "a KV cache of " + std::to_string(c.max_len) + " positions overflows");
  cache_bytes *= c.max_len;
  cache_.reset(static_cast<char*>(alloc_weight_memory(cache_bytes)));
}

// Note [Norms of the form x·(1+w)]: Gemma's norms scale by 1 + w, which the host forms in fp32
// (`1.0 + self.weight.float()`) before multiplying; the kernel multiplies by its weight, so the
// program keeps 1 + w of each such norm (a few KiB in all) formed the same way: the same values,
// the same product.
const float* DecodeProgram::norm_weight(const float* host, int64_t width) {
  if (host == nullptr || !cfg_.norm_plus_one) return host;
  std::vector<float> w(host, host + width);
  for (float& x : w) x = 1.0f + x;
  plus_one_.push_back(std::move(w));
  return plus_one_.back().data();
}

void DecodeProgram::residual(float* h, const float* y, int64_t n) const {
  const float s = cfg_.residual_scale;
  if (s == 1.0f) {
    for (int64_t i = 0; i < n; ++i) h[i] += y[i];
  } else {
    for (int64_t i = 0; i < n; ++i) h[i] += y[i] * s;
  }
}

// Note [KV cache layout]: held [kv_head][position][head_dim] per layer, each KV head's positions
// are one contiguous run, which attention reads in position order (Note [Grouped attention] in
// kernels/decode/src/decode_ops.cpp); the host's order, [position][kv_head][head_dim], put a
// head's rows a whole position apart (4 KiB on Qwen3-0.6B), read in short interleaved runs. With
// both changes one thread reads the cache of 28 layers at position 192 at 28 GB/s, where it read
// 9 (a decode step's attention on Qwen3-0.6B's shapes: 3.3 ms, now 1.6). One buffer from the
// weights' allocator (huge pages when it spans them).
void DecodeProgram::FreeCache::operator()(char* p) const { free_weight_memory(p); }

char* DecodeProgram::cache_at(int64_t seq, int64_t layer, int64_t kv, int64_t head) const {
  const DecodeConfig& c = cfg_;
  return cache_.get() + (((seq * c.layers + layer) * 2 + kv) * c.kv_heads + head) * c.max_len *
                            c.head_dim * cache_elem_;
}

// Note [KV cache dtype]: a decode step reads every layer's cache up to its position, bytes the
// weights' floor does not count: on Qwen3-0.6B's shapes at ~190 positions 1.56 MiB a layer in
// f32, ~60 us of a ~440 us layer (bench/results/amx/decode_step_experiments.json). A bf16 cache
// halves them. Each K and V value is rounded once, to nearest even, as it is written (the
// kernels' f32_to_bf16); q, the scores and the output stay f32. flashrt/decode's cache_attention
// (kernel ABI 4.8) reads it: attention and capped_attention's passes (Note [Grouped attention])
// over a cache of the dtype it is told, each row widened as it loads. Not the host's values: a user
// asks for it (decode_loop(kv_cache="bf16")); the self-check still judges the loop against the host
// (its keys read back widened).
void DecodeProgram::to_cache(char* p, const float* x) const {
  if (cfg_.cache_dtype == DType::f32) {
    std::memcpy(p, x, cfg_.head_dim * sizeof(float));
    return;
  }
  auto* h = reinterpret_cast<uint16_t*>(p);
  for (int64_t i = 0; i < cfg_.head_dim; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &x[i], sizeof bits);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
      h[i] = static_cast<uint16_t>((bits >> 16) | 0x0040u);  // NaN stays NaN (quiet)
    } else {
      bits += 0x7fffu + ((bits >> 16) & 1u);
      h[i] = static_cast<uint16_t>(bits >> 16);
    }
  }
}

void DecodeProgram::from_cache(const char* p, float* x) const {
  if (cfg_.cache_dtype == DType::f32) {
    std::memcpy(x, p, cfg_.head_dim * sizeof(float));
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(p);
  for (int64_t i = 0; i < cfg_.head_dim; ++i) {
    const uint32_t bits = static_cast<uint32_t>(h[i]) << 16;
    std::memcpy(&x[i], &bits, sizeof bits);
  }
}

// One row's attention over positions [first, first + positions) of its sequence's layer cache.
void DecodeProgram::attend(int64_t seq, int64_t layer, int64_t first, int64_t positions,
                           const float* q, float* out, float scale) {
  const DecodeConfig& c = cfg_;
  const char* k = cache_at(seq, layer, 0, 0) + first * c.head_dim * cache_elem_;
  const char* v = cache_at(seq, layer, 1, 0) + first * c.head_dim * cache_elem_;
  const int64_t work = c.heads * positions * c.head_dim;
  if (c.cache_dtype == DType::bf16) {
    const frt_cache_attention_args a{c.heads,    c.kv_heads,
                                     c.head_dim, positions,
                                     FRT_BF16,   q,
                                     k,          v,
                                     c.head_dim, c.max_len * c.head_dim,
                                     scale,      c.attention_softcap,
                                     out,        scores_.data(),
                                     c.max_len};
    parallel(cache_attention_, a, "attention", work);
    return;
  }
  const frt_attention_args at{c.heads,
                              c.kv_heads,
                              c.head_dim,
                              positions,
                              q,
                              reinterpret_cast<const float*>(k),
                              reinterpret_cast<const float*>(v),
                              scale,
                              out,
                              scores_.data(),
                              c.max_len,
                              c.head_dim,
                              c.max_len * c.head_dim};
  if (c.attention_softcap > 0)
    parallel(capped_attention_, frt_capped_attention_args{at, c.attention_softcap}, "attention",
             work);
  else
    parallel(attention_, at, "attention", work);
}

std::span<const float> DecodeProgram::logits(int64_t row) const {
  if (row < 0 || row >= logits_rows_)
    throw InvalidArgument("decode_loop: logits row " + std::to_string(row) + "; the last call " +
                          "wrote " + std::to_string(logits_rows_));
  return {logits_.data() + row * cfg_.vocab, static_cast<size_t>(cfg_.vocab)};
}

// Note [Prompt blocks]: a prompt runs in blocks of up to kPromptBlock rows, so a kernel that
// takes many rows (flashrt/gemm's integer GEMM and fused feed-forward: on AMX their tiles take the
// rows past 16) reads each weight once per 256 prompt tokens and runs at its many-row speed, where
// blocks of the decode band's 16 read the weights 16 times as often. A seated projection or
// feed-forward whose kernel refuses the block's rows (linear_refusal, ffn_refusal: the decode
// package's forms, the fused decode feed-forward) is called 16 rows at a time, and so is a group
// of projections one of whose kernels refuses them; the host's dense op and routed layers (the
// router, the banks, the shared expert) always are. What a kernel computes per row is the same
// either way.
namespace {
// run(r0, rows) over rows [0, m) in pieces of at most `most`.
template <class Run>
void in_pieces(int64_t m, int64_t most, Run&& run) {
  for (int64_t r0 = 0; r0 < m; r0 += most) run(r0, std::min(most, m - r0));
}
}  // namespace

void DecodeProgram::project(const ProjWeights& p, const float* x, float* y, int64_t m) {
  if (p.seat != nullptr) {
    const auto view = [&](const float* at, int64_t rows, int64_t width) {
      return TensorView::matrix(const_cast<float*>(at), DType::f32, rows, width, width);
    };
    const PackedLinear& w = p.seat->weight();
    const int64_t most =  // (a decode step's rows are every kernel's: no question asked)
        m <= FRT_MAX_ROWS ||
                linear_refusal(p.seat->table(), w, view(x, m, p.k()), view(y, m, p.n())).empty()
            ? m
            : FRT_MAX_ROWS;
    in_pieces(m, most, [&](int64_t r0, int64_t rows) {
      run_linear(p.seat->table(), process_parallel(), w, p.seat->bias(),
                 view(x + r0 * p.k(), rows, p.k()), view(y + r0 * p.n(), rows, p.n()));
    });
    return;
  }
  if (m > FRT_MAX_ROWS) {
    in_pieces(m, FRT_MAX_ROWS,
              [&](int64_t r0, int64_t rows) { project(p, x + r0 * p.k(), y + r0 * p.n(), rows); });
    return;
  }
  frt_dense_args a{};
  a.w_dtype = p.host.dtype == DType::f32 ? FRT_F32 : FRT_BF16;
  a.m = m;
  a.n = p.n();
  a.k = p.k();
  a.x = x;
  a.ldx = a.k;
  a.w = p.host.data;
  a.ldw = p.host.strides[0];
  a.bias = p.bias;
  a.y = y;
  a.ldy = a.n;
  parallel(dense_, a, "dense", a.n * a.k);
}

// Projections of one input: the seated ones as one group (Note [Projection groups] in
// kernel_ops.cpp), the host's dense ones one by one.
void DecodeProgram::project_group(std::initializer_list<std::pair<const ProjWeights*, float*>> outs,
                                  const float* x, int64_t m) {
  for (const auto& [p, y] : outs)
    if (p->seat != nullptr && m > FRT_MAX_ROWS &&
        !linear_refusal(p->seat->table(), p->seat->weight(),
                        TensorView::matrix(const_cast<float*>(x), DType::f32, m, p->k(), p->k()),
                        TensorView::matrix(y, DType::f32, m, p->n(), p->n()))
             .empty()) {
      // A kernel of the group takes fewer rows (Note [Prompt blocks]): the group in pieces.
      for (int64_t r0 = 0; r0 < m; r0 += FRT_MAX_ROWS) {
        const int64_t rows = std::min<int64_t>(FRT_MAX_ROWS, m - r0);
        std::vector<std::pair<const ProjWeights*, float*>> piece;
        for (const auto& [q, out] : outs) piece.emplace_back(q, out + r0 * q->n());
        group_pieces(piece, x + r0 * p->k(), rows);
      }
      return;
    }
  group_pieces({outs.begin(), outs.end()}, x, m);
}

void DecodeProgram::group_pieces(const std::vector<std::pair<const ProjWeights*, float*>>& outs,
                                 const float* x, int64_t m) {
  std::vector<LinearCall> calls;
  for (const auto& [p, y] : outs) {
    if (p->seat == nullptr) {
      project(*p, x, y, m);
      continue;
    }
    LinearCall c;
    c.table = &p->seat->table();
    c.w = &p->seat->weight();
    c.bias = p->seat->bias();
    c.x = TensorView::matrix(const_cast<float*>(x), DType::f32, m, p->k(), p->k());
    c.y = TensorView::matrix(y, DType::f32, m, p->n(), p->n());
    calls.push_back(c);
  }
  if (!calls.empty()) run_linears(process_parallel(), calls);
}

void DecodeProgram::ffn(const FfnWeights& f, const float* x, float* y, int64_t m) {
  if (f.seat != nullptr) {
    const int64_t hidden = cfg_.hidden;
    const auto view = [&](const float* at, int64_t rows) {
      return TensorView::matrix(const_cast<float*>(at), DType::f32, rows, hidden, hidden);
    };
    const int64_t most =
        m <= FRT_MAX_ROWS ||
                ffn_refusal(f.seat->table(), f.seat->operands(), view(x, m), view(y, m)).empty()
            ? m
            : FRT_MAX_ROWS;
    in_pieces(m, most, [&](int64_t r0, int64_t rows) {
      run_ffn(f.seat->table(), process_parallel(), f.seat->operands(), view(x + r0 * hidden, rows),
              view(y + r0 * hidden, rows));
    });
    return;
  }
  const int64_t inner = f.down.k();
  if (f.gate_up.present()) {
    // One projection [gate; up]: each row's first half is its gate, its second its up.
    project(f.gate_up, x, gate_up_.data(), m);
    for (int64_t r = 0; r < m; ++r) {
      const float* row = gate_up_.data() + r * 2 * inner;
      std::memcpy(gate_.data() + r * inner, row, inner * sizeof(float));
      std::memcpy(up_.data() + r * inner, row + inner, inner * sizeof(float));
    }
  } else {
    project_group({{&f.gate, gate_.data()}, {&f.up, up_.data()}}, x, m);
  }
  gated_activation(f.act, gate_.data(), up_.data(), m * inner);
  project(f.down, gate_.data(), y, m);
}

// gate[i] = act(gate[i]) * up[i] by the package's op, on the team: one vector exp per element,
// where a libm call per element (std::tanh for gelu_tanh, ~20 ns) was ~8% of a 16-row step at
// Gemma 3's widths. The plan admits silu and gelu_tanh only (kDecodeActivations).
void DecodeProgram::gated_activation(Activation act, float* gate, const float* up, int64_t n) {
  const frt_gated_act_args a{act == Activation::silu ? FRT_ACT_SILU : FRT_ACT_GELU_TANH, n, gate,
                             up, gate};
  parallel(gated_act_, a, "gated activation", n);
}

// The router at the host's precision: logits x W^T, softmax in fp32, the top-k (ties to the
// lower expert), divided by their sum where the host's router does so.
void DecodeProgram::route(const MoeWeights& w, const float* x, int64_t m) {
  const int64_t k = w.top_k;
  project(w.router, x, router_.data(), m);
  choose_experts(router_.data(), m, w.bank.experts(), k, w.renormalise, route_i_.data(),
                 route_w_.data());
}

// The host's own banks at its precision: each chosen expert in ascending order runs once over
// the rows that chose it (gathered), and each row adds weight * its output, as the host's bank
// does (its first term stored, not added to a zero).
void DecodeProgram::host_bank(const BankWeights& b, const float* x, float* y, int64_t m,
                              int64_t top_k) {
  const int64_t H = cfg_.hidden, F = b.inner(), E = b.experts();
  const auto dense = [&](const TensorView& bank, int64_t e, const float* in, int64_t rows,
                         int64_t n, int64_t k, float* out) {
    const int64_t bytes = bank.dtype == DType::f32 ? 4 : 2;
    frt_dense_args a{};
    a.w_dtype = bank.dtype == DType::f32 ? FRT_F32 : FRT_BF16;
    a.m = rows;
    a.n = n;
    a.k = k;
    a.x = in;
    a.ldx = k;
    a.w = static_cast<const char*>(bank.data) + e * bank.strides[0] * bytes;
    a.ldw = bank.strides[1];
    a.y = out;
    a.ldy = n;
    parallel(dense_, a, "dense", n * k);
  };
  bool started[kBlock] = {};
  int64_t rows_of[kBlock], slot_of[kBlock];
  for (int64_t e = 0; e < E; ++e) {
    int64_t rows = 0;
    for (int64_t r = 0; r < m; ++r)
      for (int64_t j = 0; j < top_k; ++j)
        if (route_i_[r * top_k + j] == e) {
          rows_of[rows] = r;
          slot_of[rows] = r * top_k + j;
          std::memcpy(xg_.data() + rows * H, x + r * H, H * sizeof(float));
          ++rows;
          break;  // a row takes an expert once (top-k picks distinct experts)
        }
    if (rows == 0) continue;
    dense(b.gate, e, xg_.data(), rows, F, H, gate_.data());
    dense(b.up, e, xg_.data(), rows, F, H, up_.data());
    gated_activation(b.act, gate_.data(), up_.data(), rows * F);
    dense(b.down, e, gate_.data(), rows, H, F, yg_.data());
    for (int64_t i = 0; i < rows; ++i) {
      const int64_t r = rows_of[i];
      const float w = route_w_[slot_of[i]];
      float* out = y + r * H;
      const float* t = yg_.data() + i * H;
      if (started[r]) {
        for (int64_t c = 0; c < H; ++c) out[c] += t[c] * w;
      } else {
        for (int64_t c = 0; c < H; ++c) out[c] = t[c] * w;
        started[r] = true;
      }
    }
  }
}

void DecodeProgram::moe(const MoeWeights& w, const float* x, float* y, int64_t m) {
  const int64_t H = cfg_.hidden, k = w.top_k;
  if (m > FRT_MAX_ROWS) {  // the banks' kernels take up to FRT_MAX_ROWS (Note [Prompt blocks])
    in_pieces(m, FRT_MAX_ROWS,
              [&](int64_t r0, int64_t rows) { moe(w, x + r0 * H, y + r0 * H, rows); });
    return;
  }
  route(w, x, m);
  if (w.bank.seat != nullptr) {
    const Routing routing{TensorView::matrix(route_i_.data(), DType::i64, m, k, k),
                          TensorView::matrix(route_w_.data(), DType::f32, m, k, k)};
    run_moe(w.bank.seat->table(), process_parallel(), w.bank.seat->bank(),
            TensorView::matrix(const_cast<float*>(x), DType::f32, m, H, H), routing,
            TensorView::matrix(y, DType::f32, m, H, H));
  } else {
    host_bank(w.bank, x, y, m, k);
  }
  if (!w.shared) return;
  ffn(w.shared_expert, x, shared_out_.data(), m);
  project(w.shared_gate, x, shared_g_.data(), m);
  mix_shared_expert(shared_g_.data(), shared_out_.data(), m, H, y);
}

void DecodeProgram::norm_rows(const float* w, float* x, int64_t rows, int64_t width) {
  frt_rmsnorm_args a{rows, width, x, width, w, cfg_.eps, x, width};
  parallel(rmsnorm_, a, "rmsnorm", rows * width);
}

int64_t DecodeProgram::step(int64_t token, int64_t pos, int64_t seq) {
  return prefill(&token, 1, pos, seq);
}

namespace {

void check_token(int64_t token, int64_t vocab) {
  if (token < 0 || token >= vocab)
    throw InvalidArgument("decode_loop: token " + std::to_string(token) +
                          " outside the vocabulary");
}

}  // namespace

int64_t DecodeProgram::prefill(const int64_t* tokens, int64_t count, int64_t pos0, int64_t seq) {
  const DecodeConfig& c = cfg_;
  if (count < 1) throw InvalidArgument("decode_loop: an empty prompt");
  if (pos0 < 0 || pos0 + count > c.max_len)
    throw InvalidArgument("decode_loop: positions " + std::to_string(pos0) + ".." +
                          std::to_string(pos0 + count - 1) + " outside the static window of " +
                          std::to_string(c.max_len));
  for (int64_t i = 0; i < count; ++i) check_token(tokens[i], w_.embed.shape[0]);
  check_start(seq, pos0);
  int64_t best = 0, seqs[kPromptBlock], positions[kPromptBlock];
  for (int64_t done = 0; done < count; done += kPromptBlock) {
    const int64_t m = std::min(kPromptBlock, count - done);
    for (int64_t r = 0; r < m; ++r) {
      seqs[r] = seq;
      positions[r] = pos0 + done + r;
    }
    best = run_rows(tokens + done, seqs, positions, m, nullptr);
  }
  written_[seq] = std::max(written_[seq], pos0 + count);
  return best;
}

void DecodeProgram::check_start(int64_t seq, int64_t pos) const {
  if (seq < 0 || seq >= cfg_.sequences)
    throw InvalidArgument("decode_loop: sequence " + std::to_string(seq) + " of " +
                          std::to_string(cfg_.sequences));
  if (pos > written_[seq])
    throw InvalidArgument("decode_loop: position " + std::to_string(pos) + " of sequence " +
                          std::to_string(seq) + " leaves a gap: its cache holds positions 0.." +
                          std::to_string(written_[seq] - 1) + " (start at or before " +
                          std::to_string(written_[seq]) + ")");
}

// Note [A batch of sequences]: the program holds a KV window per sequence, and a batch step runs
// one row of each live sequence as one block: every projection reads its weights once for the m
// rows (the kernels take up to 16), while rotary, the cache write and attention go row by row,
// each row against its own sequence's cache up to its own position. A row's arithmetic is the
// same as alone except where a kernel's per-row result depends on how many rows it runs with.
void DecodeProgram::step_batch(const int64_t* tokens, const int64_t* seqs, const int64_t* positions,
                               int64_t m, int64_t* next) {
  const DecodeConfig& c = cfg_;
  if (m < 1 || m > c.sequences)
    throw InvalidArgument("decode_loop: a batch step of " + std::to_string(m) +
                          " rows; the loop holds " + std::to_string(c.sequences) + " sequences");
  for (int64_t r = 0; r < m; ++r) {
    check_token(tokens[r], w_.embed.shape[0]);
    for (int64_t j = 0; j < r; ++j)
      if (seqs[j] == seqs[r])
        throw InvalidArgument("decode_loop: sequence " + std::to_string(seqs[r]) +
                              " twice in one batch step");
    if (positions[r] < 0 || positions[r] >= c.max_len)
      throw InvalidArgument("decode_loop: position " + std::to_string(positions[r]) +
                            " outside the static window of " + std::to_string(c.max_len));
    check_start(seqs[r], positions[r]);
  }
  run_rows(tokens, seqs, positions, m, next);
  for (int64_t r = 0; r < m; ++r) written_[seqs[r]] = std::max(written_[seqs[r]], positions[r] + 1);
}

void DecodeProgram::rotate(float* x, int64_t heads, const float* cos, const float* sin) {
  const DecodeConfig& c = cfg_;
  if (c.rotary_dim == c.head_dim) {
    frt_rotary_args a{heads, c.head_dim, x, cos, sin};
    parallel(rotary_, a, "rotary", heads * c.head_dim);
    return;
  }
  // Partial rotary: each head's leading rotary_dim dims rotate (their halves pair), the rest
  // pass through; the kernel rotates whole contiguous vectors, so one head at a time.
  for (int64_t h = 0; h < heads; ++h) {
    frt_rotary_args a{1, c.rotary_dim, x + h * c.head_dim, cos, sin};
    parallel(rotary_, a, "rotary", c.rotary_dim);
  }
}

int64_t DecodeProgram::run_rows(const int64_t* tokens, const int64_t* seqs,
                                const int64_t* positions, int64_t m, int64_t* next) {
  const DecodeConfig& c = cfg_;
  const int64_t H = c.hidden, qd = c.heads * c.head_dim, kvd = c.kv_heads * c.head_dim;
  const int64_t half = c.rotary_dim / 2, B = kPromptBlock;
  for (int64_t r = 0; r < m; ++r) {
    float* h = h_.data() + r * H;
    std::memcpy(h, static_cast<const float*>(w_.embed.data) + tokens[r] * w_.embed.strides[0],
                H * sizeof(float));
    if (c.embed_scale != 1.0f)
      for (int64_t i = 0; i < H; ++i) h[i] *= c.embed_scale;
    // The host computes cos/sin in fp32 as (pos * inv_freq), scaled; so does the loop, for each
    // of its rotary tables.
    for (size_t t = 0; t < c.rotaries.size(); ++t) {
      const DecodeRotary& rot = c.rotaries[t];
      for (int64_t i = 0; i < half; ++i) {
        const float f = static_cast<float>(positions[r]) * rot.inv_freq[i];
        cos_[(t * B + r) * half + i] = std::cos(f) * rot.attention_scaling;
        sin_[(t * B + r) * half + i] = std::sin(f) * rot.attention_scaling;
      }
    }
  }
  const float scale =
      c.attention_scale > 0 ? c.attention_scale : 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const auto normed = [&](const float* norm) {
    if (norm == nullptr) return h_.data();
    std::memcpy(xn_.data(), h_.data(), m * H * sizeof(float));
    norm_rows(norm, xn_.data(), m, H);
    return xn_.data();
  };
  for (int64_t l = 0; l < c.layers; ++l) {
    const LayerWeights& L = w_.layers[l];
    const DecodeLayerConfig& lc = c.layer[l];
    const float* x = normed(L.attn_in_norm);
    if (L.qkv.present()) {
      // One projection [q; k; v]: each row's three parts into their buffers.
      project(L.qkv, x, qkv_.data(), m);
      for (int64_t r = 0; r < m; ++r) {
        const float* row = qkv_.data() + r * (qd + 2 * kvd);
        std::memcpy(q_.data() + r * qd, row, qd * sizeof(float));
        std::memcpy(k_.data() + r * kvd, row + qd, kvd * sizeof(float));
        std::memcpy(v_.data() + r * kvd, row + qd + kvd, kvd * sizeof(float));
      }
    } else {
      project_group({{&L.q, q_.data()}, {&L.k, k_.data()}, {&L.v, v_.data()}}, x, m);
    }
    if (lc.qk_norm == QkNorm::per_head) {
      norm_rows(L.q_norm, q_.data(), m * c.heads, c.head_dim);
      norm_rows(L.k_norm, k_.data(), m * c.kv_heads, c.head_dim);
    } else if (lc.qk_norm == QkNorm::whole) {
      norm_rows(L.q_norm, q_.data(), m, qd);
      norm_rows(L.k_norm, k_.data(), m, kvd);
    }
    // Row by row: each row's own rotation, its K/V into its sequence's cache, then attention
    // over every position up to its own (causal inside a prompt block), or its window's.
    for (int64_t r = 0; r < m; ++r) {
      const int64_t pos = positions[r], seq = seqs[r];
      if (lc.rotary >= 0) {
        const int64_t at = (lc.rotary * B + r) * half;
        rotate(q_.data() + r * qd, c.heads, cos_.data() + at, sin_.data() + at);
        rotate(k_.data() + r * kvd, c.kv_heads, cos_.data() + at, sin_.data() + at);
      }
      for (int64_t j = 0; j < c.kv_heads; ++j) {
        const int64_t at = r * kvd + j * c.head_dim;
        to_cache(cache_at(seq, l, 0, j) + pos * c.head_dim * cache_elem_, k_.data() + at);
        to_cache(cache_at(seq, l, 1, j) + pos * c.head_dim * cache_elem_, v_.data() + at);
      }
    }
    for (int64_t r = 0; r < m; ++r) {
      const int64_t pos = positions[r], seq = seqs[r];
      // A sliding layer attends to the last `window` positions, its own included.
      const int64_t first = lc.window > 0 ? std::max<int64_t>(0, pos - lc.window + 1) : 0;
      attend(seq, l, first, pos + 1 - first, q_.data() + r * qd, attn_.data() + r * qd, scale);
    }
    project(L.o, attn_.data(), o_.data(), m);
    if (L.attn_out_norm != nullptr) norm_rows(L.attn_out_norm, o_.data(), m, H);
    residual(h_.data(), o_.data(), m * H);
    x = normed(L.ffn_in_norm);
    if (L.routed)
      moe(L.moe, x, mlp_out_.data(), m);
    else
      ffn(L.mlp, x, mlp_out_.data(), m);
    if (L.ffn_out_norm != nullptr) norm_rows(L.ffn_out_norm, mlp_out_.data(), m, H);
    residual(h_.data(), mlp_out_.data(), m * H);
  }
  // The head over every row of a batch step, over the last row of a prompt block.
  const int64_t rows = next != nullptr ? m : 1;
  float* first = h_.data() + (m - rows) * H;
  norm_rows(w_.final_norm, first, rows, H);
  project(w_.head, first, logits_.data(), rows);
  logits_rows_ = rows;
  return greedy_tokens(rows, next);
}

namespace {

// The first index of the largest value of lg[b, e) that a `>` scan from -inf takes (NaN never
// does), with its value; index -1 where none does. Eight running maxima over interleaved lanes:
// the one compare-and-select chain was a cycle of latency a logit.
struct Greedy {
  float value = -std::numeric_limits<float>::infinity();
  int64_t index = -1;
  // Takes o where it is larger, or equal and earlier: the order-free merge of two scans.
  void merge(const Greedy& o) {
    if (o.index >= 0 && (index < 0 || o.value > value || (o.value == value && o.index < index)))
      *this = o;
  }
};

Greedy scan_greedy(const float* lg, int64_t b, int64_t e) {
  constexpr int kLanes = 8;
  Greedy lane[kLanes];
  int64_t i = b;
  for (; i + kLanes <= e; i += kLanes)
    for (int j = 0; j < kLanes; ++j)
      if (lg[i + j] > lane[j].value) lane[j] = {lg[i + j], i + j};
  for (; i < e; ++i)  // after every lane's elements: a lane keeps its first maximum
    if (lg[i] > lane[0].value) lane[0] = {lg[i], i};
  Greedy best;
  for (const Greedy& l : lane) best.merge(l);
  return best;
}

}  // namespace

// Note [Greedy tokens on the team]: a batch step's logits are rows x vocab (16 x 262,144 at
// Gemma 3's vocabulary), and one thread finishing and scanning them while the other waited was
// ~4% of a 16-row step (and of a one-row step on a large vocabulary, ~0.3 ms). Each row is cut
// into one contiguous range per team thread; a thread finishes its ranges as the host orders it
// (divided by the family's scale, then softcapped, c·tanh(l / c)) and scans them, and the ranges'
// results merge. The token is the serial scan's: the first index of the largest value, NaN never
// taken, index 0 where nothing beats logit 0 (a NaN there, or nothing above -inf).
int64_t DecodeProgram::greedy_tokens(int64_t rows, int64_t* next) {
  const DecodeConfig& c = cfg_;
  Parallel& par = process_parallel();
  const int nth = rows * c.vocab < 16384 ? 1 : par.size();
  std::vector<Greedy> found(static_cast<size_t>(rows * nth));
  par.run(nth, [&](int ith, int team) {
    for (int64_t r = 0; r < rows; ++r) {
      float* lg = logits_.data() + r * c.vocab;
      const int64_t b = c.vocab * ith / team, e = c.vocab * (ith + 1) / team;
      if (c.logits_divisor != 1.0f)
        for (int64_t i = b; i < e; ++i) lg[i] /= c.logits_divisor;
      if (c.final_softcap > 0)
        for (int64_t i = b; i < e; ++i)
          lg[i] = std::tanh(lg[i] / c.final_softcap) * c.final_softcap;
      found[r * nth + ith] = scan_greedy(lg, b, e);
    }
  });
  int64_t best = 0;
  for (int64_t r = 0; r < rows; ++r) {
    Greedy g;
    for (int t = 0; t < nth; ++t) g.merge(found[r * nth + t]);
    best = std::isnan(logits_[r * c.vocab]) || g.index < 0 ? 0 : g.index;
    if (next != nullptr) next[r] = best;
  }
  return best;
}

// Positions [0, n) of a layer's cache against the door's layout [n][kv_heads][head_dim]: `copy`
// gets each row's cache K and V and the row's offset in the door's buffers.
void DecodeProgram::for_cache_rows(int64_t seq, int64_t layer, int64_t first, int64_t n,
                                   const std::function<void(char*, char*, int64_t)>& copy) const {
  if (seq < 0 || seq >= cfg_.sequences || layer < 0 || layer >= cfg_.layers || n < 0 || first < 0 ||
      first + n > cfg_.max_len)
    throw InvalidArgument("decode_loop: cache of sequence " + std::to_string(seq) + ", layer " +
                          std::to_string(layer) + " at positions " + std::to_string(first) + ".." +
                          std::to_string(first + n) + " does not fit the window of " +
                          std::to_string(cfg_.max_len));
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < cfg_.kv_heads; ++j)
      copy(cache_at(seq, layer, 0, j) + (first + t) * cfg_.head_dim * cache_elem_,
           cache_at(seq, layer, 1, j) + (first + t) * cfg_.head_dim * cache_elem_,
           (t * cfg_.kv_heads + j) * cfg_.head_dim);
}

void DecodeProgram::load_cache(int64_t layer, int64_t n, const float* k, const float* v,
                               int64_t first, int64_t seq) {
  for_cache_rows(seq, layer, first, n, [&](char* ck, char* cv, int64_t at) {
    to_cache(ck, k + at);
    to_cache(cv, v + at);
  });
  // A sliding layer's host cache holds its window's last positions: what lies before them is
  // outside every later row's window, so the sequence counts as written up to first + n.
  written_[seq] = std::max(written_[seq], first + n);
}

void DecodeProgram::read_cache(int64_t layer, int64_t n, float* k, float* v, int64_t seq) const {
  for_cache_rows(seq, layer, 0, n, [&](char* ck, char* cv, int64_t at) {
    from_cache(ck, k + at);
    from_cache(cv, v + at);
  });
}

int64_t DecodeProgram::weight_bytes() const {
  auto bytes = [](const ProjWeights& p) -> int64_t {
    if (p.seat != nullptr) return p.seat->nbytes();
    return p.n() * p.k() * (p.host.dtype == DType::f32 ? 4 : 2);
  };
  int64_t total = bytes(w_.head);
  for (const LayerWeights& L : w_.layers) {
    total += (L.qkv.present() ? bytes(L.qkv) : bytes(L.q) + bytes(L.k) + bytes(L.v)) + bytes(L.o);
    const auto ffn_bytes = [&](const FfnWeights& f) {
      if (f.seat != nullptr) return f.seat->nbytes();
      return (f.gate_up.present() ? bytes(f.gate_up) : bytes(f.gate) + bytes(f.up)) + bytes(f.down);
    };
    if (!L.routed) {
      total += ffn_bytes(L.mlp);
      continue;
    }
    // A routed layer's step reads the router and its top-k experts (and the shared expert).
    const MoeWeights& M = L.moe;
    const BankWeights& b = M.bank;
    const int64_t expert = b.seat != nullptr
                               ? b.seat->bank().expert_nbytes()
                               : 3 * b.inner() * b.hidden() * (b.gate.dtype == DType::f32 ? 4 : 2);
    total += bytes(M.router) + M.top_k * expert;
    if (M.shared) total += ffn_bytes(M.shared_expert) + bytes(M.shared_gate);
  }
  return total;
}

}  // namespace frt
