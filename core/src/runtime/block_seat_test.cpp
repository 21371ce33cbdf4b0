// The decoder block seat: head() and tail() compute what its parts' seats compute one after the
// other (bit for bit: the same seats, the same kernels), with q/k/v as one pack or three seats,
// and a routed layer's router and bank (by value: the router's own summation order), with a
// shared expert mixed in by its sigmoid gate or without;
// a missing part is refused at build; a call outside the band, or an attention call the op does
// not take, misses before anything is written; the self-check's judge names what failed.
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/seat.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

namespace frt {
namespace {

KernelHub& hub() {
  static KernelHub h([] {
    KernelPathConfig c;
    c.bundled_root = FRT_TEST_KERNEL_ROOT;
    return c;
  }());
  return h;
}

std::vector<float> ramp(int64_t n, float scale, float phase) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + phase);
  return v;
}

TensorView view(std::vector<float>& v, std::array<int64_t, 4> shape, int rank) {
  TensorView t;
  t.data = v.data();
  t.rank = rank;
  t.shape = shape;
  int64_t stride = 1;
  for (int i = rank - 1; i >= 0; --i) {
    t.strides[i] = stride;
    stride *= shape[i];
  }
  return t;
}

TensorView rows(std::vector<float>& v, int64_t r, int64_t c) { return view(v, {r, c, 0, 0}, 2); }

constexpr int64_t kHidden = 64, kHeads = 4, kKv = 2, kDim = 16, kInter = 96, kPos = 5, kExperts = 6,
                  kTopK = 2;

// One layer's seats, built from plans as the door builds them.
struct Layer {
  std::vector<float> n1 = ramp(kHidden, 0.4f, 0.1f), n2 = ramp(kHidden, 0.4f, 0.5f),
                     qn = ramp(kDim, 0.4f, 0.9f), kn = ramp(kDim, 0.4f, 1.3f),
                     wq = ramp(kHeads * kDim * kHidden, 0.05f, 0.2f),
                     wk = ramp(kKv * kDim * kHidden, 0.05f, 0.6f),
                     wv = ramp(kKv * kDim * kHidden, 0.05f, 1.0f),
                     wo = ramp(kHidden * kHeads * kDim, 0.05f, 1.4f),
                     gate = ramp(kInter * kHidden, 0.05f, 1.8f),
                     up = ramp(kInter * kHidden, 0.05f, 2.2f),
                     down = ramp(kHidden * kInter, 0.05f, 2.6f);
  // A routed feed-forward's bank ([experts, out, in]) and router ([experts, hidden]).
  std::vector<float> bank_gate = ramp(kExperts * kInter * kHidden, 0.05f, 0.3f),
                     bank_up = ramp(kExperts * kInter * kHidden, 0.05f, 0.8f),
                     bank_down = ramp(kExperts * kHidden * kInter, 0.05f, 1.1f),
                     router = ramp(kExperts * kHidden, 0.2f, 1.7f);
  // A shared expert's gate ([1, hidden]); the shared expert itself takes the dense weights.
  std::vector<float> shared_gate = ramp(kHidden, 0.1f, 0.4f);
  std::map<std::string, std::unique_ptr<Seat>> seats;

  static SeatPlan plan(OpKind op, const char* package, const char* site) {
    SeatPlan p;
    p.site = site;
    p.replaces = {site};
    p.op = op;
    p.package = package;
    p.act_dtype = DType::f32;
    p.band_min = 1;
    p.band_max = 16;
    if (op == OpKind::linear || op == OpKind::gated_ffn || op == OpKind::moe_ffn) {
      p.form.name = "int8";
      p.form.format = WeightFormat::int8_channel;
      p.impl = "w8a16";
    } else {
      p.form.name = "host";
      p.form.host = true;
      p.impl = "f32";
      p.band_max = op == OpKind::attention ? 1 : kUnboundedRows;
    }
    p.seam.dims = {{"heads", kHeads}, {"kv_heads", kKv}, {"head_dim", kDim}};
    return p;
  }
  void norm(const char* role, std::vector<float>& w) {
    SeatPlan p = plan(OpKind::rmsnorm, "flashrt/decode", role);
    p.seam.dims = {{"width", static_cast<int64_t>(w.size())}};
    p.seam.norm.form = NormForm::rms;
    p.seam.norm.eps = 1e-6;
    TensorView t = view(w, {static_cast<int64_t>(w.size()), 0, 0, 0}, 1);
    seats[role] = build_seat(p, {{"weight", t}}, GuardMode::fallback, hub());
  }
  static TensorView bank_view(std::vector<float>& v, int64_t e, int64_t n, int64_t k) {
    return view(v, {e, n, k, 0}, 3);
  }
  explicit Layer(bool packed, bool routed = false, bool shared = false) {
    norm("input_norm", n1);
    norm("post_norm", n2);
    norm("q_norm", qn);
    norm("k_norm", kn);
    if (packed) {
      SeatPlan p = plan(OpKind::linear, "flashrt/linear", "q");
      p.replaces = {"q", "k", "v"};
      for (const char* s : {"q", "k", "v"}) p.slots[s] = {s, "weight"};
      seats["qkv"] = build_seat(p,
                                {{"q", rows(wq, kHeads * kDim, kHidden)},
                                 {"k", rows(wk, kKv * kDim, kHidden)},
                                 {"v", rows(wv, kKv * kDim, kHidden)}},
                                GuardMode::fallback, hub());
    } else {
      for (auto& [s, w, out] : {std::tuple{"q", &wq, kHeads * kDim},
                                std::tuple{"k", &wk, kKv * kDim}, std::tuple{"v", &wv, kKv * kDim}})
        seats[s] = build_seat(plan(OpKind::linear, "flashrt/linear", s),
                              {{"weight", rows(*w, out, kHidden)}}, GuardMode::fallback, hub());
    }
    seats["o"] =
        build_seat(plan(OpKind::linear, "flashrt/linear", "o"),
                   {{"weight", rows(wo, kHidden, kHeads * kDim)}}, GuardMode::fallback, hub());
    if (routed) {
      SeatPlan f = plan(OpKind::moe_ffn, "flashrt/ffn", "bank");
      f.seam.structure = "moe_experts";
      f.activation = Activation::silu;
      f.form.format = WeightFormat::int8_group;
      f.form.group = 32;
      f.form.symmetric = true;
      f.form.scale_dtype = DType::f16;
      seats["bank"] = build_seat(f,
                                 {{"gate", bank_view(bank_gate, kExperts, kInter, kHidden)},
                                  {"up", bank_view(bank_up, kExperts, kInter, kHidden)},
                                  {"down", bank_view(bank_down, kExperts, kHidden, kInter)}},
                                 GuardMode::fallback, hub());
    }
    if (!routed || shared) {
      SeatPlan f = plan(OpKind::gated_ffn, "flashrt/ffn", routed ? "shared" : "ffn");
      f.activation = Activation::silu;
      seats[routed ? "shared" : "ffn"] = build_seat(f,
                                                    {{"gate", rows(gate, kInter, kHidden)},
                                                     {"up", rows(up, kInter, kHidden)},
                                                     {"down", rows(down, kHidden, kInter)}},
                                                    GuardMode::fallback, hub());
    }
    seats["rotary"] = build_seat(plan(OpKind::rotary, "flashrt/decode", "rotary"), {},
                                 GuardMode::fallback, hub());
    seats["attention"] = build_seat(plan(OpKind::attention, "flashrt/decode", "attention"), {},
                                    GuardMode::fallback, hub());
  }
  std::map<std::string, Seat*> parts() {
    std::map<std::string, Seat*> out;
    for (auto& [role, s] : seats) out[role] = s.get();
    return out;
  }
  // The plan of the layer's block, as the planner writes one (a routed one's router form).
  static SeatPlan block_plan(RouterForm form = RouterForm::softmax_topk_renormalised) {
    SeatPlan p;
    p.site = "layers.0";
    p.seam.structure = "decoder_block";
    p.op = OpKind::block;
    p.act_dtype = DType::f32;
    p.band_min = 1;
    p.band_max = 16;
    p.seam.dims = {{"hidden", kHidden}};
    p.seam.attention.heads = kHeads;
    p.seam.attention.kv_heads = kKv;
    p.seam.attention.head_dim = kDim;
    p.seam.router.form = form;
    p.seam.router.top_k = kTopK;
    return p;
  }
  std::unique_ptr<BlockSeat> block() {
    TensorView r = rows(router, kExperts, kHidden), g = rows(shared_gate, 1, kHidden);
    return build_block_seat(block_plan(), parts(), GuardMode::fallback,
                            seats.count("bank") ? &r : nullptr,
                            seats.count("shared") ? &g : nullptr);
  }
};

// The routed feed-forward as the host's sparse block computes it, in double: softmax(n2 W^T),
// its top-k renormalised (the block plan's form), each chosen expert's gated output through the
// bank's seat on that row alone (the seat's own rounding), weighted and summed.
std::vector<float> routed_reference(Layer& l, std::vector<float>& n2, int64_t b) {
  std::vector<float> out(b * kHidden, 0.0f);
  for (int64_t r = 0; r < b; ++r) {
    std::vector<double> p(kExperts);
    double top = -INFINITY, sum = 0;
    for (int64_t e = 0; e < kExperts; ++e) {
      double z = 0;
      for (int64_t i = 0; i < kHidden; ++i)
        z += static_cast<double>(n2[r * kHidden + i]) * l.router[e * kHidden + i];
      p[e] = z;
      top = std::max(top, z);
    }
    for (double& z : p) sum += (z = std::exp(z - top));
    std::vector<int64_t> order(kExperts);
    for (int64_t e = 0; e < kExperts; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t c) { return p[a] > p[c]; });
    double chosen = 0;
    for (int64_t j = 0; j < kTopK; ++j) chosen += p[order[j]] / sum;
    for (int64_t j = 0; j < kTopK; ++j) {
      std::vector<int64_t> index = {order[j]};
      std::vector<float> weight = {static_cast<float>(p[order[j]] / sum / chosen)}, one(kHidden);
      std::vector<float> xr(n2.begin() + r * kHidden, n2.begin() + (r + 1) * kHidden);
      TensorView iv = TensorView::matrix(index.data(), DType::i64, 1, 1, 1);
      const Routing routing{iv, TensorView::matrix(weight.data(), DType::f32, 1, 1, 1)};
      EXPECT_EQ(l.seats["bank"]->run(rows(xr, 1, kHidden), rows(one, 1, kHidden), false, &routing),
                Verdict::ran);
      for (int64_t i = 0; i < kHidden; ++i) out[r * kHidden + i] += one[i];
    }
  }
  return out;
}

// The rotate-half tables of one position, [1, 1, dim].
void tables(std::vector<float>& cos, std::vector<float>& sin, int64_t position) {
  cos.resize(kDim);
  sin.resize(kDim);
  for (int64_t i = 0; i < kDim / 2; ++i) {
    const float a = static_cast<float>(position) * std::pow(10.0f, -static_cast<float>(i) / 4);
    cos[i] = cos[i + kDim / 2] = std::cos(a);
    sin[i] = sin[i + kDim / 2] = std::sin(a);
  }
}

// What the door would do with the parts' seats one by one: y for x given the cache's earlier
// keys and values ([b, kv, kPos - 1, dim] each, the step's appended at the end).
std::vector<float> by_parts(Layer& l, std::vector<float>& x, int64_t b, std::vector<float>& cos,
                            std::vector<float>& sin, std::vector<float>& cache_k,
                            std::vector<float>& cache_v) {
  const int64_t qw = kHeads * kDim, kw = kKv * kDim;
  std::vector<float> n1(b * kHidden), q(b * qw), k(b * kw), v(b * kw), qn(b * qw), kn(b * kw);
  auto run = [](Seat& s, TensorView in, TensorView out) {
    ASSERT_EQ(s.run(in, out, false), Verdict::ran) << s.ledger().last_reason;
  };
  run(*l.seats["input_norm"], rows(x, b, kHidden), rows(n1, b, kHidden));
  if (l.seats.count("qkv")) {
    std::vector<float> all(b * (qw + 2 * kw));
    run(*l.seats["qkv"], rows(n1, b, kHidden), rows(all, b, qw + 2 * kw));
    for (int64_t r = 0; r < b; ++r) {
      std::memcpy(&q[r * qw], &all[r * (qw + 2 * kw)], qw * sizeof(float));
      std::memcpy(&k[r * kw], &all[r * (qw + 2 * kw) + qw], kw * sizeof(float));
      std::memcpy(&v[r * kw], &all[r * (qw + 2 * kw) + qw + kw], kw * sizeof(float));
    }
  } else {
    run(*l.seats["q"], rows(n1, b, kHidden), rows(q, b, qw));
    run(*l.seats["k"], rows(n1, b, kHidden), rows(k, b, kw));
    run(*l.seats["v"], rows(n1, b, kHidden), rows(v, b, kw));
  }
  run(*l.seats["q_norm"], rows(q, b * kHeads, kDim), rows(qn, b * kHeads, kDim));
  run(*l.seats["k_norm"], rows(k, b * kKv, kDim), rows(kn, b * kKv, kDim));
  std::vector<float> qr(b * qw), kr(b * kw);
  RotaryCall rc{view(qn, {b, kHeads, 1, kDim}, 4), view(kn, {b, kKv, 1, kDim}, 4),
                view(cos, {1, 1, kDim, 0}, 3),     view(sin, {1, 1, kDim, 0}, 3),
                view(qr, {b, kHeads, 1, kDim}, 4), view(kr, {b, kKv, 1, kDim}, 4)};
  EXPECT_EQ(dynamic_cast<RotarySeat&>(*l.seats["rotary"]).call(rc, false), Verdict::ran);
  // The cache: earlier positions, then this step's k and v.
  for (int64_t r = 0; r < b; ++r)
    for (int64_t h = 0; h < kKv; ++h) {
      const int64_t at = ((r * kKv + h) * kPos + kPos - 1) * kDim;
      std::memcpy(&cache_k[at], &kr[(r * kKv + h) * kDim], kDim * sizeof(float));
      std::memcpy(&cache_v[at], &v[(r * kKv + h) * kDim], kDim * sizeof(float));
    }
  std::vector<float> att(b * qw), o(b * kHidden), h(b * kHidden), n2(b * kHidden), f(b * kHidden);
  AttentionCall ac{view(qr, {b, kHeads, 1, kDim}, 4),
                   view(cache_k, {b, kKv, kPos, kDim}, 4),
                   view(cache_v, {b, kKv, kPos, kDim}, 4),
                   view(att, {b, 1, kHeads, kDim}, 4),
                   std::nullopt,
                   1.0f / std::sqrt(static_cast<float>(kDim)),
                   0.0f};
  EXPECT_EQ(dynamic_cast<AttentionSeat&>(*l.seats["attention"]).call(ac, false), Verdict::ran);
  run(*l.seats["o"], rows(att, b, qw), rows(o, b, kHidden));
  for (int64_t i = 0; i < b * kHidden; ++i) h[i] = x[i] + o[i];
  run(*l.seats["post_norm"], rows(h, b, kHidden), rows(n2, b, kHidden));
  if (l.seats.count("ffn"))
    run(*l.seats["ffn"], rows(n2, b, kHidden), rows(f, b, kHidden));
  else
    f = routed_reference(l, n2, b);
  if (l.seats.count("shared")) {  // + sigmoid(n2 g) * shared(n2), the gate in double
    std::vector<float> sh(b * kHidden);
    run(*l.seats["shared"], rows(n2, b, kHidden), rows(sh, b, kHidden));
    for (int64_t r = 0; r < b; ++r) {
      double z = 0;
      for (int64_t i = 0; i < kHidden; ++i)
        z += static_cast<double>(n2[r * kHidden + i]) * l.shared_gate[i];
      const double gate = 1 / (1 + std::exp(-z));
      for (int64_t i = 0; i < kHidden; ++i)
        f[r * kHidden + i] = static_cast<float>(f[r * kHidden + i] + gate * sh[r * kHidden + i]);
    }
  }
  std::vector<float> y(b * kHidden);
  for (int64_t i = 0; i < b * kHidden; ++i) y[i] = h[i] + f[i];
  return y;
}

// A routed layer (its feed-forward a router and a bank's seat) runs the router in the tail: the
// router's fp32 logits against the reference's double ones pick the same experts here (the
// ramps' probabilities are far from ties), the weights within float rounding.
TEST(BlockSeat, HeadAndTailComputeWhatItsPartsSeatsComputeOneAfterTheOther) {
  for (auto [packed, routed, shared] : {std::tuple{false, false, false},
                                        {true, false, false},
                                        {true, true, false},
                                        {false, true, true}}) {
    for (int64_t b : {int64_t{1}, int64_t{3}}) {
      SCOPED_TRACE(std::string(packed ? "one pack" : "three projections") +
                   (routed ? ", routed" : "") + (shared ? " with a shared expert" : "") +
                   ", rows " + std::to_string(b));
      Layer layer(packed, routed, shared);
      std::unique_ptr<BlockSeat> block = layer.block();
      std::vector<float> x = ramp(b * kHidden, 1.0f, 0.3f), cos, sin;
      tables(cos, sin, kPos - 1);
      std::vector<float> ck = ramp(b * kKv * kPos * kDim, 1.0f, 0.7f), cv = ramp(ck.size(), 1, 2);
      std::vector<float> want_k = ck, want_v = cv;
      const std::vector<float> want = by_parts(layer, x, b, cos, sin, want_k, want_v);

      std::vector<float> q(b * kHeads * kDim), k(b * kKv * kDim), v(b * kKv * kDim);
      ASSERT_EQ(block->head(rows(x, b, kHidden), view(cos, {1, 1, kDim, 0}, 3),
                            view(sin, {1, 1, kDim, 0}, 3), view(q, {b, kHeads, 1, kDim}, 4),
                            view(k, {b, kKv, 1, kDim}, 4), view(v, {b, kKv, 1, kDim}, 4), false),
                Verdict::ran)
          << block->ledger().last_reason;
      // The door's cache update: the step's k and v after the earlier positions.
      for (int64_t r = 0; r < b; ++r)
        for (int64_t h = 0; h < kKv; ++h) {
          const int64_t at = ((r * kKv + h) * kPos + kPos - 1) * kDim;
          std::memcpy(&ck[at], &k[(r * kKv + h) * kDim], kDim * sizeof(float));
          std::memcpy(&cv[at], &v[(r * kKv + h) * kDim], kDim * sizeof(float));
        }
      EXPECT_EQ(ck, want_k);
      EXPECT_EQ(cv, want_v);
      std::vector<float> y(b * kHidden, std::nanf(""));
      ASSERT_EQ(block->tail(rows(x, b, kHidden), view(q, {b, kHeads, 1, kDim}, 4),
                            view(ck, {b, kKv, kPos, kDim}, 4), view(cv, {b, kKv, kPos, kDim}, 4),
                            std::nullopt, rows(y, b, kHidden), false),
                Verdict::ran)
          << block->ledger().last_reason;
      if (routed) {
        double worst = 0;
        for (size_t i = 0; i < y.size(); ++i)
          worst = std::max(worst, static_cast<double>(std::fabs(y[i] - want[i])));
        EXPECT_LT(worst, 1e-4);
        EXPECT_EQ(layer.seats["bank"]->ledger().calls, 1 + 2 * b);  // the block's, the reference's
        if (shared) {
          EXPECT_EQ(layer.seats["shared"]->ledger().calls, 2);
        }
      } else {
        EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)));
      }
      EXPECT_EQ(block->ledger().calls, 1);
      EXPECT_EQ(block->ledger().fallbacks, 0);
      // Its parts' seats stream their bytes; a routed block its router's (and gate's) copy.
      EXPECT_EQ(block->nbytes(),
                (routed ? kExperts * kHidden * 4 : 0) + (shared ? kHidden * 4 : 0));
    }
  }
}

TEST(BlockSeat, MissesComeBeforeAnythingIsWrittenAndBuildRefusesAMissingPart) {
  Layer layer(false);
  std::unique_ptr<BlockSeat> block = layer.block();
  std::vector<float> cos, sin;
  tables(cos, sin, 2);
  // 17 rows: outside the band (the door runs the host's layer).
  std::vector<float> x = ramp(17 * kHidden, 1.0f, 0.3f), q(17 * kHeads * kDim, std::nanf("")),
                     k(17 * kKv * kDim, std::nanf("")), v = k;
  EXPECT_EQ(block->head(rows(x, 17, kHidden), view(cos, {1, 1, kDim, 0}, 3),
                        view(sin, {1, 1, kDim, 0}, 3), view(q, {17, kHeads, 1, kDim}, 4),
                        view(k, {17, kKv, 1, kDim}, 4), view(v, {17, kKv, 1, kDim}, 4), false),
            Verdict::fallback);
  EXPECT_NE(block->ledger().last_reason.find("rows 17 outside the band 1..16"), std::string::npos)
      << block->ledger().last_reason;
  EXPECT_TRUE(std::isnan(q[0]));
  // A mask with a hole: the attention refuses it before the tail writes anything.
  std::vector<float> x1 = ramp(kHidden, 1.0f, 0.3f), q1 = ramp(kHeads * kDim, 1.0f, 0.1f),
                     ck = ramp(kKv * kPos * kDim, 1.0f, 0.7f), cv = ck,
                     mask = {0.0f, -INFINITY, 0.0f, 0.0f, 0.0f}, y(kHidden, std::nanf(""));
  TensorView m = view(mask, {1, 1, 1, kPos}, 4);
  EXPECT_EQ(block->tail(rows(x1, 1, kHidden), view(q1, {1, kHeads, 1, kDim}, 4),
                        view(ck, {1, kKv, kPos, kDim}, 4), view(cv, {1, kKv, kPos, kDim}, 4), m,
                        rows(y, 1, kHidden), true),
            Verdict::fallback);
  EXPECT_EQ(block->ledger().last_reason, "training mode");
  EXPECT_EQ(block->tail(rows(x1, 1, kHidden), view(q1, {1, kHeads, 1, kDim}, 4),
                        view(ck, {1, kKv, kPos, kDim}, 4), view(cv, {1, kKv, kPos, kDim}, 4), m,
                        rows(y, 1, kHidden), false),
            Verdict::fallback);
  EXPECT_EQ(block->ledger().last_reason.rfind("attention attention: ", 0), 0u)
      << block->ledger().last_reason;
  EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](float f) { return std::isnan(f); }));
  EXPECT_EQ(block->ledger().fallbacks, 3);
  // A plan whose part has no seat, or a part of another kind, is refused naming it.
  std::map<std::string, Seat*> parts = layer.parts();
  parts.erase("o");
  SeatPlan p = Layer::block_plan();
  try {
    build_block_seat(p, parts, GuardMode::fallback);
    ADD_FAILURE() << "built without its o projection";
  } catch (const Refused& e) {
    EXPECT_STREQ(e.what(), "layers.0: the block's o seat is missing");
  }
  parts["o"] = layer.seats["ffn"].get();
  EXPECT_THROW(build_block_seat(p, parts, GuardMode::fallback), Refused);
  // Widths that do not chain (an o projection of another width) are refused too.
  parts["o"] = layer.seats["k"].get();
  EXPECT_THROW(build_block_seat(p, parts, GuardMode::fallback), Refused);
}

TEST(BlockSeat, TheSelfChecksJudgeNamesEachCosineBelowThePass) {
  EXPECT_EQ(BlockSeat::judge({{"k", 1.0}, {"v", 0.9999}, {"update", 0.995}}, 0.99), "");
  const std::string why = BlockSeat::judge({{"k", 0.2}, {"v", 0.999}, {"update", NAN}}, 0.99);
  EXPECT_EQ(why.rfind("self-check against the host's layer: k cosine 0.2", 0), 0u) << why;
  EXPECT_NE(why.find("update cosine nan"), std::string::npos) << why;
  EXPECT_EQ(why.find("v cosine"), std::string::npos) << why;
}

TEST(BlockSeat, ARoutedLayersRouterMustBeTheBanksAndItsForm) {
  Layer layer(false, true);
  // No router weight, a router the plan does not describe, or one of another shape: refused.
  SeatPlan p = Layer::block_plan(RouterForm::softmax_topk);
  try {
    build_block_seat(p, layer.parts(), GuardMode::fallback);
    ADD_FAILURE() << "built without a router";
  } catch (const Refused& e) {
    EXPECT_NE(std::string(e.what()).find("its router weight missing: expected f32 [6, 64]"),
              std::string::npos)
        << e.what();
  }
  TensorView short_router = rows(layer.router, kExperts - 1, kHidden);
  EXPECT_THROW(build_block_seat(p, layer.parts(), GuardMode::fallback, &short_router), Refused);
  TensorView r = rows(layer.router, kExperts, kHidden);
  p.seam.router.form = RouterForm::other;
  EXPECT_THROW(build_block_seat(p, layer.parts(), GuardMode::fallback, &r), Refused);
  p.seam.router.form = RouterForm::softmax_topk;
  p.seam.router.top_k = kExperts + 1;
  EXPECT_THROW(build_block_seat(p, layer.parts(), GuardMode::fallback, &r), Refused);
  // A dense feed-forward and a bank both, or neither, is not a block.
  p.seam.router.top_k = kTopK;
  std::map<std::string, Seat*> parts = layer.parts();
  Layer dense(false);
  parts["ffn"] = dense.seats["ffn"].get();
  EXPECT_THROW(build_block_seat(p, parts, GuardMode::fallback, &r), Refused);
  // In form, it builds.
  EXPECT_NE(build_block_seat(p, layer.parts(), GuardMode::fallback, &r), nullptr);
}

TEST(BlockSeat, ASharedExpertNeedsItsGatesWeightAndAFeedForwardSeat) {
  Layer layer(false, true, true);
  SeatPlan p = Layer::block_plan();
  TensorView r = rows(layer.router, kExperts, kHidden);
  try {
    build_block_seat(p, layer.parts(), GuardMode::fallback, &r);
    ADD_FAILURE() << "built without the shared expert's gate";
  } catch (const Refused& e) {
    EXPECT_NE(std::string(e.what()).find("its shared expert's gate weight missing: expected f32 "
                                         "[1, 64] contiguous"),
              std::string::npos)
        << e.what();
  }
  TensorView wide = rows(layer.router, 2, kHidden);  // [2, hidden]: not a gate of one output
  EXPECT_THROW(build_block_seat(p, layer.parts(), GuardMode::fallback, &r, &wide), Refused);
  // A shared part that is not a feed-forward seat is named by what it runs.
  std::map<std::string, Seat*> parts = layer.parts();
  parts["shared"] = layer.seats["k"].get();
  TensorView g = rows(layer.shared_gate, 1, kHidden);
  try {
    build_block_seat(p, parts, GuardMode::fallback, &r, &g);
    ADD_FAILURE() << "built with a projection as its shared expert";
  } catch (const Refused& e) {
    EXPECT_NE(std::string(e.what()).find("the block's shared seat (k) runs linear"),
              std::string::npos)
        << e.what();
  }
  EXPECT_NE(build_block_seat(p, layer.parts(), GuardMode::fallback, &r, &g), nullptr);
}

}  // namespace
}  // namespace frt
