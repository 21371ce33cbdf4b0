#include <flashrt/calibration.h>
#include <flashrt/errors.h>
#include <flashrt/thread_pool.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

namespace frt {

const char* name_of(Statistic s) {
  switch (s) {
    case Statistic::input_moments:
      return "input_moments";
  }
  return "?";
}

namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
// out[i][j] (row stride `stride`) += sum over the rows of x[r][a0 + i] * x[r][c0 + j], for an
// 8 x 16 tile, summed in fp32 registers over one batch.
void moment_tile(const float* x, int64_t rows, int64_t width, int64_t a0, int64_t c0, double* out,
                 int64_t stride) {
  // A generic 16-lane vector: one register on AVX-512, two or four below, for every clone.
  typedef float v16 __attribute__((vector_size(64)));
  v16 acc[8] = {};
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = x + r * width;
    v16 xc;
    std::memcpy(&xc, row + c0, sizeof xc);
    for (int i = 0; i < 8; ++i) acc[i] += row[a0 + i] * xc;
  }
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 16; ++j) out[i * stride + j] += acc[i][j];
}

}  // namespace

InputMoments::InputMoments(int64_t width, int64_t span) : width_(width), span_(span) {
  if (width <= 0 || span <= 0 || span % 16 != 0 || width % span != 0)
    throw InvalidArgument("calibration: span " + std::to_string(span) + " of width " +
                          std::to_string(width) + "; a span is a positive multiple of 16 " +
                          "dividing the width");
  sums_.assign(static_cast<size_t>(width * span), 0.0);
}

int64_t InputMoments::span_for(int64_t width, int group, int64_t cap) {
  if (group <= 0 || width <= 0 || width % group != 0)
    throw InvalidArgument("calibration: width " + std::to_string(width) +
                          " is not a multiple of the group " + std::to_string(group));
  if (width <= cap) return width;
  for (int64_t s = cap - cap % group; s > group; s -= group)
    if (width % s == 0) return s;
  return group;
}

void InputMoments::add(const TensorView& x) {
  if (x.rank != 2 || x.shape[1] != width_ || (x.shape[0] > 1 && x.strides[1] != 1) ||
      (x.dtype != DType::f32 && x.dtype != DType::bf16) || x.data == nullptr)
    throw InvalidArgument("calibration: rows " + x.describe() + "; expected f32 or bf16 [rows, " +
                          std::to_string(width_) + "] with unit column stride");
  const int64_t rows = x.shape[0], s = span_;
  // Read (and checked) before anything is added, so a bad batch leaves the sums as they were.
  std::vector<float> xs(static_cast<size_t>(rows * width_));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < width_; ++i) {
      const float v = x.element(r * x.strides[0] + i * x.strides[1]);
      if (!std::isfinite(v)) {
        std::ostringstream m;
        m << "calibration: element [" << r << ", " << i << "] is " << v << " in " << x.describe();
        throw InvalidArgument(m.str());
      }
      xs[r * width_ + i] = v;
    }
  // Tiles of 8 x 16 moments summed over the rows in registers (fp32 within one batch, then
  // into the fp64 sums), the upper triangle of each span only; tiles spread over the pool.
  const int64_t tiles_a = s / 8, spans = width_ / s;
  const int64_t tasks = spans * tiles_a;
  Parallel& pool = process_parallel();
  pool.run(static_cast<int>(std::min<int64_t>(pool.size(), tasks)), [&](int ith, int team) {
    for (int64_t t = ith; t < tasks; t += team) {
      const int64_t b = t / tiles_a, a0 = (t % tiles_a) * 8, base = b * s;
      double* out = sums_.data() + b * s * s;
      for (int64_t c0 = a0 - a0 % 16; c0 < s; c0 += 16)
        moment_tile(xs.data() + base, rows, width_, a0, c0, out + a0 * s + c0, s);
    }
  });
  rows_ += rows;
  std::lock_guard lock(mu_);
  solves_.reset();
}

std::vector<double> InputMoments::span_mean(int64_t b) const {
  if (b < 0 || b >= width_ / span_)
    throw InvalidArgument("calibration: span " + std::to_string(b) + " outside 0.." +
                          std::to_string(width_ / span_ - 1));
  const int64_t s = span_;
  const double* sums = sums_.data() + b * s * s;
  const double scale = rows_ > 0 ? 1.0 / static_cast<double>(rows_) : 0.0;
  std::vector<double> out(static_cast<size_t>(s * s));
  for (int64_t a = 0; a < s; ++a)
    for (int64_t c = a; c < s; ++c) out[a * s + c] = out[c * s + a] = sums[a * s + c] * scale;
  return out;
}

std::vector<double> InputMoments::mean_square() const {
  std::vector<double> out(static_cast<size_t>(width_));
  for (int64_t i = 0; i < width_; ++i) {
    const int64_t b = i / span_, a = i % span_;
    out[i] = sums_[(b * span_ + a) * span_ + a] / (rows_ > 0 ? static_cast<double>(rows_) : 1.0);
  }
  return out;
}

}  // namespace frt
