// The runtime contract in the core seat: band dispatch, form misses, the consecutive-fallback
// restore, raise mode, and a second thread; and build_seat from a plan's SeatPlan.
// An expert bank's packs in one region.
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/seat.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <thread>
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

const frt_kernel_table& linear_table() { return hub().table("flashrt/linear"); }

std::unique_ptr<LinearSeat> make_seat(GuardMode mode = GuardMode::fallback) {
  std::vector<float> w(64 * 32, 0.01f);
  PackedLinear p = PackedLinear::int8(TensorView::matrix(w.data(), DType::f32, 64, 32, 32));
  SeatForm form{
      "site", "linear_proj", "linear_w8a16", OpKind::linear, DType::f32, 32, 64, 1, 16, p.form(),
      {}};
  return std::make_unique<LinearSeat>(form, linear_table(), mode, std::move(p),
                                      std::vector<float>{});
}

TEST(Seat, RunsInFormCallsAndCountsThem) {
  auto seat = make_seat();
  std::vector<float> x(2 * 32, 1.0f), y(2 * 64, 0.0f);
  EXPECT_EQ(seat->run(TensorView::matrix(x.data(), DType::f32, 2, 32, 32),
                      TensorView::matrix(y.data(), DType::f32, 2, 64, 64), false),
            Verdict::ran);
  EXPECT_NEAR(y[0], 0.32f, 1e-3);
  const Ledger l = seat->ledger();
  EXPECT_EQ(l.calls, 1);
  EXPECT_EQ(l.fallbacks, 0);
}

TEST(Seat, RowsOutsideTheBandAreBandDispatchesNotFallbacks) {
  auto seat = make_seat();
  EXPECT_EQ(seat->admit_rows(128), Verdict::band);
  EXPECT_EQ(seat->admit_rows(16), Verdict::ran);
  const Ledger l = seat->ledger();
  EXPECT_EQ(l.band_dispatches, 1);
  EXPECT_EQ(l.fallbacks, 0);
  EXPECT_EQ(l.calls, 1);
}

TEST(Seat, FormMissesFallBackWithTheirReasonAndRestoreAfter32InARow) {
  auto seat = make_seat();
  std::vector<uint16_t> xb(32, 0);
  std::vector<float> y(64);
  const TensorView bf16 = TensorView::matrix(xb.data(), DType::bf16, 1, 32, 32);
  const TensorView out = TensorView::matrix(y.data(), DType::f32, 1, 64, 64);
  for (int i = 1; i < kSelfDetachAfter; ++i)
    ASSERT_EQ(seat->run(bf16, out, false), Verdict::fallback);
  EXPECT_EQ(seat->run(bf16, out, false), Verdict::restore);
  const Ledger l = seat->ledger();
  EXPECT_EQ(l.fallbacks, kSelfDetachAfter);
  EXPECT_EQ(l.last_reason, "input dtype bf16, seated for f32");
  EXPECT_TRUE(l.restored);
  EXPECT_EQ(seat->run(bf16, out, false), Verdict::fallback);  // restore is reported once
}

TEST(Seat, ASuccessfulCallResetsTheConsecutiveCount) {
  auto seat = make_seat();
  std::vector<float> x(32, 1.0f), y(64);
  const TensorView xv = TensorView::matrix(x.data(), DType::f32, 1, 32, 32);
  const TensorView yv = TensorView::matrix(y.data(), DType::f32, 1, 64, 64);
  for (int i = 0; i < 31; ++i) seat->run(xv, yv, /*training=*/true);
  EXPECT_EQ(seat->run(xv, yv, false), Verdict::ran);
  EXPECT_EQ(seat->ledger().consecutive_fallbacks, 0);
  EXPECT_EQ(seat->ledger().reasons.at("training mode"), 31);
}

TEST(Seat, RaiseModeRaisesWithoutCounting) {
  auto seat = make_seat(GuardMode::raise);
  std::vector<float> x(32, 1.0f), y(64);
  EXPECT_EQ(seat->run(TensorView::matrix(x.data(), DType::f32, 1, 32, 32),
                      TensorView::matrix(y.data(), DType::f32, 1, 64, 64), true),
            Verdict::raise);
  EXPECT_EQ(seat->ledger().fallbacks, 0);
  EXPECT_EQ(seat->ledger().last_reason, "training mode");
}

TEST(Seat, ASecondThreadFallsBack) {
  auto seat = make_seat();
  std::vector<float> x(32, 1.0f), y(64);
  Verdict v = Verdict::ran;
  std::thread t([&] {
    v = seat->run(TensorView::matrix(x.data(), DType::f32, 1, 32, 32),
                  TensorView::matrix(y.data(), DType::f32, 1, 64, 64), false);
  });
  t.join();
  EXPECT_EQ(v, Verdict::fallback);
  EXPECT_EQ(seat->ledger().last_reason, "called from a second thread");
}

TEST(Seat, KernelRefusalsBecomeFallbacksNamingTheForm) {
  auto seat = make_seat();
  std::vector<float> x(2 * 40, 1.0f), y(64);
  TensorView xv = TensorView::matrix(x.data(), DType::f32, 1, 40, 40);
  EXPECT_EQ(seat->run(xv, TensorView::matrix(y.data(), DType::f32, 1, 64, 64), false),
            Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("width 40, expected 32"), std::string::npos);
}

// ---- build_seat: a plan's SeatPlan and the host's tensors into a bound seat. ----------------

TensorView vector_view(std::vector<float>& v) {
  TensorView t;
  t.data = v.data();
  t.dtype = DType::f32;
  t.rank = 1;
  t.shape = {static_cast<int64_t>(v.size()), 0, 0, 0};
  t.strides = {1, 0, 0, 0};
  return t;
}

TensorView matrix_view(std::vector<float>& v, int64_t rows, int64_t cols) {
  return TensorView::matrix(v.data(), DType::f32, rows, cols, cols);
}

// Deterministic, varied values (not one constant, so a swapped operand shows).
std::vector<float> ramp(int64_t n, float scale, float phase) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = scale * std::sin(0.37f * static_cast<float>(i) + phase);
  return v;
}

WeightForm int8_form() {
  WeightForm f;
  f.name = "int8";
  f.format = WeightFormat::int8_channel;
  f.tag = "w8a16";
  return f;
}

WeightForm int4_g32_form() {
  WeightForm f;
  f.name = "int4_g32";
  f.format = WeightFormat::int4_group;
  f.group = 32;
  f.symmetric = true;
  f.tag = "w4a16";
  return f;
}

SeatPlan seat_plan(OpKind op, const std::string& package, const WeightForm& form) {
  SeatPlan p;
  p.seam.structure = op == OpKind::linear ? "linear_proj" : "mlp_test";
  p.site = "layers.0.site";
  p.replaces = {p.site};
  p.impl = std::string(op == OpKind::linear ? "linear_" : "ffn_") + form.tag;
  p.package = package;
  p.op = op;
  p.form = form;
  p.band_min = 1;
  p.band_max = 16;
  p.act_dtype = DType::f32;
  return p;
}

TEST(BuildSeat, ALinearSeatComputesWhatRunLinearDoes) {
  const int64_t n = 48, k = 64, m = 3;
  std::vector<float> w = ramp(n * k, 0.05f, 0.1f), b = ramp(n, 1.0f, 0.7f), x = ramp(m * k, 1, 2);
  for (const WeightForm& form : {int8_form(), int4_g32_form()}) {
    SeatPlan plan = seat_plan(OpKind::linear, "flashrt/linear", form);
    const std::map<std::string, TensorView> tensors = {{"weight", matrix_view(w, n, k)},
                                                       {"bias", vector_view(b)}};
    std::unique_ptr<Seat> seat = build_seat(plan, tensors, GuardMode::fallback, hub());
    ASSERT_NE(seat, nullptr);
    auto* lin = dynamic_cast<LinearSeat*>(seat.get());
    ASSERT_NE(lin, nullptr) << form.name;
    ASSERT_NE(lin->bias(), nullptr);
    EXPECT_EQ(lin->bias()[5], b[5]);
    EXPECT_EQ(seat->form().op, OpKind::linear);
    EXPECT_EQ(seat->form().site, plan.site);
    EXPECT_EQ(seat->form().impl, plan.impl);
    EXPECT_EQ(seat->form().width, k);
    EXPECT_EQ(seat->form().out, n);
    EXPECT_EQ(seat->form().weights, form.describe());
    EXPECT_EQ(seat->mode(), GuardMode::fallback);
    EXPECT_EQ(&seat->table(), &linear_table());

    std::vector<float> got(m * n, std::nanf("")), want(m * n, std::nanf(""));
    ASSERT_EQ(seat->run(matrix_view(x, m, k), matrix_view(got, m, n), false), Verdict::ran)
        << seat->ledger().last_reason;
    const PackedLinear direct = form.format == WeightFormat::int8_channel
                                    ? PackedLinear::int8(matrix_view(w, n, k))
                                    : PackedLinear::int4(matrix_view(w, n, k), 32, true);
    run_linear(linear_table(), process_parallel(), direct, b.data(), matrix_view(x, m, k),
               matrix_view(want, m, n));
    EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float))) << form.name;
    EXPECT_EQ(seat->ledger().calls, 1);
    EXPECT_EQ(seat->ledger().fallbacks, 0);
  }
}

TEST(BuildSeat, AnUngatedFfnSeatComputesWhatRunFfnDoes) {
  const int64_t hidden = 64, inter = 96, m = 2;
  std::vector<float> up = ramp(inter * hidden, 0.05f, 0.3f), down = ramp(hidden * inter, 0.05f, 1),
                     ub = ramp(inter, 0.5f, 0.2f), db = ramp(hidden, 0.5f, 1.3f),
                     x = ramp(m * hidden, 1.0f, 0.5f);
  const frt_kernel_table& ffn = hub().table("flashrt/ffn");
  for (const WeightForm& form : {int8_form(), int4_g32_form()})
    for (bool biased : {false, true}) {
      SCOPED_TRACE(form.name + (biased ? " with biases" : " bias-free"));
      SeatPlan plan = seat_plan(OpKind::ffn, "flashrt/ffn", form);
      plan.activation = Activation::gelu;
      std::map<std::string, TensorView> tensors = {{"up", matrix_view(up, inter, hidden)},
                                                   {"down", matrix_view(down, hidden, inter)}};
      if (biased) {
        tensors["up_bias"] = vector_view(ub);
        tensors["down_bias"] = vector_view(db);
      }
      std::unique_ptr<Seat> seat = build_seat(plan, tensors, GuardMode::fallback, hub());
      auto* f = dynamic_cast<FfnSeat*>(seat.get());
      ASSERT_NE(f, nullptr);
      EXPECT_EQ(f->gate(), nullptr);
      EXPECT_EQ(f->activation(), Activation::gelu);
      EXPECT_EQ(seat->form().op, OpKind::ffn);
      EXPECT_EQ(seat->form().width, hidden);
      EXPECT_EQ(seat->form().out, hidden);
      EXPECT_EQ(&seat->table(), &ffn);
      EXPECT_EQ(f->operands().up_bias != nullptr, biased);
      EXPECT_EQ(f->operands().down_bias != nullptr, biased);

      std::vector<float> got(m * hidden, std::nanf("")), want(m * hidden, std::nanf(""));
      ASSERT_EQ(seat->run(matrix_view(x, m, hidden), matrix_view(got, m, hidden), false),
                Verdict::ran)
          << seat->ledger().last_reason;
      const auto packed = [&](std::vector<float>& v, int64_t rows, int64_t cols) {
        return form.format == WeightFormat::int8_channel
                   ? PackedLinear::int8(matrix_view(v, rows, cols))
                   : PackedLinear::int4(matrix_view(v, rows, cols), 32, true);
      };
      const PackedLinear pu = packed(up, inter, hidden), pd = packed(down, hidden, inter);
      FfnOperands ops;
      ops.up = &pu;
      ops.down = &pd;
      ops.up_bias = biased ? ub.data() : nullptr;
      ops.down_bias = biased ? db.data() : nullptr;
      ops.act = Activation::gelu;
      run_ffn(ffn, process_parallel(), ops, matrix_view(x, m, hidden),
              matrix_view(want, m, hidden));
      EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
    }
}

TEST(BuildSeat, AMissingOperandIsInvalidArgumentNamingIt) {
  const int64_t hidden = 32, inter = 64;
  std::vector<float> up = ramp(inter * hidden, 0.05f, 0), w = ramp(16 * hidden, 0.05f, 0);
  SeatPlan ffn = seat_plan(OpKind::ffn, "flashrt/ffn", int8_form());
  ffn.activation = Activation::gelu_tanh;
  try {
    build_seat(ffn, {{"up", matrix_view(up, inter, hidden)}}, GuardMode::fallback, hub());
    FAIL() << "build_seat built an ffn seat without its down weight";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'down'"), std::string::npos) << e.what();
  }
  SeatPlan lin = seat_plan(OpKind::linear, "flashrt/linear", int8_form());
  try {
    build_seat(lin, {{"bias", matrix_view(w, 16, hidden)}}, GuardMode::fallback, hub());
    FAIL() << "build_seat built a linear seat without its weight";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("'weight'"), std::string::npos) << e.what();
  }
}

TEST(BuildSeat, AWeightOfTheWrongShapeIsRefusedNamingTheOperand) {
  const int64_t hidden = 32, inter = 64;
  std::vector<float> up = ramp(inter * hidden, 0.05f, 0), down = ramp(hidden * 48, 0.05f, 1);
  SeatPlan plan = seat_plan(OpKind::ffn, "flashrt/ffn", int8_form());
  plan.activation = Activation::silu;
  // down must be [hidden, inter] = [32, 64] to chain after up [64, 32]; this one is [32, 48].
  try {
    build_seat(plan,
               {{"up", matrix_view(up, inter, hidden)}, {"down", matrix_view(down, hidden, 48)}},
               GuardMode::fallback, hub());
    FAIL() << "build_seat accepted a down weight that does not chain";
  } catch (const Refused& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("down"), std::string::npos) << msg;
    EXPECT_NE(msg.find("[32, 48]"), std::string::npos) << msg;  // the shape it got
    EXPECT_NE(msg.find("[32, 64]"), std::string::npos) << msg;  // the shape it needs
  }
}

TEST(BuildSeat, APackedSeatStacksItsModulesAndComputesWhatEachWouldAlone) {
  // Three projections of one input, the second without a bias: one linear over the stack.
  const int64_t k = 64, m = 3;
  const std::vector<int64_t> outs = {48, 16, 32};
  std::vector<std::vector<float>> ws, bs;
  for (size_t i = 0; i < outs.size(); ++i) {
    ws.push_back(ramp(outs[i] * k, 0.03f * static_cast<float>(i + 1), 0.1f));
    bs.push_back(ramp(outs[i], 0.5f, 0.3f * static_cast<float>(i + 1)));
  }
  SeatPlan plan = seat_plan(OpKind::linear, "flashrt/linear", int8_form());
  plan.replaces = {"attn.to_v", "attn.to_q", "attn.to_k"};  // the order the host calls them
  std::map<std::string, TensorView> tensors;
  for (size_t i = 0; i < outs.size(); ++i) {
    const std::string node = std::string(1, "vqk"[i]);
    plan.slots[node] = {plan.replaces[i], "weight"};
    tensors[node] = matrix_view(ws[i], outs[i], k);
    if (i == 1) continue;
    plan.slots[node + "_bias"] = {plan.replaces[i], "bias"};
    tensors[node + "_bias"] = vector_view(bs[i]);
  }
  std::unique_ptr<Seat> seat = build_seat(plan, tensors, GuardMode::fallback, hub());
  EXPECT_EQ(seat->form().splits, outs);
  EXPECT_EQ(seat->form().out, 96);
  std::vector<float> x = ramp(m * k, 1, 2);
  std::vector<float> got(m * 96);
  ASSERT_EQ(seat->run(matrix_view(x, m, k), matrix_view(got, m, 96), false), Verdict::ran);
  int64_t col = 0;
  for (size_t i = 0; i < outs.size(); ++i) {
    const PackedLinear alone = PackedLinear::int8(matrix_view(ws[i], outs[i], k));
    std::vector<float> want(m * outs[i]);
    run_linear(linear_table(), process_parallel(), alone, i == 1 ? nullptr : bs[i].data(),
               matrix_view(x, m, k), matrix_view(want, m, outs[i]));
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < outs[i]; ++c)
        EXPECT_EQ(got[r * 96 + col + c], want[r * outs[i] + c]) << i << " " << r << " " << c;
    col += outs[i];
  }
  // A member: its own width and columns, no kernel, its own ledger.
  std::unique_ptr<Seat> member = member_seat(*seat, 2, "attn.to_k");
  EXPECT_EQ(member->form().out, 32);
  EXPECT_EQ(member->form().site, "attn.to_k");
  EXPECT_NE(member->form().weights.find("columns 64..96 of the pack at"), std::string::npos);
  EXPECT_EQ(member->nbytes(), 0);
  EXPECT_EQ(member->miss("called with another tensor"), Verdict::fallback);
  EXPECT_EQ(member->ledger().fallbacks, 1);
  EXPECT_EQ(seat->ledger().fallbacks, 0);
  EXPECT_THROW(member_seat(*seat, 3, "x"), InvalidArgument);
  EXPECT_THROW(member_seat(*seat, 0, "x"), InvalidArgument);
  EXPECT_THROW(member_seat(*member, 1, "x"), InvalidArgument);
  // A member whose width differs from the others' is refused with its shape.
  std::vector<float> odd(16 * 32, 0.1f);
  tensors["q"] = matrix_view(odd, 16, 32);
  EXPECT_THROW(build_seat(plan, tensors, GuardMode::fallback, hub()), Refused);
}

// [experts, out, in], contiguous: a host's bank as the door hands it.
TensorView bank_view(std::vector<float>& v, int64_t experts, int64_t out, int64_t in) {
  TensorView t;
  t.data = v.data();
  t.dtype = DType::f32;
  t.rank = 3;
  t.shape = {experts, out, in, 0};
  t.strides = {out * in, in, 1, 0};
  return t;
}

TEST(BuildSeat, ABankTakesAdoptedPacksPerExpertAndRefusesPartialOrStrayKeys) {
  const int64_t experts = 4, inner = 64, hidden = 64, m = 2, top_k = 2;
  std::vector<float> gate = ramp(experts * inner * hidden, 0.05f, 0.1f),
                     up = ramp(experts * inner * hidden, 0.05f, 0.9f),
                     down = ramp(experts * hidden * inner, 0.05f, 1.7f);
  std::vector<float> zeros(gate.size(), 0.0f);  // the host views a fully adopted bank is handed
  WeightForm form;
  form.name = form.tag = "q8_g32";
  form.format = WeightFormat::int8_group;
  form.group = 32;
  form.symmetric = true;
  form.scale_dtype = DType::f16;
  SeatPlan plan = seat_plan(OpKind::moe_ffn, "flashrt/ffn", form);
  plan.seam.structure = "moe_experts";
  plan.activation = Activation::silu;
  const auto views = [&](std::vector<float>& g, std::vector<float>& u, std::vector<float>& d) {
    return std::map<std::string, TensorView>{{"gate", bank_view(g, experts, inner, hidden)},
                                             {"up", bank_view(u, experts, inner, hidden)},
                                             {"down", bank_view(d, experts, hidden, inner)}};
  };
  // The checkpoint's packs: each expert's [out, in] in the plan's form.
  const auto adopted = [&](int64_t gates) {
    std::map<std::string, PackedLinear> a;
    for (int64_t e = 0; e < experts; ++e) {
      const std::string i = "/" + std::to_string(e);
      const auto one = [&](std::vector<float>& w, int64_t n, int64_t k) {
        return PackedLinear::int8(TensorView::matrix(w.data() + e * n * k, DType::f32, n, k, k), 32,
                                  DType::f16);
      };
      if (e < gates) a.emplace("gate" + i, one(gate, inner, hidden));
      a.emplace("up" + i, one(up, inner, hidden));
      a.emplace("down" + i, one(down, hidden, inner));
    }
    return a;
  };
  std::unique_ptr<Seat> packed =
      build_seat(plan, views(gate, up, down), GuardMode::fallback, hub());
  std::unique_ptr<Seat> taken =
      build_seat(plan, views(zeros, zeros, zeros), GuardMode::fallback, hub(), adopted(experts));
  EXPECT_EQ(taken->form().weights, "4 experts, int8 g32 f16 scales");
  // The same values either way: the adopted packs, not the (zero) host views, are seated.
  std::vector<float> x = ramp(m * hidden, 1, 2), w = {0.75f, 0.25f, 0.5f, 0.5f};
  std::vector<int64_t> index = {1, 3, 0, 2};
  Routing r{TensorView::matrix(index.data(), DType::i64, m, top_k, top_k),
            TensorView::matrix(w.data(), DType::f32, m, top_k, top_k)};
  std::vector<float> want(m * hidden, std::nanf("")), got(m * hidden, std::nanf(""));
  ASSERT_EQ(packed->run(matrix_view(x, m, hidden), matrix_view(want, m, hidden), false, &r),
            Verdict::ran)
      << packed->ledger().last_reason;
  ASSERT_EQ(taken->run(matrix_view(x, m, hidden), matrix_view(got, m, hidden), false, &r),
            Verdict::ran)
      << taken->ledger().last_reason;
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)));
  EXPECT_NE(got[0], 0.0f);

  const auto refusal = [&](std::map<std::string, PackedLinear> a) {
    try {
      build_seat(plan, views(gate, up, down), GuardMode::fallback, hub(), std::move(a));
    } catch (const Refused& e) {
      return std::string(e.what());
    }
    return std::string("built");
  };
  EXPECT_NE(refusal(adopted(3)).find("3 of its 4 experts' gate adopted"), std::string::npos);
  std::map<std::string, PackedLinear> stray = adopted(experts);
  stray.emplace("gate/4", PackedLinear::int8(matrix_view(gate, inner, hidden), 32, DType::f16));
  EXPECT_NE(refusal(std::move(stray)).find("adopted 'gate/4' names no operand of its 4 experts"),
            std::string::npos);
  std::map<std::string, PackedLinear> other = adopted(experts);
  other.erase("down/2");
  other.emplace("down/2", PackedLinear::int4(matrix_view(down, hidden, inner), 32, true));
  EXPECT_NE(refusal(std::move(other)).find("down/2: adopted as int4"), std::string::npos);
}

}  // namespace
}  // namespace frt

namespace frt {
namespace {

// Note [A bank in one region]: a bank's packs lie in one region, expert after expert (gate, up,
// down), each holding the bytes its own pack would.
TEST(ExpertBank, PacksLieInOneRegionExpertAfterExpertWithTheirOwnBytes) {
  const int64_t experts = 3, inner = 64, hidden = 128;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  std::vector<std::vector<float>> weights;
  std::vector<PackedLinear> gate, up, down, alone;
  const auto packed = [&](int64_t n, int64_t k) {
    std::vector<float>& w = weights.emplace_back(n * k);
    for (float& v : w) v = dist(rng);
    const TensorView view = TensorView::matrix(w.data(), DType::f32, n, k, k);
    alone.push_back(PackedLinear::int8(view, 64, DType::f16));
    return PackedLinear::int8(view, 64, DType::f16);
  };
  for (int64_t e = 0; e < experts; ++e) {
    gate.push_back(packed(inner, hidden));
    up.push_back(packed(inner, hidden));
    down.push_back(packed(hidden, inner));
  }
  const ExpertBank bank(std::move(gate), std::move(up), std::move(down), Activation::silu);
  const char* last = nullptr;
  for (int64_t e = 0; e < experts; ++e) {
    const frt_packed_weight* views[] = {bank.gate_views() + e, bank.up_views() + e,
                                        bank.down_views() + e};
    for (int i = 0; i < 3; ++i) {
      const frt_packed_weight& v = *views[i];
      const frt_packed_weight& own = alone[static_cast<size_t>(e * 3 + i)].view();
      const auto* q = static_cast<const char*>(v.qdata);
      EXPECT_GT(q, last) << "expert " << e << " operand " << i;
      if (last != nullptr) {
        EXPECT_LT(q - last, 1 << 16) << "expert " << e << " operand " << i;
      }
      last = q;
      const int64_t panels = (v.n + FRT_PANEL - 1) / FRT_PANEL;
      EXPECT_EQ(std::memcmp(v.qdata, own.qdata, static_cast<size_t>(panels * v.k * FRT_PANEL)), 0);
      EXPECT_EQ(std::memcmp(v.scales, own.scales,
                            static_cast<size_t>(panels * (v.k / 64) * FRT_PANEL * 2)),
                0);
    }
  }
}

WeightForm host_form() {
  WeightForm f;
  f.name = "host";
  f.host = true;
  f.tag = "f32";
  return f;
}

TensorView view4(std::vector<float>& v, std::array<int64_t, 4> shape,
                 std::array<int64_t, 4> strides) {
  TensorView t;
  t.data = v.data();
  t.rank = 4;
  t.shape = shape;
  t.strides = strides;
  return t;
}

TEST(BuildSeat, ANormSeatComputesTheMeasuredFormWithTheModulesWeightAndEpsilon) {
  const int64_t rows = 3, width = 40;
  std::vector<float> w = ramp(width, 0.5f, 0.3f), x = ramp(rows * width, 2.0f, 1.1f);
  for (NormForm form : {NormForm::rms, NormForm::rms_one_plus}) {
    SeatPlan plan = seat_plan(OpKind::rmsnorm, "flashrt/decode", host_form());
    plan.seam.structure = "norm_fused";
    plan.seam.dims = {{"width", width}};
    plan.seam.norm.form = form;
    plan.seam.norm.eps = 1e-5;
    plan.band_max = kUnboundedRows;
    std::unique_ptr<Seat> seat =
        build_seat(plan, {{"weight", vector_view(w)}}, GuardMode::fallback, hub());
    ASSERT_NE(dynamic_cast<NormSeat*>(seat.get()), nullptr);
    EXPECT_EQ(seat->form().width, width);
    EXPECT_EQ(seat->form().out, width);
    std::vector<float> y(rows * width, std::nanf(""));
    ASSERT_EQ(seat->run(matrix_view(x, rows, width), matrix_view(y, rows, width), false),
              Verdict::ran)
        << seat->ledger().last_reason;
    for (int64_t r = 0; r < rows; ++r) {
      double ss = 0;
      for (int64_t i = 0; i < width; ++i) ss += double(x[r * width + i]) * x[r * width + i];
      const double inv = 1.0 / std::sqrt(ss / width + 1e-5);
      for (int64_t i = 0; i < width; ++i) {
        const double scale = form == NormForm::rms ? w[i] : 1.0 + w[i];
        EXPECT_NEAR(y[r * width + i], x[r * width + i] * inv * scale, 1e-5) << r << "," << i;
      }
    }
    // A call of another width, or another dtype, is a counted miss naming it.
    std::vector<float> wide(rows * (width + 1));
    EXPECT_EQ(
        seat->run(matrix_view(wide, rows, width + 1), matrix_view(wide, rows, width + 1), false),
        Verdict::fallback);
    EXPECT_NE(seat->ledger().last_reason.find("expected rows of 40"), std::string::npos)
        << seat->ledger().last_reason;
  }
  // A weight of another width, or a form the op does not compute, is refused at bind.
  SeatPlan plan = seat_plan(OpKind::rmsnorm, "flashrt/decode", host_form());
  plan.seam.dims = {{"width", width + 1}};
  plan.seam.norm.form = NormForm::rms;
  EXPECT_THROW(build_seat(plan, {{"weight", vector_view(w)}}, GuardMode::fallback, hub()), Refused);
  plan.seam.dims = {{"width", width}};
  plan.seam.norm.form = NormForm::layer;
  EXPECT_THROW(build_seat(plan, {{"weight", vector_view(w)}}, GuardMode::fallback, hub()), Refused);
}

// softmax(cap(q k^T * scale)) v in double for one row of [heads] queries against [kv][pos] keys.
std::vector<double> attention_reference(const std::vector<float>& q, const std::vector<float>& k,
                                        const std::vector<float>& v, int64_t heads, int64_t kv,
                                        int64_t pos, int64_t dim, double scale, double cap) {
  std::vector<double> out(heads * dim, 0.0);
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t g = h / (heads / kv);
    std::vector<double> s(pos);
    double mx = -1e300, sum = 0;
    for (int64_t t = 0; t < pos; ++t) {
      double d = 0;
      for (int64_t i = 0; i < dim; ++i) d += double(q[h * dim + i]) * k[(g * pos + t) * dim + i];
      d *= scale;
      if (cap > 0) d = cap * std::tanh(d / cap);
      s[t] = d;
      mx = std::max(mx, d);
    }
    for (double& e : s) sum += (e = std::exp(e - mx));
    for (int64_t t = 0; t < pos; ++t)
      for (int64_t i = 0; i < dim; ++i) out[h * dim + i] += s[t] / sum * v[(g * pos + t) * dim + i];
  }
  return out;
}

// A view of `data` with `shape` and contiguous strides, as a door hands the engine's tensors.
TensorView packed_view(void* data, DType dtype, std::vector<int64_t> shape) {
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= shape[i];
  }
  return t;
}

// bf16 by truncation, and back: the test's values are exact in bf16 either way.
uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<uint16_t>(u >> 16);
}
float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// A [batch, heads, tokens, dim] bf16 view of memory laid out [batch, tokens, heads, dim] (what a
// diffusers processor hands torch's function: its projections' rows, heads split).
TensorView tokens_major(std::vector<uint16_t>& v, int64_t b, int64_t heads, int64_t tokens,
                        int64_t dim) {
  TensorView t;
  t.data = v.data();
  t.dtype = DType::bf16;
  t.rank = 4;
  t.shape = {b, heads, tokens, dim};
  t.strides = {tokens * heads * dim, dim, heads * dim, 1};
  return t;
}

// `n` bf16 values of ramp(n, a, step).
std::vector<uint16_t> bf16_ramp(int64_t n, float a, float step) {
  std::vector<uint16_t> out(n);
  const std::vector<float> values = ramp(n, a, step);
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits(values[i]);
  return out;
}

// The seat an attention_sequence plan builds for bf16 heads.
std::unique_ptr<Seat> sequence_seat(int64_t heads, int64_t kv, int64_t dim) {
  SeatPlan plan = seat_plan(OpKind::sequence_attention, "flashrt/gemm", host_form());
  plan.seam.structure = "attention_sequence";
  plan.seam.dims = {{"heads", heads}, {"kv_heads", kv}, {"head_dim", dim}};
  plan.act_dtype = DType::bf16;
  plan.band_max = kUnboundedRows;
  return build_seat(plan, {}, GuardMode::fallback, hub());
}

TEST(BuildSeat, ASequenceAttentionSeatAttendsEveryKeyOfTheCallsWholeSequences) {
  const int64_t b = 2, heads = 4, kv = 2, dim = 32, q_len = 5, kv_len = 9;
  std::vector<uint16_t> q = bf16_ramp(b * q_len * heads * dim, 1.0f, 0.2f),
                        k = bf16_ramp(b * kv_len * kv * dim, 1.0f, 0.9f),
                        v = bf16_ramp(b * kv_len * kv * dim, 1.0f, 1.7f),
                        out(b * q_len * heads * dim, 0x7fc0);  // NaN until written
  std::unique_ptr<Seat> seat = sequence_seat(heads, kv, dim);
  auto* att = dynamic_cast<AttentionSeat*>(seat.get());
  ASSERT_NE(att, nullptr);
  EXPECT_EQ(seat->form().width, heads * dim);
  SequenceAttention c;
  c.q = tokens_major(q, b, heads, q_len, dim);
  c.k = tokens_major(k, b, kv, kv_len, dim);
  c.v = tokens_major(v, b, kv, kv_len, dim);
  c.out = tokens_major(out, b, heads, q_len, dim);
  c.scale = 0.25f;
  ASSERT_EQ(att->call_sequence(c, std::nullopt, false), Verdict::ran) << seat->ledger().last_reason;
  // Each sequence and query against the float64 reference over its own keys (the reference's
  // row layout: [heads][dim] queries, [kv][positions][dim] keys).
  double vmax = 0;
  for (uint16_t x : v) vmax = std::max(vmax, std::fabs(double(bf16_value(x))));
  for (int64_t s = 0; s < b; ++s)
    for (int64_t i = 0; i < q_len; ++i) {
      std::vector<float> qr(heads * dim), kr(kv * kv_len * dim), vr(kv * kv_len * dim);
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < dim; ++d)
          qr[h * dim + d] = bf16_value(q[((s * q_len + i) * heads + h) * dim + d]);
      for (int64_t g = 0; g < kv; ++g)
        for (int64_t t = 0; t < kv_len; ++t)
          for (int64_t d = 0; d < dim; ++d) {
            kr[(g * kv_len + t) * dim + d] = bf16_value(k[((s * kv_len + t) * kv + g) * dim + d]);
            vr[(g * kv_len + t) * dim + d] = bf16_value(v[((s * kv_len + t) * kv + g) * dim + d]);
          }
      const std::vector<double> want =
          attention_reference(qr, kr, vr, heads, kv, kv_len, dim, 0.25, 0);
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < dim; ++d) {
          const double got = bf16_value(out[((s * q_len + i) * heads + h) * dim + d]);
          const double w = want[h * dim + d];
          // The weights and the output rounded to bf16 (Note [Sequence attention]).
          EXPECT_NEAR(got, w, 4 * std::ldexp(vmax, -9) + 2 * std::ldexp(std::fabs(w), -9))
              << s << "," << i << "," << h << "," << d;
        }
    }
  EXPECT_EQ(seat->ledger().calls, 1);
  EXPECT_EQ(seat->ledger().fallbacks, 0);
  // Another head count than the module's calls showed, or f32 heads: counted misses, out untouched.
  const std::vector<uint16_t> written = out;
  SequenceAttention wrong = c;
  wrong.q.shape[1] = heads - 1;
  EXPECT_EQ(att->call_sequence(wrong, std::nullopt, false), Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("q bf16[2, 3, 5, 32]"), std::string::npos)
      << seat->ledger().last_reason;
  std::vector<float> q32(q.size());
  wrong = c;
  wrong.q.data = q32.data();
  wrong.q.dtype = DType::f32;
  EXPECT_EQ(att->call_sequence(wrong, std::nullopt, false), Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("f32"), std::string::npos)
      << seat->ledger().last_reason;
  EXPECT_EQ(att->call_sequence(c, std::nullopt, true), Verdict::fallback);  // a module in training
  EXPECT_EQ(out, written);
  EXPECT_EQ(seat->ledger().fallbacks, 3);
}

TEST(BuildSeat, ASequenceAttentionSeatReadsAKeyPaddingMaskAsEachSequencesRangeOfKeys) {
  const int64_t b = 2, heads = 4, kv = 2, dim = 32, q_len = 5, kv_len = 9;
  std::vector<uint16_t> q = bf16_ramp(b * q_len * heads * dim, 1.0f, 0.2f),
                        k = bf16_ramp(b * kv_len * kv * dim, 1.0f, 0.9f),
                        v = bf16_ramp(b * kv_len * kv * dim, 1.0f, 1.7f);
  std::unique_ptr<Seat> seat = sequence_seat(heads, kv, dim);
  auto* att = dynamic_cast<AttentionSeat*>(seat.get());
  ASSERT_NE(att, nullptr);
  const auto call = [&](std::vector<uint16_t>& out) {
    SequenceAttention c;
    c.q = tokens_major(q, b, heads, q_len, dim);
    c.k = tokens_major(k, b, kv, kv_len, dim);
    c.v = tokens_major(v, b, kv, kv_len, dim);
    c.out = tokens_major(out, b, heads, q_len, dim);
    c.scale = 0.25f;
    return c;
  };
  const auto mask_of = [](void* data, DType dtype, int64_t batch, int64_t h, int64_t queries,
                          int64_t keys) {
    TensorView m;
    m.data = data;
    m.dtype = dtype;
    m.rank = 4;
    m.shape = {batch, h, queries, keys};
    m.strides = {h * queries * keys, queries * keys, keys, 1};
    return m;
  };
  // Sequence 0 attends keys 0..6 (its padding last), sequence 1 keys 2..8.
  std::vector<uint8_t> visible(b * kv_len, 1);
  visible[7] = visible[8] = 0;
  visible[kv_len + 0] = visible[kv_len + 1] = 0;
  std::vector<uint16_t> by_bool(b * q_len * heads * dim, 0x7fc0);
  ASSERT_EQ(att->call_sequence(call(by_bool),
                               mask_of(visible.data(), DType::boolean, b, 1, 1, kv_len), false),
            Verdict::ran)
      << seat->ledger().last_reason;
  // Against each sequence alone over its range, unmasked (the op's own result, bit for bit).
  for (int64_t s = 0; s < b; ++s) {
    const int64_t first = s == 0 ? 0 : 2, last = s == 0 ? 7 : 9;
    std::vector<uint16_t> qs(q.begin() + s * q_len * heads * dim,
                             q.begin() + (s + 1) * q_len * heads * dim);
    std::vector<uint16_t> ks(k.begin() + (s * kv_len + first) * kv * dim,
                             k.begin() + (s * kv_len + last) * kv * dim);
    std::vector<uint16_t> vs(v.begin() + (s * kv_len + first) * kv * dim,
                             v.begin() + (s * kv_len + last) * kv * dim);
    std::vector<uint16_t> alone(q_len * heads * dim, 0x7fc0);
    SequenceAttention c;
    c.q = tokens_major(qs, 1, heads, q_len, dim);
    c.k = tokens_major(ks, 1, kv, last - first, dim);
    c.v = tokens_major(vs, 1, kv, last - first, dim);
    c.out = tokens_major(alone, 1, heads, q_len, dim);
    c.scale = 0.25f;
    ASSERT_EQ(att->call_sequence(c, std::nullopt, false), Verdict::ran);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), by_bool.begin() + s * q_len * heads * dim))
        << s;
  }
  // One mask row for both sequences (batch 1 broadcast): one call over keys 0..6, each
  // sequence's bits those of sequence 0's range alone.
  std::vector<uint8_t> shared_row(visible.begin(), visible.begin() + kv_len);
  std::vector<uint16_t> by_shared(by_bool.size(), 0x7fc0);
  ASSERT_EQ(att->call_sequence(call(by_shared),
                               mask_of(shared_row.data(), DType::boolean, 1, 1, 1, kv_len), false),
            Verdict::ran)
      << seat->ledger().last_reason;
  EXPECT_TRUE(
      std::equal(by_bool.begin(), by_bool.begin() + q_len * heads * dim, by_shared.begin()));
  // diffusers' padding bias, -10000 (1 - mask) in bf16 (-9984), per head: the same keys.
  std::vector<uint16_t> bias(b * heads * kv_len);
  for (int64_t s = 0; s < b; ++s)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < kv_len; ++t)
        bias[(s * heads + h) * kv_len + t] = bf16_bits(visible[s * kv_len + t] ? 0.0f : -9984.0f);
  std::vector<uint16_t> by_bias(by_bool.size(), 0x7fc0);
  const TensorView bias_mask = mask_of(bias.data(), DType::bf16, b, heads, 1, kv_len);
  ASSERT_EQ(att->call_sequence(call(by_bias), bias_mask, false), Verdict::ran)
      << seat->ledger().last_reason;
  EXPECT_EQ(by_bias, by_bool);
  // Scores that could outweigh the bias: a scale of 400 lets them differ by more than 9880.
  std::vector<uint16_t> untouched(by_bool.size(), 0x7fc0);
  SequenceAttention loud = call(untouched);
  loud.scale = 400.0f;
  EXPECT_EQ(att->call_sequence(loud, bias_mask, false), Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("hides a key only while scores differ by less than"),
            std::string::npos)
      << seat->ledger().last_reason;
  // A bias the op does not add, heads hiding different keys, a hole, a mask over queries: each a
  // counted miss naming it, nothing written.
  bias[3] = bf16_bits(-2.0f);
  EXPECT_EQ(att->call_sequence(call(untouched), bias_mask, false), Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("a bias other than 0"), std::string::npos)
      << seat->ledger().last_reason;
  bias[3] = bf16_bits(0.0f);
  bias[kv_len + 7] = bf16_bits(0.0f);  // head 1 of sequence 0 attends key 7, which head 0 hides
  EXPECT_EQ(att->call_sequence(call(untouched), bias_mask, false), Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("heads hide different keys"), std::string::npos)
      << seat->ledger().last_reason;
  visible[3] = 0;
  EXPECT_EQ(att->call_sequence(call(untouched),
                               mask_of(visible.data(), DType::boolean, b, 1, 1, kv_len), false),
            Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("not one range"), std::string::npos)
      << seat->ledger().last_reason;
  std::vector<uint8_t> per_query(b * q_len * kv_len, 1);
  EXPECT_EQ(
      att->call_sequence(call(untouched),
                         mask_of(per_query.data(), DType::boolean, b, 1, q_len, kv_len), false),
      Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("the same keys for every query"), std::string::npos)
      << seat->ledger().last_reason;
  EXPECT_TRUE(
      std::all_of(untouched.begin(), untouched.end(), [](uint16_t x) { return x == 0x7fc0; }));
}

TEST(BuildSeat, APagedAttentionSeatReadsTheEnginesPoolThroughItsTable) {
  const int64_t heads = 4, kv = 2, dim = 32, slots = 12, width = 8;
  std::vector<float> q = ramp(2 * heads * dim, 1.0f, 0.2f), k = ramp(slots * kv * dim, 1.0f, 0.9f),
                     v = ramp(slots * kv * dim, 1.0f, 1.7f);
  // Two rows on table lines 2 and 0: 5 positions at slots 9, 3, 7, 0, 11 and 2 at slots 4, 5.
  std::vector<int32_t> table(3 * width, -1);
  const std::vector<int32_t> line0 = {4, 5}, line2 = {9, 3, 7, 0, 11};
  std::copy(line0.begin(), line0.end(), table.begin());
  std::copy(line2.begin(), line2.end(), table.begin() + 2 * width);
  std::vector<int64_t> rows = {2, 0}, lengths = {5, 2};
  SeatPlan plan = seat_plan(OpKind::paged_attention, "flashrt/decode", host_form());
  plan.seam.structure = "attention_paged";
  plan.seam.dims = {{"heads", heads}, {"kv_heads", kv}, {"head_dim", dim}};
  plan.band_max = 1;
  std::unique_ptr<Seat> seat = build_seat(plan, {}, GuardMode::fallback, hub());
  auto* att = dynamic_cast<AttentionSeat*>(seat.get());
  ASSERT_NE(att, nullptr);
  std::vector<float> out(2 * heads * dim, std::nanf(""));
  PagedAttentionCall c;
  c.q = packed_view(q.data(), DType::f32, {2, heads, dim});
  c.k_pool = packed_view(k.data(), DType::f32, {slots, kv, dim});
  c.v_pool = packed_view(v.data(), DType::f32, {slots, kv, dim});
  c.table = packed_view(table.data(), DType::i32, {3, width});
  c.rows = packed_view(rows.data(), DType::i64, {2});
  c.lengths = packed_view(lengths.data(), DType::i64, {2});
  c.out = packed_view(out.data(), DType::f32, {2, heads, dim});
  c.scale = 0.25f;
  ASSERT_EQ(att->call_paged(c, false), Verdict::ran) << seat->ledger().last_reason;
  // Each row against its slots gathered into [kv][positions][dim], the dense reference.
  for (int64_t r = 0; r < 2; ++r) {
    const std::vector<int32_t>& line = r == 0 ? line2 : line0;
    const int64_t pos = static_cast<int64_t>(line.size());
    std::vector<float> qr(q.begin() + r * heads * dim, q.begin() + (r + 1) * heads * dim), kr, vr;
    for (int64_t g = 0; g < kv; ++g)
      for (int32_t slot : line)
        for (int64_t i = 0; i < dim; ++i) {
          kr.push_back(k[(slot * kv + g) * dim + i]);
          vr.push_back(v[(slot * kv + g) * dim + i]);
        }
    const std::vector<double> want = attention_reference(qr, kr, vr, heads, kv, pos, dim, 0.25, 0);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(out[r * heads * dim + i], want[i], 1e-5) << r << "," << i;
  }
  const auto refused = [&](PagedAttentionCall bad, const std::string& why) {
    EXPECT_EQ(att->call_paged(bad, false), Verdict::fallback) << why;
    EXPECT_NE(seat->ledger().last_reason.find(why), std::string::npos)
        << seat->ledger().last_reason;
  };
  // The engine's table is read, never trusted: a slot past the pool, a line or a length past the
  // table are counted misses that name them, nothing read.
  table[2 * width + 3] = static_cast<int32_t>(slots);
  refused(c, "row 0, position 3: slot 12 outside the pool of 12");
  table[2 * width + 3] = 0;
  lengths[1] = width + 1;
  refused(c, "row 1: table line 0, length 9 outside table");
  lengths[1] = 2;
  rows[0] = 3;
  refused(c, "row 0: table line 3, length 5 outside table");
  rows[0] = 2;
  // Indices of another width, a pool of another dtype than the seat's, pools of two layouts.
  PagedAttentionCall wide = c;
  wide.table.dtype = DType::i64;
  refused(wide, "expected int32 lines");
  PagedAttentionCall half = c;
  half.k_pool.dtype = half.v_pool.dtype = DType::bf16;
  refused(half, "input dtype bf16, seated for f32");
  PagedAttentionCall skewed = c;
  skewed.v_pool.strides[0] = 2 * kv * dim;
  skewed.v_pool.shape[0] = slots / 2;
  refused(skewed, "differ in dtype or layout");
  EXPECT_EQ(att->call_paged(c, false), Verdict::ran) << seat->ledger().last_reason;
  // An engine's prefill batch, its backend's own whatever its length: a band dispatch.
  const Ledger before = seat->ledger();
  seat->count_band();
  EXPECT_EQ(seat->ledger().band_dispatches, before.band_dispatches + 1);
  EXPECT_EQ(seat->ledger().calls, before.calls + 1);
  EXPECT_EQ(seat->ledger().fallbacks, before.fallbacks);
}

TEST(BuildSeat, AnAttentionSeatReadsTheHostsCacheWhereItStands) {
  const int64_t heads = 4, kv = 2, dim = 32, pos = 7;
  std::vector<float> q = ramp(heads * dim, 1.0f, 0.2f), k = ramp(kv * pos * dim, 1.0f, 0.9f),
                     v = ramp(kv * pos * dim, 1.0f, 1.7f);
  SeatPlan plan = seat_plan(OpKind::attention, "flashrt/decode", host_form());
  plan.seam.structure = "attention_core";
  plan.seam.dims = {{"heads", heads}, {"kv_heads", kv}, {"head_dim", dim}};
  plan.band_max = 1;
  std::unique_ptr<Seat> seat = build_seat(plan, {}, GuardMode::fallback, hub());
  auto* att = dynamic_cast<AttentionSeat*>(seat.get());
  ASSERT_NE(att, nullptr);
  for (float cap : {0.0f, 2.0f}) {
    std::vector<float> out(heads * dim, std::nanf(""));
    AttentionCall c;
    c.q = view4(q, {1, heads, 1, dim}, {heads * dim, dim, heads * dim, 1});
    c.k = view4(k, {1, kv, pos, dim}, {kv * pos * dim, pos * dim, dim, 1});
    c.v = view4(v, {1, kv, pos, dim}, {kv * pos * dim, pos * dim, dim, 1});
    c.out = view4(out, {1, 1, heads, dim}, {heads * dim, heads * dim, dim, 1});
    c.scale = 0.25f;
    c.softcap = cap;
    ASSERT_EQ(att->call(c, false), Verdict::ran) << seat->ledger().last_reason;
    const std::vector<double> want = attention_reference(q, k, v, heads, kv, pos, dim, 0.25, cap);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5) << cap << "," << i;
  }
  // A mask attending one range per row: the op reads that range (Note [Mask as a range]).
  {
    std::vector<uint8_t> visible = {0, 0, 1, 1, 1, 1, 0};  // positions 2..5
    TensorView m;
    m.data = visible.data();
    m.dtype = DType::boolean;
    m.rank = 4;
    m.shape = {1, 1, 1, pos};
    m.strides = {pos, pos, pos, 1};
    std::vector<float> out(heads * dim, std::nanf(""));
    AttentionCall c;
    c.q = view4(q, {1, heads, 1, dim}, {heads * dim, dim, heads * dim, 1});
    c.k = view4(k, {1, kv, pos, dim}, {kv * pos * dim, pos * dim, dim, 1});
    c.v = view4(v, {1, kv, pos, dim}, {kv * pos * dim, pos * dim, dim, 1});
    c.out = view4(out, {1, 1, heads, dim}, {heads * dim, heads * dim, dim, 1});
    c.mask = m;
    c.scale = 0.25f;
    ASSERT_EQ(att->call(c, false), Verdict::ran) << seat->ledger().last_reason;
    // The reference over positions 2..5 alone: each kv head's rows 2..5.
    std::vector<float> k4, v4;
    for (int64_t g = 0; g < kv; ++g)
      for (int64_t t = 2; t < 6; ++t)
        for (int64_t i = 0; i < dim; ++i) {
          k4.push_back(k[(g * pos + t) * dim + i]);
          v4.push_back(v[(g * pos + t) * dim + i]);
        }
    const std::vector<double> want = attention_reference(q, k4, v4, heads, kv, 4, dim, 0.25, 0);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(out[i], want[i], 1e-5) << i;
    // A hole in the range, then every position hidden: counted misses naming the mask.
    visible = {1, 1, 0, 1, 1, 1, 1};
    EXPECT_EQ(att->call(c, false), Verdict::fallback);
    EXPECT_NE(seat->ledger().last_reason.find("not one range"), std::string::npos)
        << seat->ledger().last_reason;
    visible.assign(pos, 0);
    EXPECT_EQ(att->call(c, false), Verdict::fallback);
    EXPECT_NE(seat->ledger().last_reason.find("hides every position"), std::string::npos);
    // An additive f32 mask: -inf hides, 0 attends; a bias of other values is refused.
    std::vector<float> additive(pos, 0.0f);
    additive[0] = -std::numeric_limits<float>::infinity();
    additive[1] = std::numeric_limits<float>::lowest();
    m.data = additive.data();
    m.dtype = DType::f32;
    c.mask = m;
    EXPECT_EQ(att->call(c, false), Verdict::ran) << seat->ledger().last_reason;
    additive[3] = -0.5f;
    EXPECT_EQ(att->call(c, false), Verdict::fallback);
    EXPECT_NE(seat->ledger().last_reason.find("a bias"), std::string::npos);
  }
  const int64_t misses = seat->ledger().fallbacks;
  // Two query tokens, keys of another head size, a non-positive scale: each a counted miss.
  std::vector<float> out(2 * heads * dim);
  AttentionCall bad;
  bad.q = view4(q, {1, heads, 2, dim}, {heads * dim, dim, heads * dim, 1});
  bad.k = view4(k, {1, kv, pos, dim}, {kv * pos * dim, pos * dim, dim, 1});
  bad.v = bad.k;
  bad.out = view4(out, {1, 2, heads, dim}, {2 * heads * dim, heads * dim, dim, 1});
  bad.scale = 1;
  EXPECT_EQ(att->call(bad, false), Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("expected [-1, 4, 1, 32]"), std::string::npos)
      << seat->ledger().last_reason;
  bad.q = view4(q, {1, heads, 1, dim}, {heads * dim, dim, heads * dim, 1});
  bad.k = view4(k, {1, kv, pos, dim / 2}, {kv * pos * dim, pos * dim, dim / 2, 1});
  EXPECT_EQ(att->call(bad, false), Verdict::fallback);
  bad.k = bad.v;
  bad.out = view4(out, {1, 1, heads, dim}, {heads * dim, heads * dim, dim, 1});
  bad.scale = 0;
  EXPECT_EQ(att->call(bad, false), Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("expected a positive scale"), std::string::npos)
      << seat->ledger().last_reason;
  EXPECT_EQ(seat->ledger().fallbacks, misses + 3);
  EXPECT_EQ(seat->admit_rows(5), Verdict::band);  // a prompt's call is the host's
}

// x cos + rotate_half(x) sin in float64, rotate_half(x) = (-x[half:], x[:half]).
std::vector<double> rotary_reference(const float* x, const float* cos, const float* sin,
                                     int64_t dim) {
  std::vector<double> y(static_cast<size_t>(dim));
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < dim; ++i) {
    const double rot = i < half ? -static_cast<double>(x[i + half]) : x[i - half];
    y[i] = static_cast<double>(x[i]) * cos[i] + rot * sin[i];
  }
  return y;
}

TEST(BuildSeat, ARotarySeatRotatesHalvesWithTheCallsOwnTables) {
  const int64_t b = 2, heads = 4, kv = 2, tokens = 3, dim = 16, half = dim / 2;
  SeatPlan plan = seat_plan(OpKind::rotary, "flashrt/decode", host_form());
  plan.seam.structure = "rotary_embed";
  plan.seam.dims = {{"heads", heads}, {"kv_heads", kv}, {"head_dim", dim}};
  std::unique_ptr<Seat> seat = build_seat(plan, {}, GuardMode::fallback, hub());
  auto* rot = dynamic_cast<RotarySeat*>(seat.get());
  ASSERT_NE(rot, nullptr);
  // q as the host hands it: [b, tokens, heads, dim] memory seen as [b, heads, tokens, dim]; k
  // contiguous [b, kv, tokens, dim]; one table for the whole batch ([1, tokens, dim]).
  std::vector<float> q = ramp(b * tokens * heads * dim, 1.0f, 0.3f),
                     k = ramp(b * kv * tokens * dim, 1.0f, 1.3f), cos(tokens * dim),
                     sin(tokens * dim);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(t + 1) * std::pow(10.0f, -static_cast<float>(i) / 4);
      cos[t * dim + i] = cos[t * dim + i + half] = std::cos(angle);
      sin[t * dim + i] = sin[t * dim + i + half] = std::sin(angle);
    }
  std::vector<float> q_out(q.size(), std::nanf("")), k_out(k.size(), std::nanf(""));
  RotaryCall c;
  c.q = view4(q, {b, heads, tokens, dim}, {tokens * heads * dim, dim, heads * dim, 1});
  c.k = view4(k, {b, kv, tokens, dim}, {kv * tokens * dim, tokens * dim, dim, 1});
  const auto table = [&](std::vector<float>& v) {
    TensorView t;
    t.data = v.data();
    t.rank = 3;
    t.shape = {1, tokens, dim};
    t.strides = {tokens * dim, dim, 1};
    return t;
  };
  c.cos = table(cos);
  c.sin = table(sin);
  c.q_out = view4(q_out, {b, heads, tokens, dim}, {tokens * heads * dim, dim, heads * dim, 1});
  c.k_out = view4(k_out, {b, kv, tokens, dim}, {tokens * kv * dim, dim, kv * dim, 1});
  ASSERT_EQ(rot->call(c, false), Verdict::ran) << seat->ledger().last_reason;
  for (int64_t r = 0; r < b; ++r)
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const size_t at = static_cast<size_t>(((r * tokens + t) * heads + h) * dim);
        const std::vector<double> want =
            rotary_reference(&q[at], &cos[t * dim], &sin[t * dim], dim);
        for (int64_t i = 0; i < dim; ++i) EXPECT_NEAR(q_out[at + i], want[i], 1e-6) << h << i;
      }
      for (int64_t h = 0; h < kv; ++h) {
        const std::vector<double> want =
            rotary_reference(&k[static_cast<size_t>(((r * kv + h) * tokens + t) * dim)],
                             &cos[t * dim], &sin[t * dim], dim);
        const size_t at = static_cast<size_t>(((r * tokens + t) * kv + h) * dim);
        for (int64_t i = 0; i < dim; ++i) EXPECT_NEAR(k_out[at + i], want[i], 1e-6) << h << i;
      }
    }
  // A table whose halves differ (not the rotate-half one), a table narrower than the head (a
  // partial rotary), heads not head_dim apart in the output: counted misses, nothing written.
  const std::vector<float> before = q_out;
  sin[3 * 1 + half] += 0.5f;
  EXPECT_EQ(rot->call(c, false), Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("halves differ"), std::string::npos)
      << seat->ledger().last_reason;
  sin[3 * 1 + half] -= 0.5f;
  RotaryCall narrow = c;
  narrow.cos.shape = {1, tokens, half};
  EXPECT_EQ(rot->call(narrow, false), Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("cos"), std::string::npos);
  RotaryCall spread = c;
  spread.q_out =
      view4(q_out, {b, heads, tokens, dim}, {heads * tokens * dim, tokens * dim, dim, 1});
  EXPECT_EQ(rot->call(spread, false), Verdict::fallback);
  EXPECT_NE(seat->ledger().last_reason.find("not head_dim apart"), std::string::npos);
  RotaryCall other_heads = c;
  other_heads.k = view4(k, {b, heads, tokens, dim}, {kv * tokens * dim, tokens * dim, dim, 1});
  EXPECT_EQ(rot->call(other_heads, false), Verdict::fallback);
  EXPECT_EQ(seat->ledger().fallbacks, 4);
  for (size_t i = 0; i < q_out.size(); ++i) ASSERT_EQ(std::memcmp(&q_out[i], &before[i], 4), 0);
}

TEST(BuildSeat, AnAttentionSeatReadsEachRowOfABatchAtItsOwnRange) {
  // Two sequences over one kv head (multi-query), the cache [batch, 1, max_len, dim] with room
  // beyond what is written (a static cache); row 0 attends positions 0..4, row 1 (left-padded)
  // positions 2..5.
  const int64_t heads = 2, kv = 1, dim = 16, max_len = 8, batch = 2;
  std::vector<float> q = ramp(batch * heads * dim, 1.0f, 0.4f),
                     k = ramp(batch * kv * max_len * dim, 1.0f, 0.8f),
                     v = ramp(batch * kv * max_len * dim, 1.0f, 1.3f);
  SeatPlan plan = seat_plan(OpKind::attention, "flashrt/decode", host_form());
  plan.seam.dims = {{"heads", heads}, {"kv_heads", kv}, {"head_dim", dim}};
  plan.band_max = 1;
  std::unique_ptr<Seat> seat = build_seat(plan, {}, GuardMode::fallback, hub());
  auto* att = dynamic_cast<AttentionSeat*>(seat.get());
  ASSERT_NE(att, nullptr);
  std::vector<uint8_t> visible = {1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1, 1, 0, 0};
  TensorView m;
  m.data = visible.data();
  m.dtype = DType::boolean;
  m.rank = 4;
  m.shape = {batch, 1, 1, max_len};
  m.strides = {max_len, max_len, max_len, 1};
  std::vector<float> out(batch * heads * dim, std::nanf(""));
  AttentionCall c;
  c.q = view4(q, {batch, heads, 1, dim}, {heads * dim, dim, heads * dim, 1});
  c.k = view4(k, {batch, kv, max_len, dim}, {kv * max_len * dim, max_len * dim, dim, 1});
  c.v = view4(v, {batch, kv, max_len, dim}, {kv * max_len * dim, max_len * dim, dim, 1});
  c.out = view4(out, {batch, 1, heads, dim}, {heads * dim, heads * dim, dim, 1});
  c.mask = m;
  c.scale = 0.3f;
  ASSERT_EQ(att->call(c, false), Verdict::ran) << seat->ledger().last_reason;
  for (int64_t r = 0; r < batch; ++r) {
    const int64_t first = r == 0 ? 0 : 2, last = r == 0 ? 5 : 6;
    std::vector<float> qr(q.begin() + r * heads * dim, q.begin() + (r + 1) * heads * dim), kr, vr;
    for (int64_t t = first; t < last; ++t)
      for (int64_t i = 0; i < dim; ++i) {
        kr.push_back(k[(r * max_len + t) * dim + i]);
        vr.push_back(v[(r * max_len + t) * dim + i]);
      }
    const std::vector<double> want =
        attention_reference(qr, kr, vr, heads, kv, last - first, dim, 0.3, 0);
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(out[r * heads * dim + i], want[i], 1e-5) << r << "," << i;
  }
}

}  // namespace
}  // namespace frt
