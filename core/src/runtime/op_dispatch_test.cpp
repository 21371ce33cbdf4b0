// Direct op calls pick their kernel package by what each package says it runs.
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/op_dispatch.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace frt {
namespace {

KernelPathConfig bundled() {
  KernelPathConfig c;
  c.bundled_root = FRT_TEST_KERNEL_ROOT;
  return c;
}

KernelHub& hub() {
  static KernelHub h(bundled());
  return h;
}

std::vector<float> weights(int64_t n, int64_t k) {
  std::vector<float> w(static_cast<size_t>(n * k));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * static_cast<float>(i % 17) - 0.08f;
  return w;
}

TEST(OpDispatch, EachWeightLayoutGoesToThePackageThatRunsIt) {
  std::vector<float> w = weights(64, 128);
  const TensorView view = TensorView::matrix(w.data(), DType::f32, 64, 128, 128);
  const PackedLinear channel = PackedLinear::int8(view),
                     group = PackedLinear::int4(view, 32, false);
  const PackedLinear gemm = PackedLinear::int8_gemm(view),
                     gemm4 = PackedLinear::int4_gemm(view, true);
  EXPECT_EQ(&linear_table(hub(), channel, false), &hub().table("flashrt/linear"));
  EXPECT_EQ(&linear_table(hub(), group, true), &hub().table("flashrt/linear"));
  EXPECT_EQ(&linear_table(hub(), gemm, false), &hub().table("flashrt/gemm"));
  EXPECT_EQ(&linear_table(hub(), gemm4, true), &hub().table("flashrt/gemm"));
  // Asked again: the cached answer.
  EXPECT_EQ(&linear_table(hub(), gemm, false), &hub().table("flashrt/gemm"));

  std::vector<float> d = weights(128, 64);
  const PackedLinear up = PackedLinear::int8(view), gate = PackedLinear::int8(view),
                     down =
                         PackedLinear::int8(TensorView::matrix(d.data(), DType::f32, 128, 64, 64));
  FfnOperands f;
  f.gate = &gate;
  f.up = &up;
  f.down = &down;
  EXPECT_EQ(&ffn_table(hub(), f), &hub().table("flashrt/ffn"));
}

TEST(OpDispatch, NoPackageOnThePathIsAClearError) {
  KernelPathConfig c;
  c.bundled_root = "/nonexistent/flashrt-kernels";
  KernelHub empty(c);
  std::vector<float> w = weights(16, 32);
  const PackedLinear p = PackedLinear::int8(TensorView::matrix(w.data(), DType::f32, 16, 32, 32));
  try {
    linear_table(empty, p, false);
    FAIL() << "no package should run it";
  } catch (const KernelUnavailable& e) {
    EXPECT_NE(std::string(e.what()).find("no kernel package on the path runs linear over int8 "
                                         "per-channel (no package is on the path)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace frt
