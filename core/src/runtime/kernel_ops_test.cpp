// The op drivers: one element-type mapping for plan time and call time, and a seated call's form
// checked once (Seat::run), a direct call's checked by the driver itself.
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/seat.h>
#include <gtest/gtest.h>

#include <string>
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

TEST(KernelOps, AbiDtypeGivesEachTypeItsOwnCode) {
  EXPECT_EQ(abi_dtype(DType::f32), FRT_F32);
  EXPECT_EQ(abi_dtype(DType::bf16), FRT_BF16);
  EXPECT_EQ(abi_dtype(DType::f16), FRT_F16);
  for (DType d : {DType::f64, DType::other}) {
    const int32_t code = abi_dtype(d);
    EXPECT_TRUE(code != FRT_F32 && code != FRT_BF16 && code != FRT_F16) << name_of(d);
  }
}

// The planner asks a package about a form with abi_dtype(act) (form_refusal); a call carries
// abi_dtype(x.dtype) (linear_refusal). The two must agree for every element type: the runtime
// once mapped f16 to bf16, so a call the plan refused would have been accepted and its halves read
// as bfloat16.
TEST(KernelOps, PlanTimeAndCallTimeAgreeOnEveryElementType) {
  const frt_kernel_table& table = hub().table("flashrt/linear");
  std::vector<float> w(32 * 64, 0.01f);
  const PackedLinear packed =
      PackedLinear::int8(TensorView::matrix(w.data(), DType::f32, 32, 64, 64));
  std::vector<double> x(2 * 64), y(2 * 32);  // room for the widest element
  for (DType d : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    frt_op_desc desc{};
    desc.op = static_cast<int32_t>(OpKind::linear);
    desc.wformat = static_cast<int32_t>(packed.format());
    desc.scale_dtype = FRT_F32;
    desc.n = packed.n();
    desc.k = packed.k();
    desc.x_dtype = desc.y_dtype = abi_dtype(d);
    desc.rows_max = 2;
    const std::string at_plan = form_refusal(table, desc);
    const std::string at_call =
        linear_refusal(table, packed, TensorView::matrix(x.data(), d, 2, 64, 64),
                       TensorView::matrix(y.data(), d, 2, 32, 32));
    EXPECT_EQ(at_plan.empty(), at_call.empty())
        << name_of(d) << ": plan '" << at_plan << "', call '" << at_call << "'";
    EXPECT_EQ(at_call.empty(), kernel_dtype(d)) << name_of(d) << ": " << at_call;
  }
  std::vector<uint16_t> halves(2 * 64);
  EXPECT_THROW(run_linear(table, process_parallel(), packed, nullptr,
                          TensorView::matrix(halves.data(), DType::f16, 2, 64, 64),
                          TensorView::matrix(halves.data(), DType::f16, 2, 32, 32)),
               Refused);
}

// A linear op that counts its per-call form checks and runs nothing.
int g_supports_calls = 0;
int32_t counting_supports(const void*, frt_error* err) {
  ++g_supports_calls;
  err->code = FRT_OK;
  err->message[0] = '\0';
  return FRT_REASON_OK;
}
int32_t no_run(const void*, int32_t, int32_t, int32_t, frt_error*) { return FRT_OK; }
int32_t any_form(const frt_op_desc*, frt_error*) { return FRT_REASON_OK; }
const frt_op kCountingOps[] = {
    {static_cast<int32_t>(OpKind::linear), 1, counting_supports, nullptr, no_run}};
const frt_kernel_table kCountingTable = {FRT_KERNEL_ABI_MAJOR,
                                         FRT_KERNEL_ABI_MINOR,
                                         static_cast<int32_t>(sizeof(frt_kernel_table)),
                                         "test/counting",
                                         "generic",
                                         any_form,
                                         1,
                                         kCountingOps};

TEST(KernelOps, ASeatedCallChecksItsFormOnceADirectCallChecksItsOwn) {
  std::vector<float> w(32 * 64, 0.01f), x(2 * 64, 1.0f), y(2 * 32);
  PackedLinear packed = PackedLinear::int8(TensorView::matrix(w.data(), DType::f32, 32, 64, 64));
  const TensorView xv = TensorView::matrix(x.data(), DType::f32, 2, 64, 64);
  const TensorView yv = TensorView::matrix(y.data(), DType::f32, 2, 32, 32);
  g_supports_calls = 0;
  run_linear(kCountingTable, process_parallel(), packed, nullptr, xv, yv);
  EXPECT_EQ(g_supports_calls, 1);

  SeatForm form{"site",
                "linear_proj",
                "linear_w8a16",
                OpKind::linear,
                DType::f32,
                64,
                32,
                1,
                16,
                packed.form(),
                {}};
  LinearSeat seat(form, kCountingTable, GuardMode::fallback, std::move(packed), {});
  g_supports_calls = 0;
  EXPECT_EQ(seat.run(xv, yv, false), Verdict::ran);
  EXPECT_EQ(g_supports_calls, 1);
}

}  // namespace
}  // namespace frt
