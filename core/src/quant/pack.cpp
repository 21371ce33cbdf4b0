#include <flashrt/errors.h>
#include <flashrt/pack.h>
#include <flashrt/thread_pool.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <sstream>

namespace frt {
namespace {

constexpr int64_t kPanel = FRT_PANEL;

void* aligned_zeroed(int64_t bytes) {
  const size_t size = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 63) / 64 * 64);
  void* p = std::aligned_alloc(64, size);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, size);
  return p;
}

float load_element(const TensorView& w, int64_t row, int64_t col) {
  return w.element(row * w.strides[0] + col * w.strides[1]);
}

void check_weight(const TensorView& w) {
  if (w.rank != 2 || w.shape[0] <= 0 || w.shape[1] <= 0 || w.data == nullptr)
    throw InvalidArgument("pack: weight must be a non-empty 2-D [n, k] tensor, got " +
                          w.describe());
}

// Reads one output channel (a row of W) in fp32, refusing non-finite values: a NaN scale
// would silently poison every output of the channel.
void load_row(const TensorView& w, int64_t row, std::vector<float>& out) {
  const int64_t k = w.shape[1];
  out.resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) {
    out[i] = load_element(w, row, i);
    if (!std::isfinite(out[i])) {
      std::ostringstream s;
      s << "pack: weight element [" << row << ", " << i << "] is " << out[i] << " in "
        << w.describe();
      throw InvalidArgument(s.str());
    }
  }
}

// Runs fn(row, scratch) for every output channel on the process pool; rows are independent.
template <typename Fn>
void for_each_row(int64_t n, Fn fn) {
  Parallel& pool = process_parallel();
  const int nth = static_cast<int>(std::min<int64_t>(pool.size(), n));
  std::exception_ptr error;
  std::mutex mu;
  pool.run(nth, [&](int ith) {
    std::vector<float> row;
    try {
      for (int64_t r = ith; r < n; r += nth) fn(r, row);
    } catch (...) {
      std::lock_guard lock(mu);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

}  // namespace

void PackedLinear::Buffer::operator()(void* p) const { std::free(p); }

struct PackAccess {
  static PackedLinear make() { return PackedLinear(); }
  static void finish_stats(PackedLinear& p, const TensorView& w) {
    const std::vector<float> deq = p.dequantize();
    const int64_t n = p.n(), k = p.k();
    double max_abs = 0, sq = 0, ref_sq = 0;
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < k; ++i) {
        const double want = load_element(w, r, i);
        const double err = std::fabs(want - deq[r * k + i]);
        max_abs = std::max(max_abs, err);
        sq += err * err;
        ref_sq += want * want;
      }
    p.stats_.max_abs_err = max_abs;
    p.stats_.rms_err = std::sqrt(sq / static_cast<double>(n * k));
    p.stats_.rel_err = ref_sq > 0 ? std::sqrt(sq / ref_sq) : 0.0;
  }
};

WeightFormat PackedLinear::format() const { return static_cast<WeightFormat>(view_.format); }

int64_t PackedLinear::nbytes() const {
  return qbytes_ + scale_count_ * 4 * (view_.format == FRT_W_INT8_CHANNEL ? 1 : 2);
}

std::string PackedLinear::form() const {
  if (view_.format == FRT_W_INT8_CHANNEL) return "int8 per-channel";
  if (view_.format == FRT_W_INT8_GEMM) return "int8 per-channel, w8a8 gemm";
  return "int4 g" + std::to_string(view_.group) + (symmetric_ ? " symmetric" : " asymmetric");
}

PackedLinear PackedLinear::int8(const TensorView& w) {
  check_weight(w);
  const int64_t n = w.shape[0], k = w.shape[1], panels = (n + kPanel - 1) / kPanel;
  PackedLinear p = PackAccess::make();
  p.qbytes_ = panels * k * kPanel;
  p.scale_count_ = panels * kPanel;
  p.qdata_.reset(aligned_zeroed(p.qbytes_));
  p.scales_.reset(aligned_zeroed(p.scale_count_ * 4));
  auto* q = static_cast<int8_t*>(p.qdata_.get());
  auto* scales = static_cast<float*>(p.scales_.get());
  for_each_row(n, [&](int64_t r, std::vector<float>& row) {
    load_row(w, r, row);
    float amax = 0;
    for (float v : row) amax = std::max(amax, std::fabs(v));
    const float scale = amax / 127.0f;
    const float inv = scale > 0 ? 1.0f / scale : 0.0f;
    int8_t* panel = q + (r / kPanel) * k * kPanel;
    const int64_t j = r % kPanel;
    for (int64_t i = 0; i < k; ++i)
      panel[i * kPanel + j] =
          static_cast<int8_t>(std::clamp(std::nearbyint(row[i] * inv), -127.0f, 127.0f));
    scales[r] = scale;
  });
  p.view_ = {FRT_W_INT8_CHANNEL, 0, n, k, p.qdata_.get(), scales, nullptr};
  PackAccess::finish_stats(p, w);
  return p;
}

PackedLinear PackedLinear::int4(const TensorView& w, int group, bool symmetric) {
  check_weight(w);
  const int64_t n = w.shape[0], k = w.shape[1];
  if (group != 32 && group != 64 && group != 128)
    throw InvalidArgument("pack: int4 group " + std::to_string(group) + " not in {32, 64, 128}");
  if (k % group != 0)
    throw InvalidArgument("pack: int4 width k=" + std::to_string(k) +
                          " is not a multiple of group " + std::to_string(group) + " (" +
                          w.describe() + ")");
  const int64_t panels = (n + kPanel - 1) / kPanel, groups = k / group;
  PackedLinear p = PackAccess::make();
  p.symmetric_ = symmetric;
  p.qbytes_ = panels * (k / 2) * kPanel;
  p.scale_count_ = panels * groups * kPanel;
  p.qdata_.reset(aligned_zeroed(p.qbytes_));
  p.scales_.reset(aligned_zeroed(p.scale_count_ * 4));
  p.zeros_.reset(aligned_zeroed(p.scale_count_ * 4));
  auto* q = static_cast<uint8_t*>(p.qdata_.get());
  auto* scales = static_cast<float*>(p.scales_.get());
  auto* zeros = static_cast<float*>(p.zeros_.get());
  // Padding columns of the last panel keep scale 0, so they contribute nothing.
  for_each_row(n, [&](int64_t r, std::vector<float>& row) {
    load_row(w, r, row);
    const int64_t panel = r / kPanel, j = r % kPanel;
    uint8_t* qp = q + panel * (k / 2) * kPanel;
    for (int64_t g = 0; g < groups; ++g) {
      const float* v = row.data() + g * group;
      float lo = 0, hi = 0;  // the range always holds 0, so a constant group is exact
      for (int i = 0; i < group; ++i) lo = std::min(lo, v[i]), hi = std::max(hi, v[i]);
      float scale, zero;
      if (symmetric) {
        scale = std::max(-lo, hi) / 7.0f;
        zero = 8.0f;
      } else {
        scale = (hi - lo) / 15.0f;
        zero = scale > 0 ? std::clamp(std::nearbyint(-lo / scale), 0.0f, 15.0f) : 0.0f;
      }
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      for (int i = 0; i < group; ++i) {
        const float qv = std::clamp(std::nearbyint(v[i] * inv) + zero, 0.0f, 15.0f);
        const int64_t kk = g * group + i;
        uint8_t& byte = qp[(kk / 2) * kPanel + j];
        byte |= static_cast<uint8_t>(static_cast<int>(qv) << ((kk % 2) * 4));
      }
      scales[(panel * groups + g) * kPanel + j] = scale;
      zeros[(panel * groups + g) * kPanel + j] = zero;
    }
  });
  p.view_ = {FRT_W_INT4_GROUP, group, n, k, p.qdata_.get(), scales, zeros};
  PackAccess::finish_stats(p, w);
  return p;
}

std::vector<float> PackedLinear::dequantize() const {
  const int64_t n = view_.n, k = view_.k;
  std::vector<float> out(static_cast<size_t>(n * k));
  for (int64_t r = 0; r < n; ++r) {
    const int64_t panel = r / kPanel, j = r % kPanel;
    for (int64_t i = 0; i < k; ++i) {
      float v;
      if (view_.format == FRT_W_INT8_GEMM) {
        const int64_t at = ((panel * ((k + 3) / 4) + i / 4) * kPanel + j) * 4 + i % 4;
        v = static_cast<const int8_t*>(view_.qdata)[at] * view_.scales[r];
      } else if (view_.format == FRT_W_INT8_CHANNEL) {
        v = static_cast<const int8_t*>(view_.qdata)[(panel * k + i) * kPanel + j] * view_.scales[r];
      } else {
        const int64_t groups = k / view_.group, g = i / view_.group;
        const uint8_t byte =
            static_cast<const uint8_t*>(view_.qdata)[(panel * (k / 2) + i / 2) * kPanel + j];
        const int nib = (i % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
        const int64_t at = (panel * groups + g) * kPanel + j;
        v = (static_cast<float>(nib) - view_.zeros[at]) * view_.scales[at];
      }
      out[r * k + i] = v;
    }
  }
  return out;
}

}  // namespace frt
