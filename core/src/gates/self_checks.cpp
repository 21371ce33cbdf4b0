// The self-checks that certify a built thing against the host before anyone relies on it:
// decode_loop's teacher-forced probe and get().bind()'s calibration samples. Their floors are
// catalog data (gates.yaml self_checks; a structure's parity band).
#include <flashrt/errors.h>
#include <flashrt/gates.h>

#include <cmath>
#include <sstream>
#include <tuple>
#include <utility>

#include "gates/metrics.h"

namespace frt {
namespace {

// The worst row cosine of two [rows, width] matrices and its row (a NaN row is the worst).
std::pair<double, int64_t> worst_row(const TensorView& a, const TensorView& b) {
  double worst = INFINITY;
  int64_t at = 0;
  for (int64_t r = 0; r < a.shape[0]; ++r) {
    const double c = detail::cosine(a, b, r * a.shape[1], (r + 1) * a.shape[1]);
    if (!std::isnan(worst) && !(c >= worst)) {
      worst = c;
      at = r;
    }
  }
  return {worst, at};
}

}  // namespace

SelfCheckVerdict judge_self_check(const SelfCheckSpec& spec, const TensorView& got,
                                  const TensorView& want, const TensorView& got_keys,
                                  const TensorView& want_keys, int64_t first_key_position) {
  if (got.rank != 2 || want.rank != 2 || got.shape != want.shape || got.shape[0] < 1)
    throw InvalidArgument("self-check: logits must be [positions, vocab] on both sides, got " +
                          got.describe() + " vs " + want.describe());
  const int64_t kept = got.shape[0] - first_key_position;
  if (first_key_position < 0 || kept < 1)
    throw InvalidArgument("self-check: keys from position " + std::to_string(first_key_position) +
                          " of a " + std::to_string(got.shape[0]) + "-token probe");
  if (got_keys.rank != 2 || want_keys.rank != 2 || got_keys.shape != want_keys.shape ||
      got_keys.shape[0] < 1 || got_keys.shape[0] % kept != 0)
    throw InvalidArgument(
        "self-check: keys must be [layers * positions kept, width] on both sides, got " +
        got_keys.describe() + " vs " + want_keys.describe());
  // Same shapes, contiguous (check_pair); distribution_metrics also counts argmax agreement.
  const DistributionMetrics d = distribution_metrics(got, want);
  detail::check_pair(got_keys, want_keys);
  SelfCheckVerdict v;
  v.positions = d.positions;
  v.top1_agreement = d.top1_agreement;
  std::tie(v.min_cosine, v.worst_position) = worst_row(got, want);
  int64_t key_row = 0;
  std::tie(v.min_keys_cosine, key_row) = worst_row(got_keys, want_keys);
  v.worst_key_layer = key_row / kept;
  v.worst_key_position = first_key_position + key_row % kept;
  std::ostringstream s;
  if (!(v.top1_agreement >= spec.top1_agreement)) {
    s.precision(2);
    s << std::fixed << "self-check against the host: teacher-forced agreement " << v.top1_agreement;
    s.unsetf(std::ios::floatfield);
    s.precision(6);
    s << " on a " << v.positions << "-token probe (< " << spec.top1_agreement
      << "); this stack computes something the loop does not";
  } else if (!(v.min_cosine >= spec.logits_cosine)) {
    s.precision(6);
    s << std::fixed << "self-check against the host: teacher-forced logits cosine " << v.min_cosine;
    s.unsetf(std::ios::floatfield);
    s << " at position " << v.worst_position << " of a " << v.positions << "-token probe (< "
      << spec.logits_cosine << "); this stack computes something the loop does not";
  } else if (!(v.min_keys_cosine >= spec.keys_cosine)) {
    s.precision(6);
    s << std::fixed << "self-check against the host: the keys cached at layer " << v.worst_key_layer
      << ", position " << v.worst_key_position << " have cosine " << v.min_keys_cosine;
    s.unsetf(std::ios::floatfield);
    s << " with the host's (< " << spec.keys_cosine << ") on a " << v.positions
      << "-token probe; the loop's rotary or key projection computes something the host's does "
         "not";
  } else {
    v.passed = true;
    s << "passed";
  }
  v.text = s.str();
  return v;
}

CertificationVerdict judge_certification(const std::vector<double>& cosines, double floor) {
  if (cosines.empty()) throw InvalidArgument("certification: no calibration sample was scored");
  CertificationVerdict v;
  v.samples = static_cast<int64_t>(cosines.size());
  for (double c : cosines)
    if (!std::isnan(v.worst_cosine) && !(c >= v.worst_cosine)) v.worst_cosine = c;  // NaN sticks
  v.passed = floor <= 0 || v.worst_cosine >= floor;  // NaN fails any floor
  std::ostringstream s;
  if (v.passed) {
    s << "passed";
  } else {
    s.precision(6);
    s << std::fixed << "worst cosine " << v.worst_cosine;
    s.unsetf(std::ios::floatfield);
    s << " < gate " << floor;
  }
  v.text = s.str();
  return v;
}

}  // namespace frt
