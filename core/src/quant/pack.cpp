#include <flashrt/errors.h>
#include <flashrt/pack.h>
#include <flashrt/thread_pool.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <sstream>
#include <utility>

#include "quant/calibrated.h"
#include "quant/f16.h"
#include "quant/int4_grid.h"
#include "quant/weight_memory.h"

namespace frt {
namespace {

using detail::f32_to_f16;
using detail::Int4Grid;
using detail::Int4Search;

constexpr int64_t kPanel = FRT_PANEL;

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
  pool.run(nth, [&](int ith, int team) {
    std::vector<float> row;
    try {
      for (int64_t r = ith; r < n; r += team) fn(r, row);
    } catch (...) {
      std::lock_guard lock(mu);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
}

int64_t scale_bytes(DType dt) { return dt == DType::f16 ? 2 : 4; }

// The stored scale-array element, read or written in its dtype.
float read_scale(const void* base, int64_t i, DType dt) {
  return dt == DType::f16 ? frt_f16_to_f32(static_cast<const uint16_t*>(base)[i])
                          : static_cast<const float*>(base)[i];
}
// Stores v and returns the value stored (what the kernels will compute with).
float write_scale(void* base, int64_t i, DType dt, float v) {
  if (dt != DType::f16) return static_cast<float*>(base)[i] = v;
  const uint16_t h = f32_to_f16(v);
  static_cast<uint16_t*>(base)[i] = h;
  return frt_f16_to_f32(h);
}

// int8 also takes groups of 16 (GGUF Q6_K's sub-blocks, adopted exactly); int4 does not.
void check_group(int group, int64_t k, bool int4, const std::string& what) {
  const char* bits = int4 ? "int4" : "int8";
  if (group != 32 && group != 64 && group != 128 && (int4 || group != 16))
    throw InvalidArgument(std::string("pack: ") + bits + " group " + std::to_string(group) +
                          (int4 ? " not in {32, 64, 128}" : " not in {16, 32, 64, 128}"));
  if (k % group != 0)
    throw InvalidArgument(std::string("pack: ") + bits + " width k=" + std::to_string(k) +
                          " is not a multiple of group " + std::to_string(group) + " (" + what +
                          ")");
}

// One panel's record of super-block sb (frt_kernel_abi.h, FRT_W_INT4_SUPER / FRT_W_INT8_SUPER;
// `bytes` the format's record size).
uint8_t* super_record(void* scales, int64_t panel, int64_t sb, int64_t k, int64_t bytes) {
  return static_cast<uint8_t*>(scales) + (panel * (k / FRT_SUPER_K) + sb) * bytes;
}
uint16_t* super_half(uint8_t* record, int64_t at, int64_t j) {
  return reinterpret_cast<uint16_t*>(record + at) + j;
}

void check_super_width(int64_t k, const std::string& what) {
  if (k % FRT_SUPER_K != 0)
    throw InvalidArgument("pack: super-block width k=" + std::to_string(k) +
                          " is not a multiple of " + std::to_string(FRT_SUPER_K) + " (" + what +
                          ")");
}

void check_scale_dtype(DType dt) {
  if (dt != DType::f32 && dt != DType::f16)
    throw InvalidArgument(std::string("pack: scales in ") + name_of(dt) + "; supported: f32, f16");
}

}  // namespace

void PackedLinear::Buffer::operator()(void* p) const {
  if (owned) free_weight_memory(p);
}

PackedLinear::PackedLinear(PackedLinear&& o) noexcept { *this = std::move(o); }

PackedLinear& PackedLinear::operator=(PackedLinear&& o) noexcept {
  qdata_ = std::move(o.qdata_);
  scales_ = std::move(o.scales_);
  mins_ = std::move(o.mins_);
  qbytes_ = std::exchange(o.qbytes_, 0);
  scale_count_ = std::exchange(o.scale_count_, 0);
  symmetric_ = o.symmetric_;
  view_ = std::exchange(o.view_, frt_packed_weight{});
  stats_ = o.stats_;
  return *this;
}

struct PackAccess {
  // Allocates the buffers of a form: qdata, scales and (int4) mins, all zeroed, and the view.
  static PackedLinear allocate(WeightFormat format, int group, int64_t n, int64_t k,
                               DType scale_dtype) {
    const int64_t panels = (n + kPanel - 1) / kPanel;
    PackedLinear p;
    const bool nibbles = format == WeightFormat::int4_group || format == WeightFormat::int4_super;
    // The super forms' scale buffers are their records, counted in halves (their scale dtype).
    const int64_t record = format == WeightFormat::int4_super   ? FRT_SUPER4_RECORD
                           : format == WeightFormat::int8_super ? FRT_SUPER8_RECORD
                                                                : 0;
    p.qbytes_ = panels * (nibbles ? k / 2 : k) * kPanel;
    p.scale_count_ = panels * (format == WeightFormat::int8_channel ? 1 : k / group) * kPanel;
    if (record > 0) p.scale_count_ = panels * (k / FRT_SUPER_K) * record / 2;
    p.qdata_.reset(alloc_weight_memory(p.qbytes_));
    p.scales_.reset(alloc_weight_memory(p.scale_count_ * scale_bytes(scale_dtype)));
    if (format == WeightFormat::int4_group)
      p.mins_.reset(alloc_weight_memory(p.scale_count_ * scale_bytes(scale_dtype)));
    p.view_ = {static_cast<int32_t>(format),
               group,
               scale_dtype == DType::f16 ? FRT_F16 : FRT_F32,
               0,
               n,
               k,
               p.qdata_.get(),
               p.scales_.get(),
               p.mins_.get()};
    return p;
  }
  static void finish_stats(PackedLinear& p, const TensorView& w) { p.stats_ = p.compare(w); }
  static void calibrate_int4(PackedLinear& p, const TensorView& w, int group, bool symmetric,
                             DType dt, const InputMoments& m);
};

PackStats PackedLinear::compare(const TensorView& w) const {
  const int64_t n = this->n(), k = this->k();
  if (w.rank != 2 || w.shape[0] != n || w.shape[1] != k)
    throw InvalidArgument("pack: compared against " + w.describe() + ", the pack is [" +
                          std::to_string(n) + ", " + std::to_string(k) + "]");
  // Row by row on the pool: each thread keeps its own partial sums.
  struct Partial {
    double max_abs = 0, max_ref = 0, sq = 0, ref_sq = 0;
  };
  std::vector<Partial> parts(static_cast<size_t>(n));
  for_each_row(n, [&](int64_t r, std::vector<float>& row) {
    dequantize_row(r, row);
    Partial& p = parts[r];
    for (int64_t i = 0; i < k; ++i) {
      const double want = load_element(w, r, i);
      const double err = std::fabs(want - row[i]);
      p.max_abs = std::max(p.max_abs, err);
      p.max_ref = std::max(p.max_ref, std::fabs(want));
      p.sq += err * err;
      p.ref_sq += want * want;
    }
  });
  PackStats stats;
  double sq = 0, ref_sq = 0;
  for (const Partial& p : parts) {
    stats.max_abs_err = std::max(stats.max_abs_err, p.max_abs);
    stats.max_abs_ref = std::max(stats.max_abs_ref, p.max_ref);
    sq += p.sq;
    ref_sq += p.ref_sq;
  }
  stats.rms_err = std::sqrt(sq / static_cast<double>(n * k));
  stats.rel_err = ref_sq > 0 ? std::sqrt(sq / ref_sq) : 0.0;
  return stats;
}

WeightFormat PackedLinear::format() const { return static_cast<WeightFormat>(view_.format); }

int64_t PackedLinear::nbytes() const {
  const bool two = view_.format == FRT_W_INT4_GROUP || view_.format == FRT_W_INT8_GEMM ||
                   ((view_.format == FRT_W_INT4_GEMM || view_.format == FRT_W_INT5_GEMM) &&
                    view_.mins != nullptr);
  return qbytes_ + scale_buffer_bytes() * (two ? 2 : 1);  // scales, and mins or column sums
}

namespace {

// A buffer's bytes in a region: rounded up to 64, plus the 64 zeroed bytes the GEMM layouts
// keep past their end.
int64_t region_piece(int64_t bytes) { return (bytes + 63) / 64 * 64 + 64; }

}  // namespace

int64_t PackedLinear::scale_buffer_bytes() const {
  return scale_count_ * (view_.scale_dtype == FRT_F16 ? 2 : 4);
}

int64_t PackedLinear::region_bytes() const {
  const int64_t scale = scale_buffer_bytes();
  return region_piece(qbytes_) + region_piece(scale) + (mins_ ? region_piece(scale) : 0);
}

void PackedLinear::relocate(void* region) {
  const int64_t scale = scale_buffer_bytes();
  auto* at = static_cast<char*>(region);
  const auto move = [&](std::unique_ptr<void, Buffer>& buffer, int64_t bytes) {
    if (!buffer) return;
    std::memcpy(at, buffer.get(), static_cast<size_t>(bytes));
    buffer = std::unique_ptr<void, Buffer>(at, Buffer{false});
    at += region_piece(bytes);
  };
  move(qdata_, qbytes_);
  move(scales_, scale);
  move(mins_, scale);
  view_.qdata = qdata_.get();
  view_.scales = scales_.get();
  view_.mins = mins_.get();
}

PackedLinear PackedLinear::copy() const {
  PackedLinear c;
  c.qbytes_ = qbytes_;
  c.scale_count_ = scale_count_;
  c.symmetric_ = symmetric_;
  c.view_ = view_;
  c.stats_ = stats_;
  // The same 64 zeroed bytes past each buffer that relocate() leaves (region_piece()).
  const auto duplicate = [](const std::unique_ptr<void, Buffer>& from, int64_t bytes) {
    std::unique_ptr<void, Buffer> to;
    if (from) {
      to.reset(alloc_weight_memory(region_piece(bytes)));
      std::memcpy(to.get(), from.get(), static_cast<size_t>(bytes));
    }
    return to;
  };
  c.qdata_ = duplicate(qdata_, qbytes_);
  c.scales_ = duplicate(scales_, scale_buffer_bytes());
  c.mins_ = duplicate(mins_, scale_buffer_bytes());
  c.view_.qdata = c.qdata_.get();
  c.view_.scales = c.scales_.get();
  c.view_.mins = c.mins_.get();
  return c;
}

std::string PackedLinear::form() const {
  const std::string scales = view_.scale_dtype == FRT_F16 ? " f16 scales" : "";
  if (view_.format == FRT_W_INT8_CHANNEL) return "int8 per-channel";
  if (view_.format == FRT_W_INT8_GEMM)
    return view_.group > 0
               ? "int8 per-channel, w8a8 gemm, activations per " + std::to_string(view_.group)
               : "int8 per-channel, w8a8 gemm";
  if (view_.format == FRT_W_INT8_GROUP) return "int8 g" + std::to_string(view_.group) + scales;
  if (view_.format == FRT_W_INT4_SUPER) return kInt4SuperForm;
  if (view_.format == FRT_W_INT8_SUPER) return kInt8SuperForm;
  if (view_.format == FRT_W_INT4_SUPER_GEMM) return kInt4SuperGemmForm;
  if (view_.format == FRT_W_INT6_SUPER_GEMM) return kInt6SuperGemmForm;
  if (view_.format == FRT_W_INT5_SUPER_GEMM) return kInt5SuperGemmForm;
  if (view_.format == FRT_W_INT5_GEMM)
    return std::string("int5 g32") + (symmetric_ ? " symmetric" : " asymmetric") + scales +
           ", activations int8 per 32";
  // A calibrated pack (Note [Calibrated rounding]) holds the same layout, other values.
  const std::string cal = stats_.calibration_rows > 0 ? ", calibrated" : "";
  if (view_.format == FRT_W_INT4_GEMM)
    return "int4 g" + std::to_string(view_.group) + (symmetric_ ? " symmetric" : " asymmetric") +
           scales + cal + ", w4a8 gemm, activations per " + std::to_string(view_.group);
  return "int4 g" + std::to_string(view_.group) + (symmetric_ ? " symmetric" : " asymmetric") +
         scales + cal;
}

PackedLinear PackedLinear::int8(const TensorView& w, int group, DType scale_dtype) {
  check_weight(w);
  check_scale_dtype(scale_dtype);
  const int64_t n = w.shape[0], k = w.shape[1];
  if (group != 0) check_group(group, k, false, w.describe());
  if (group == 0 && scale_dtype != DType::f32)
    throw InvalidArgument("pack: int8 per-channel scales are f32");
  const WeightFormat format = group == 0 ? WeightFormat::int8_channel : WeightFormat::int8_group;
  PackedLinear p = PackAccess::allocate(format, group, n, k, scale_dtype);
  const int64_t span = group == 0 ? k : group, groups = k / span;
  auto* q = static_cast<int8_t*>(p.qdata_.get());
  for_each_row(n, [&](int64_t r, std::vector<float>& row) {
    load_row(w, r, row);
    const int64_t panel = r / kPanel, j = r % kPanel;
    int8_t* qp = q + panel * k * kPanel;
    for (int64_t g = 0; g < groups; ++g) {
      float amax = 0;
      for (int64_t i = g * span; i < (g + 1) * span; ++i) amax = std::max(amax, std::fabs(row[i]));
      const int64_t at = group == 0 ? r : (panel * groups + g) * kPanel + j;
      const float scale = write_scale(p.scales_.get(), at, scale_dtype, amax / 127.0f);
      if (!std::isfinite(scale))
        throw InvalidArgument("pack: int8 group " + std::to_string(g) + " of row " +
                              std::to_string(r) + " needs a scale past f16's range in " +
                              w.describe());
      const float inv = scale > 0 ? 1.0f / scale : 0.0f;
      for (int64_t i = g * span; i < (g + 1) * span; ++i)
        qp[i * kPanel + j] =
            static_cast<int8_t>(std::clamp(std::nearbyint(row[i] * inv), -127.0f, 127.0f));
    }
  });
  PackAccess::finish_stats(p, w);
  return p;
}

namespace {

// Writes group g of channel r (its grid and `group` levels) into an int4 pack's buffers.
void write_int4_group(void* qdata, void* scales, void* mins, DType dt, int64_t k, int group,
                      int64_t r, int64_t g, Int4Grid grid, const uint8_t* levels) {
  const int64_t panel = r / kPanel, j = r % kPanel, groups = k / group;
  uint8_t* qp = static_cast<uint8_t*>(qdata) + panel * (k / 2) * kPanel;
  const int64_t at = (panel * groups + g) * kPanel + j;
  write_scale(scales, at, dt, grid.scale);
  write_scale(mins, at, dt, grid.min);
  for (int i = 0; i < group; ++i) {
    const int64_t kk = g * group + i;
    qp[(kk / 2) * kPanel + j] |= static_cast<uint8_t>(levels[i] << ((kk % 2) * 4));
  }
}

[[noreturn]] void no_int4_grid(int64_t g, int64_t r, const TensorView& w) {
  throw InvalidArgument("pack: int4 group " + std::to_string(g) + " of row " + std::to_string(r) +
                        " needs a scale past f16's range in " + w.describe());
}

}  // namespace

PackedLinear PackedLinear::int4(const TensorView& w, int group, bool symmetric, DType scale_dtype,
                                const InputMoments* moments) {
  check_weight(w);
  check_scale_dtype(scale_dtype);
  const int64_t n = w.shape[0], k = w.shape[1];
  check_group(group, k, true, w.describe());
  const int64_t groups = k / group;
  PackedLinear p = PackAccess::allocate(WeightFormat::int4_group, group, n, k, scale_dtype);
  p.symmetric_ = symmetric;
  if (moments != nullptr) {
    PackAccess::calibrate_int4(p, w, group, symmetric, scale_dtype, *moments);
    return p;
  }
  // Padding columns of the last panel keep scale and min 0, so they contribute nothing.
  for_each_row(n, [&](int64_t r, std::vector<float>& row) {
    load_row(w, r, row);
    Int4Search search(group, symmetric, scale_dtype);
    for (int64_t g = 0; g < groups; ++g) {
      const Int4Grid grid = search.run(row.data() + g * group);
      if (!search.found()) no_int4_grid(g, r, w);
      write_int4_group(p.qdata_.get(), p.scales_.get(), p.mins_.get(), scale_dtype, k, group, r, g,
                       grid, search.levels());
    }
  });
  PackAccess::finish_stats(p, w);
  return p;
}

// Note [Calibrated rounding] (calibrated.cpp): channels in tiles of 16, so each span's moments
// are streamed once a tile for the output-space errors the stats report (the rounding's and the
// plain pack's, against the weights' own), estimated on every eighth tile.
void PackAccess::calibrate_int4(PackedLinear& p, const TensorView& w, int group, bool symmetric,
                                DType dt, const InputMoments& m) {
  const int64_t n = w.shape[0], k = w.shape[1], span = m.span();
  if (m.width() != k || span % group != 0)
    throw InvalidArgument("pack: input moments of width " + std::to_string(m.width()) +
                          " in spans of " + std::to_string(span) + " for " + w.describe() +
                          " in groups of " + std::to_string(group));
  const std::shared_ptr<const std::vector<detail::SpanSolve>> solved = m.solves();
  const std::vector<detail::SpanSolve>& solves = *solved;
  constexpr int64_t kTile = 16, kReportEvery = 8;
  const int64_t tiles = (n + kTile - 1) / kTile;
  struct Sums {
    double chosen = 0, plain = 0, ref = 0;
  };
  std::vector<Sums> sums(static_cast<size_t>(tiles));
  std::exception_ptr error;
  std::mutex mu;
  Parallel& pool = process_parallel();
  pool.run(static_cast<int>(std::min<int64_t>(pool.size(), tiles)), [&](int ith, int team) {
    std::vector<float> row, v, cal, plain;
    std::vector<uint8_t> levels(static_cast<size_t>(span));
    std::vector<Int4Grid> grids(static_cast<size_t>(span / group));
    std::vector<double> q(kTile);
    try {
      for (int64_t t = ith; t < tiles; t += team) {
        const int64_t r0 = t * kTile, m_rows = std::min(kTile, n - r0);
        // The report's errors are estimated on every eighth tile: the quadratic forms cost
        // more than the rounding itself.
        const bool report = t % kReportEvery == 0;
        for (size_t b = 0; b < solves.size(); ++b) {
          const detail::SpanSolve& s = solves[b];
          v.assign(static_cast<size_t>(m_rows * span), 0.0f);
          cal.assign(v.size(), 0.0f);
          plain.assign(v.size(), 0.0f);
          for (int64_t i = 0; i < m_rows; ++i) {
            const int64_t r = r0 + i;
            load_row(w, r, row);
            const float* x = row.data() + static_cast<int64_t>(b) * span;
            std::copy(x, x + span, v.begin() + i * span);
            if (!detail::round_span(x, s, group, symmetric, dt, levels.data(), grids.data()))
              no_int4_grid(static_cast<int64_t>(b) * span / group, r, w);
            Int4Search search(group, symmetric, dt);
            for (int64_t g = 0; g < span / group; ++g) {
              const int64_t col = static_cast<int64_t>(b) * span + g * group;
              write_int4_group(p.qdata_.get(), p.scales_.get(), p.mins_.get(), dt, k, group, r,
                               col / group, grids[g], levels.data() + g * group);
              if (!report) continue;
              const Int4Grid pg = search.run(x + g * group);
              for (int j = 0; j < group; ++j) {
                const int64_t at = i * span + g * group + j;
                cal[at] =
                    x[g * group + j] - (levels[g * group + j] * grids[g].scale + grids[g].min);
                plain[at] = search.found()
                                ? x[g * group + j] - (search.levels()[j] * pg.scale + pg.min)
                                : 0.0f;
              }
            }
          }
          if (!report) continue;
          Sums& out = sums[static_cast<size_t>(t)];
          detail::quadratic_forms(cal.data(), m_rows, s, q.data());
          for (int64_t i = 0; i < m_rows; ++i) out.chosen += q[i];
          detail::quadratic_forms(plain.data(), m_rows, s, q.data());
          for (int64_t i = 0; i < m_rows; ++i) out.plain += q[i];
          detail::quadratic_forms(v.data(), m_rows, s, q.data());
          for (int64_t i = 0; i < m_rows; ++i) out.ref += q[i];
        }
      }
    } catch (...) {
      std::lock_guard lock(mu);
      if (!error) error = std::current_exception();
    }
  });
  if (error) std::rethrow_exception(error);
  finish_stats(p, w);
  Sums total;
  for (const Sums& t : sums) total.chosen += t.chosen, total.plain += t.plain, total.ref += t.ref;
  p.stats_.out_rel_err = total.ref > 0 ? std::sqrt(total.chosen / total.ref) : 0;
  p.stats_.out_rel_err_plain = total.ref > 0 ? std::sqrt(total.plain / total.ref) : 0;
  p.stats_.calibration_rows = m.rows();
}

// Per super-block: each group's min-max grid (offset o = -min(w, 0) >= 0, scale s = range / 15),
// then the eight scales and offsets as 6-bit codes of d = max s / 63 and dmin = max o / 63 held
// in f16, and the nibbles against the coded grid (the values the kernels compute with).
PackedLinear PackedLinear::int4_super(const TensorView& w) {
  check_weight(w);
  const int64_t n = w.shape[0], k = w.shape[1];
  check_super_width(k, w.describe());
  PackedLinear p = PackAccess::allocate(WeightFormat::int4_super, 32, n, k, DType::f16);
  p.symmetric_ = false;
  auto* q = static_cast<uint8_t*>(p.qdata_.get());
  constexpr int kGroups = FRT_SUPER4_GROUPS;
  for_each_row(n, [&](int64_t r, std::vector<float>& row) {
    load_row(w, r, row);
    const int64_t panel = r / kPanel, j = r % kPanel;
    uint8_t* qp = q + panel * (k / 2) * kPanel;
    for (int64_t sb = 0; sb < k / FRT_SUPER_K; ++sb) {
      const float* x = row.data() + sb * FRT_SUPER_K;
      float scale[kGroups], offset[kGroups], smax = 0, omax = 0;
      for (int g = 0; g < kGroups; ++g) {
        float lo = 0, hi = 0;
        for (int i = 0; i < 32; ++i)
          lo = std::min(lo, x[g * 32 + i]), hi = std::max(hi, x[g * 32 + i]);
        scale[g] = (hi - lo) / 15.0f;
        offset[g] = -lo;
        smax = std::max(smax, scale[g]);
        omax = std::max(omax, offset[g]);
      }
      uint8_t* rec = super_record(p.scales_.get(), panel, sb, k, FRT_SUPER4_RECORD);
      const uint16_t dh = f32_to_f16(smax / 63.0f), mh = f32_to_f16(omax / 63.0f);
      const float d = frt_f16_to_f32(dh), dmin = frt_f16_to_f32(mh);
      if (!std::isfinite(d) || !std::isfinite(dmin))
        throw InvalidArgument("pack: int4 super-block " + std::to_string(sb) + " of row " +
                              std::to_string(r) + " needs a scale past f16's range in " +
                              w.describe());
      *super_half(rec, 0, j) = dh;
      *super_half(rec, FRT_SUPER4_DMIN_AT, j) = mh;
      for (int g = 0; g < kGroups; ++g) {
        const auto code = [](float v, float unit) {
          return unit > 0 ? static_cast<uint8_t>(std::clamp(std::nearbyint(v / unit), 0.0f, 63.0f))
                          : uint8_t{0};
        };
        const uint8_t sc = code(scale[g], d), m = code(offset[g], dmin);
        rec[FRT_SUPER4_SC_AT + g * kPanel + j] = sc;
        rec[FRT_SUPER4_M_AT + g * kPanel + j] = m;
        const float s = d * static_cast<float>(sc), o = dmin * static_cast<float>(m);
        const float inv = s > 0 ? 1.0f / s : 0.0f;
        for (int i = 0; i < 32; ++i) {
          const int64_t kk = sb * FRT_SUPER_K + g * 32 + i;
          const float level = std::clamp(std::nearbyint((x[g * 32 + i] + o) * inv), 0.0f, 15.0f);
          qp[(kk / 2) * kPanel + j] |=
              static_cast<uint8_t>(static_cast<int>(level) << ((kk % 2) * 4));
        }
      }
    }
  });
  PackAccess::finish_stats(p, w);
  return p;
}

// Per group of 16: the symmetric grid of Q6_K's values -32..31 (scale max|w| / 31); the sixteen
// scales as int8 codes of d = max scale / 127 held in f16, and the values against the coded grid.
PackedLinear PackedLinear::int8_super(const TensorView& w) {
  check_weight(w);
  const int64_t n = w.shape[0], k = w.shape[1];
  check_super_width(k, w.describe());
  PackedLinear p = PackAccess::allocate(WeightFormat::int8_super, 16, n, k, DType::f16);
  auto* q = static_cast<int8_t*>(p.qdata_.get());
  constexpr int kGroups = FRT_SUPER8_GROUPS;
  for_each_row(n, [&](int64_t r, std::vector<float>& row) {
    load_row(w, r, row);
    const int64_t panel = r / kPanel, j = r % kPanel;
    int8_t* qp = q + panel * k * kPanel;
    for (int64_t sb = 0; sb < k / FRT_SUPER_K; ++sb) {
      const float* x = row.data() + sb * FRT_SUPER_K;
      float scale[kGroups], smax = 0;
      for (int g = 0; g < kGroups; ++g) {
        float amax = 0;
        for (int i = 0; i < 16; ++i) amax = std::max(amax, std::fabs(x[g * 16 + i]));
        scale[g] = amax / 31.0f;
        smax = std::max(smax, scale[g]);
      }
      uint8_t* rec = super_record(p.scales_.get(), panel, sb, k, FRT_SUPER8_RECORD);
      const uint16_t dh = f32_to_f16(smax / 127.0f);
      const float d = frt_f16_to_f32(dh);
      if (!std::isfinite(d))
        throw InvalidArgument("pack: int8 super-block " + std::to_string(sb) + " of row " +
                              std::to_string(r) + " needs a scale past f16's range in " +
                              w.describe());
      *super_half(rec, 0, j) = dh;
      for (int g = 0; g < kGroups; ++g) {
        const int sc =
            d > 0 ? static_cast<int>(std::clamp(std::nearbyint(scale[g] / d), 0.0f, 127.0f)) : 0;
        rec[FRT_SUPER8_SC_AT + g * kPanel + j] = static_cast<uint8_t>(static_cast<int8_t>(sc));
        const float s = d * static_cast<float>(sc), inv = s > 0 ? 1.0f / s : 0.0f;
        for (int i = 0; i < 16; ++i) {
          const int64_t kk = sb * FRT_SUPER_K + g * 16 + i;
          qp[kk * kPanel + j] =
              static_cast<int8_t>(std::clamp(std::nearbyint(x[g * 16 + i] * inv), -32.0f, 31.0f));
        }
      }
    }
  });
  PackAccess::finish_stats(p, w);
  return p;
}

namespace {

std::string shape_of(const QuantizedParts& in) {
  return "[" + std::to_string(in.n) + ", " + std::to_string(in.k) + "]";
}

// What a Q4_K or Q6_K checkpoint's parts must hold before anything is allocated for them.
void check_super_parts(const QuantizedParts& in) {
  if ((in.format == WeightFormat::int4_super || in.format == WeightFormat::int4_super_gemm ||
       in.format == WeightFormat::int5_super_gemm) &&
      (in.group != 32 || in.scale_dtype != DType::f16 || in.mins == nullptr ||
       in.super_scales == nullptr || in.super_mins == nullptr))
    throw InvalidArgument("adopt: " + std::string(name_of(in.format)) + " " + shape_of(in) +
                          " takes group 32, uint8 scale and min codes and f16 d and dmin");
  if ((in.format == WeightFormat::int8_super || in.format == WeightFormat::int6_super_gemm) &&
      (in.group != 16 || in.scale_dtype != DType::f16 || in.mins != nullptr ||
       in.super_scales == nullptr || in.super_mins != nullptr))
    throw InvalidArgument("adopt: " + std::string(name_of(in.format)) + " " + shape_of(in) +
                          " takes group 16, int8 scale codes and f16 d, no mins");
  check_super_width(in.k, "adopted " + std::string(name_of(in.format)) + " weight " + shape_of(in));
}

// A Q6_K checkpoint's parts (QuantizedParts, int8_super, checked) into the values and records.
void adopt_super8(const QuantizedParts& in, int8_t* q, void* scales) {
  const int64_t n = in.n, k = in.k, groups = k / 16, supers = k / FRT_SUPER_K;
  const auto* sc = static_cast<const int8_t*>(in.scales);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t panel = r / kPanel, j = r % kPanel;
    int8_t* qp = q + panel * k * kPanel;
    for (int64_t i = 0; i < k; ++i) qp[i * kPanel + j] = in.q[r * k + i];
    for (int64_t sb = 0; sb < supers; ++sb) {
      uint8_t* rec = super_record(scales, panel, sb, k, FRT_SUPER8_RECORD);
      const uint16_t d = in.super_scales[r * supers + sb];
      if (!std::isfinite(frt_f16_to_f32(d)))
        throw InvalidArgument("adopt: super scale of row " + std::to_string(r) + " super-block " +
                              std::to_string(sb) + " is not finite");
      *super_half(rec, 0, j) = d;
      for (int g = 0; g < FRT_SUPER8_GROUPS; ++g)
        rec[FRT_SUPER8_SC_AT + g * kPanel + j] =
            static_cast<uint8_t>(sc[r * groups + sb * FRT_SUPER8_GROUPS + g]);
    }
  }
}

// A Q4_K checkpoint's parts (QuantizedParts, int4_super, checked) into the super records.
void adopt_super(const QuantizedParts& in, uint8_t* q, void* scales) {
  const int64_t n = in.n, k = in.k, groups = k / 32, supers = k / FRT_SUPER_K;
  const auto* sc = static_cast<const uint8_t*>(in.scales);
  const auto* mn = static_cast<const uint8_t*>(in.mins);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t panel = r / kPanel, j = r % kPanel;
    uint8_t* qp = q + panel * (k / 2) * kPanel;
    for (int64_t i = 0; i < k; ++i) {
      const int v = in.q[r * k + i];
      if (v < 0 || v > 15)
        throw InvalidArgument("adopt: value " + std::to_string(v) + " at [" + std::to_string(r) +
                              ", " + std::to_string(i) + "] of int4_super " + shape_of(in) +
                              " is outside 0..15");
      qp[(i / 2) * kPanel + j] |= static_cast<uint8_t>(v << ((i % 2) * 4));
    }
    for (int64_t sb = 0; sb < supers; ++sb) {
      uint8_t* rec = super_record(scales, panel, sb, k, FRT_SUPER4_RECORD);
      const uint16_t d = in.super_scales[r * supers + sb], dmin = in.super_mins[r * supers + sb];
      if (!std::isfinite(frt_f16_to_f32(d)) || !std::isfinite(frt_f16_to_f32(dmin)))
        throw InvalidArgument("adopt: super scale of row " + std::to_string(r) + " super-block " +
                              std::to_string(sb) + " is not finite");
      *super_half(rec, 0, j) = d;
      *super_half(rec, FRT_SUPER4_DMIN_AT, j) = dmin;
      for (int g = 0; g < FRT_SUPER4_GROUPS; ++g) {
        const int64_t at = r * groups + sb * FRT_SUPER4_GROUPS + g;
        if (sc[at] > 63 || mn[at] > 63)
          throw InvalidArgument("adopt: a scale or min code of row " + std::to_string(r) +
                                " group " + std::to_string(at - r * groups) + " is past 63");
        rec[FRT_SUPER4_SC_AT + g * kPanel + j] = sc[at];
        rec[FRT_SUPER4_M_AT + g * kPanel + j] = mn[at];
      }
    }
  }
}

}  // namespace

namespace {

// GGUF Q5_0 / Q5_1 (int5_gemm: scales, and mins unless symmetric) and Q5_K (int5_super_gemm:
// int4_super's codes) parts: values 0..31 split into the low nibbles, adopted as the int4 form
// of the same scales, and the fifth bits, laid out together (PackedLinear::int5_layout).
PackedLinear adopt_int5(const QuantizedParts& in) {
  const bool super = in.format == WeightFormat::int5_super_gemm;
  if (super) {
    check_super_parts(in);
  } else if (in.group != 32 || in.scale_dtype != DType::f16 || in.k % 32 != 0) {
    throw InvalidArgument("adopt: int5_gemm " + shape_of(in) +
                          " takes group 32 dividing k and f16 scales (and mins)");
  }
  const int64_t n = in.n, k = in.k;
  std::vector<int8_t> low(static_cast<size_t>(n * k));
  std::vector<uint8_t> fifth(static_cast<size_t>(n * k));
  for (int64_t i = 0; i < n * k; ++i) {
    const int v = in.q[i];
    if (v < 0 || v > 31)
      throw InvalidArgument("adopt: value " + std::to_string(v) + " at [" + std::to_string(i / k) +
                            ", " + std::to_string(i % k) + "] is outside int5's 0..31");
    low[i] = static_cast<int8_t>(v & 15);
    fifth[i] = static_cast<uint8_t>(v >> 4);
  }
  QuantizedParts base = in;
  base.q = low.data();
  base.format = super ? WeightFormat::int4_super : WeightFormat::int4_group;
  // Q5_0 has no mins: W = (u - 16) * s. The int4 form of its nibbles takes mins, which the
  // symmetric layout drops again; the scales serve (finite, checked there).
  const bool symmetric = !super && in.mins == nullptr;
  if (symmetric) base.mins = in.scales;
  return PackedLinear::int5_layout(PackedLinear::from_quantized(base), fifth.data(), symmetric);
}

}  // namespace

PackedLinear PackedLinear::from_quantized(const QuantizedParts& in) {
  const int64_t n = in.n, k = in.k;
  if (n <= 0 || k <= 0 || in.q == nullptr || in.scales == nullptr)
    throw InvalidArgument("adopt: empty quantised weight [" + std::to_string(n) + ", " +
                          std::to_string(k) + "]");
  check_scale_dtype(in.scale_dtype);
  if (in.format == WeightFormat::int5_gemm || in.format == WeightFormat::int5_super_gemm)
    return adopt_int5(in);
  if (in.format == WeightFormat::int4_gemm || in.format == WeightFormat::int4_super_gemm ||
      in.format == WeightFormat::int6_super_gemm) {
    const bool super = in.format != WeightFormat::int4_gemm;
    if (super) check_super_parts(in);  // refused by its own name
    if (!super && (in.group != 32 || in.scale_dtype != DType::f16))
      throw InvalidArgument("adopt: int4_gemm " + shape_of(in) +
                            " takes group 32 and f16 scales and mins");
    QuantizedParts base = in;
    base.format = in.format == WeightFormat::int4_gemm         ? WeightFormat::int4_group
                  : in.format == WeightFormat::int4_super_gemm ? WeightFormat::int4_super
                                                               : WeightFormat::int8_super;
    return gemm_layout(from_quantized(base));
  }
  if (in.format == WeightFormat::int4_super) {
    check_super_parts(in);
    PackedLinear p = PackAccess::allocate(in.format, 32, n, k, DType::f16);
    adopt_super(in, static_cast<uint8_t*>(p.qdata_.get()), p.scales_.get());
    p.symmetric_ = false;
    return p;
  }
  if (in.format == WeightFormat::int8_super) {
    check_super_parts(in);
    PackedLinear p = PackAccess::allocate(in.format, 16, n, k, DType::f16);
    adopt_super8(in, static_cast<int8_t*>(p.qdata_.get()), p.scales_.get());
    return p;
  }
  if (in.format != WeightFormat::int8_channel && in.format != WeightFormat::int8_group &&
      in.format != WeightFormat::int4_group)
    throw InvalidArgument(std::string("adopt: a checkpoint's weights arrive as int8_channel, ") +
                          "int8_group, int4_group, int4_super, int8_super, int4_gemm, " +
                          "int4_super_gemm or int6_super_gemm, not " + name_of(in.format));
  const bool int4 = in.format == WeightFormat::int4_group;
  if (in.format == WeightFormat::int8_channel) {
    if (in.scale_dtype != DType::f32)
      throw InvalidArgument("adopt: int8 per-channel scales are f32");
  } else {
    check_group(in.group, k, int4, "adopted weight");
  }
  if (int4 && in.mins == nullptr) throw InvalidArgument("adopt: int4 weight without mins");
  const int group = in.format == WeightFormat::int8_channel ? 0 : in.group;
  PackedLinear p = PackAccess::allocate(in.format, group, n, k, in.scale_dtype);
  const int64_t groups = group == 0 ? 1 : k / group;
  const int64_t row_bytes = int4 ? k / 2 : k;
  auto* q = static_cast<uint8_t*>(p.qdata_.get());
  bool symmetric = true;
  for (int64_t r = 0; r < n; ++r) {
    const int64_t panel = r / kPanel, j = r % kPanel;
    uint8_t* qp = q + panel * row_bytes * kPanel;
    const int8_t* src = in.q + r * k;
    for (int64_t i = 0; i < k; ++i) {
      const int v = src[i];
      if (int4 ? (v < 0 || v > 15) : (v < -128))
        throw InvalidArgument("adopt: value " + std::to_string(v) + " at [" + std::to_string(r) +
                              ", " + std::to_string(i) + "] is outside the form's range");
      if (int4)
        qp[(i / 2) * kPanel + j] |= static_cast<uint8_t>(v << ((i % 2) * 4));
      else
        qp[i * kPanel + j] = static_cast<uint8_t>(static_cast<int8_t>(v));
    }
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t at = group == 0 ? r : (panel * groups + g) * kPanel + j;
      const float s = read_scale(in.scales, r * groups + g, in.scale_dtype);
      if (!std::isfinite(s))
        throw InvalidArgument("adopt: scale of row " + std::to_string(r) + " group " +
                              std::to_string(g) + " is " + std::to_string(s));
      write_scale(p.scales_.get(), at, in.scale_dtype, s);
      if (int4) {
        const float mn = read_scale(in.mins, r * groups + g, in.scale_dtype);
        if (!std::isfinite(mn))
          throw InvalidArgument("adopt: min of row " + std::to_string(r) + " group " +
                                std::to_string(g) + " is " + std::to_string(mn));
        write_scale(p.mins_.get(), at, in.scale_dtype, mn);
        if (mn != -8.0f * s) symmetric = false;
      }
    }
  }
  p.symmetric_ = symmetric;
  return p;
}

void PackedLinear::dequantize_row(int64_t r, std::vector<float>& out) const {
  const int64_t k = view_.k, panel = r / kPanel, j = r % kPanel;
  const DType dt = view_.scale_dtype == FRT_F16 ? DType::f16 : DType::f32;
  out.resize(static_cast<size_t>(k));
  const auto* nibbles = static_cast<const uint8_t*>(view_.qdata);
  // Input i's nibble of this channel in the int4 layouts: two inputs to a byte, or the GEMM's
  // eight inputs in four bytes, i and i + 4 sharing one.
  const auto nibble_at = [&](int64_t pn, int64_t i, int64_t c) {
    const uint8_t byte = nibbles[(pn * (k / 2) + i / 2) * kPanel + c];
    return (i % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
  };
  const auto gemm_nibble = [&](int64_t i) {
    const uint8_t byte = nibbles[((panel * (k / 8) + i / 8) * kPanel + j) * 4 + i % 4];
    return i % 8 < 4 ? (byte & 0x0f) : (byte >> 4);
  };
  // Input i's value in the int5 layouts: its nibble in the block's octs and its plane bit.
  const auto five_bits = [&](int64_t i) {
    const uint8_t* block = nibbles + (panel * (k / 32) + i / 32) * FRT_INT5_BLOCK;
    const int64_t t = (i % 32) / 8, l = i % 4;
    const bool second = i % 8 >= 4;
    const int low = (block[64 * t + 4 * j + l] >> (second ? 4 : 0)) & 15;
    const int top = (block[FRT_INT6_PLANES_AT + 4 * j + l] >> (t + (second ? 4 : 0))) & 1;
    return low | top << 4;
  };
  for (int64_t i = 0; i < k; ++i) {
    float v;
    if (view_.format == FRT_W_INT8_GEMM) {
      const int64_t at = ((panel * ((k + 3) / 4) + i / 4) * kPanel + j) * 4 + i % 4;
      v = static_cast<const int8_t*>(view_.qdata)[at] * static_cast<const float*>(view_.scales)[r];
    } else if (view_.format == FRT_W_INT4_GEMM) {
      const int nib = gemm_nibble(i);
      const int64_t at = (panel * (k / view_.group) + i / view_.group) * kPanel + j;
      const float s = read_scale(view_.scales, at, dt);
      v = view_.mins == nullptr ? static_cast<float>(nib - 8) * s
                                : static_cast<float>(nib) * s + read_scale(view_.mins, at, dt);
    } else if (view_.format == FRT_W_INT5_GEMM) {
      const int64_t at = (panel * (k / 32) + i / 32) * kPanel + j;
      const float s = read_scale(view_.scales, at, dt);
      v = view_.mins == nullptr
              ? static_cast<float>(five_bits(i) - 16) * s
              : static_cast<float>(five_bits(i)) * s + read_scale(view_.mins, at, dt);
    } else if (view_.format == FRT_W_INT4_SUPER || view_.format == FRT_W_INT4_SUPER_GEMM ||
               view_.format == FRT_W_INT5_SUPER_GEMM) {
      const int nib = view_.format == FRT_W_INT4_SUPER        ? nibble_at(panel, i, j)
                      : view_.format == FRT_W_INT4_SUPER_GEMM ? gemm_nibble(i)
                                                              : five_bits(i);
      uint8_t* rec = super_record(const_cast<void*>(view_.scales), panel, i / FRT_SUPER_K, k,
                                  FRT_SUPER4_RECORD);
      const int64_t g = (i % FRT_SUPER_K) / 32;
      const float s = frt_f16_to_f32(*super_half(rec, 0, j)) *
                      static_cast<float>(rec[FRT_SUPER4_SC_AT + g * kPanel + j]);
      const float o = frt_f16_to_f32(*super_half(rec, FRT_SUPER4_DMIN_AT, j)) *
                      static_cast<float>(rec[FRT_SUPER4_M_AT + g * kPanel + j]);
      v = static_cast<float>(nib) * s - o;  // product then difference, as GGUF's dequantiser
    } else if (view_.format == FRT_W_INT8_SUPER || view_.format == FRT_W_INT6_SUPER_GEMM) {
      int q;
      if (view_.format == FRT_W_INT8_SUPER) {
        q = static_cast<const int8_t*>(view_.qdata)[(panel * k + i) * kPanel + j];
      } else {  // frt_kernel_abi.h: the nibble and the plane's two bits of u = q + 32
        const uint8_t* block = nibbles + (panel * (k / 32) + i / 32) * FRT_INT6_BLOCK;
        const int64_t t = (i % 32) / 8, l = i % 4;
        const bool second = i % 8 >= 4;
        const int low = (block[64 * t + 4 * j + l] >> (second ? 4 : 0)) & 15;
        const int top = (block[FRT_INT6_PLANES_AT + (second ? 64 : 0) + 4 * j + l] >> (2 * t)) & 3;
        q = (low | top << 4) - 32;
      }
      uint8_t* rec = super_record(const_cast<void*>(view_.scales), panel, i / FRT_SUPER_K, k,
                                  FRT_SUPER8_RECORD);
      const int64_t g = (i % FRT_SUPER_K) / 16;
      const float s =
          frt_f16_to_f32(*super_half(rec, 0, j)) *
          static_cast<float>(static_cast<int8_t>(rec[FRT_SUPER8_SC_AT + g * kPanel + j]));
      v = static_cast<float>(q) * s;
    } else if (view_.format == FRT_W_INT8_CHANNEL) {
      v = static_cast<const int8_t*>(view_.qdata)[(panel * k + i) * kPanel + j] *
          static_cast<const float*>(view_.scales)[r];
    } else if (view_.format == FRT_W_INT8_GROUP) {
      const int64_t groups = k / view_.group, g = i / view_.group;
      v = static_cast<float>(
              static_cast<const int8_t*>(view_.qdata)[(panel * k + i) * kPanel + j]) *
          read_scale(view_.scales, (panel * groups + g) * kPanel + j, dt);
    } else {
      const int64_t groups = k / view_.group, g = i / view_.group;
      const int nib = nibble_at(panel, i, j);
      const int64_t at = (panel * groups + g) * kPanel + j;
      // Product then sum, two roundings: the d*q + m that GGUF's own dequantiser computes.
      const float prod = static_cast<float>(nib) * read_scale(view_.scales, at, dt);
      v = prod + read_scale(view_.mins, at, dt);
    }
    out[i] = v;
  }
}

std::vector<float> PackedLinear::dequantize() const {
  const int64_t n = view_.n, k = view_.k;
  std::vector<float> out(static_cast<size_t>(n * k)), row;
  for (int64_t r = 0; r < n; ++r) {
    dequantize_row(r, row);
    std::copy(row.begin(), row.end(), out.begin() + r * k);
  }
  return out;
}

}  // namespace frt
