// The runtime contract in the core seat: band dispatch, form misses, the consecutive-fallback
// restore, raise mode, and a second thread.
#include <flashrt/hub.h>
#include <flashrt/seat.h>
#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace frt {
namespace {

const frt_kernel_table& linear_table() {
  static KernelHub h([] {
    KernelPathConfig c;
    c.bundled_root = FRT_TEST_KERNEL_ROOT;
    return c;
  }());
  return h.table("flashrt/linear");
}

std::unique_ptr<LinearSeat> make_seat(GuardMode mode = GuardMode::fallback) {
  std::vector<float> w(64 * 32, 0.01f);
  PackedLinear p = PackedLinear::int8(TensorView::matrix(w.data(), DType::f32, 64, 32, 32));
  SeatForm form{"site", "linear_proj", "linear_w8a16", DType::f32, 32, 64, 1, 16, p.form()};
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

}  // namespace
}  // namespace frt
