// Gates (DESIGN §7): parity by output kind, paired latency, caller floors. A band warns; only a
// caller's floors turn a number into a refusal.
#pragma once

#include <flashrt/tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace frt {

enum class ParityBand { pass, warn, low };
const char* band_name(ParityBand b);

// Values (an embedding, a hidden state): cosine over all elements (float64), and max |got-want|.
struct ValueMetrics {
  double cosine = 0, max_abs = 0;
  int64_t elements = 0;
};
// Distributions (logits [..., vocab]): top-1 agreement over positions, cosine of the last
// position, max |got-want|.
struct DistributionMetrics {
  double top1_agreement = 0, last_position_cosine = 0, max_abs = 0;
  int64_t positions = 0;
};

// Both tensors contiguous, same shape, f32 or bf16; throws InvalidArgument otherwise. NaN in
// either side gives cosine NaN and band low.
ValueMetrics value_metrics(const TensorView& got, const TensorView& want);
DistributionMetrics distribution_metrics(const TensorView& got, const TensorView& want);

ParityBand value_band(double cosine);       // pass >= 0.999, warn >= 0.995
ParityBand distribution_band(double top1);  // pass >= 0.95, warn >= 0.85

// Paired latency: per-round ratios host/arm (both arms timed alternately in one process); the
// median ratio must reach min_speedup for the unit to activate.
struct LatencyVerdict {
  double median_ratio = 0;
  std::vector<double> ratios;
  bool activates = false;
};
LatencyVerdict latency_verdict(const std::vector<double>& host_seconds,
                               const std::vector<double>& arm_seconds, double min_speedup);

// "" when every floor holds, else the first shortfall ("cosine 0.9981 < floor 0.999"). Metric
// names containing "abs" are ceilings, the others floors. A floor on a metric that was not
// measured throws InvalidArgument (a declaration nobody checks is a comment).
std::string floors_shortfall(const std::map<std::string, double>& metrics,
                             const std::map<std::string, double>& floors);

}  // namespace frt
