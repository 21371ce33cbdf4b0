#include <flashrt/errors.h>
#include <flashrt/gates.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "gates/metrics.h"

namespace frt {
namespace {

int64_t elements_of(const TensorView& t) {
  int64_t n = 1;
  for (int i = 0; i < t.rank; ++i) n *= t.shape[i];
  return n;
}

double at(const TensorView& t, int64_t i) { return t.element(i); }

double max_abs(const TensorView& a, const TensorView& b, int64_t n) {
  double m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(at(a, i) - at(b, i));
    if (std::isnan(d)) return NAN;
    m = std::max(m, d);
  }
  return m;
}

}  // namespace

namespace detail {

void check_pair(const TensorView& got, const TensorView& want) {
  if (got.rank != want.rank || got.shape != want.shape)
    throw InvalidArgument("gate: shapes differ: " + got.describe() + " vs " + want.describe());
  for (const TensorView* t : {&got, &want}) {
    int64_t expect = 1;
    for (int i = t->rank - 1; i >= 0; --i) {
      if (t->shape[i] > 1 && t->strides[i] != expect)
        throw InvalidArgument("gate: tensor " + t->describe() + " is not contiguous");
      expect *= t->shape[i];
    }
  }
}

double cosine(const TensorView& a, const TensorView& b, int64_t begin, int64_t end) {
  double dot = 0, na = 0, nb = 0;
  for (int64_t i = begin; i < end; ++i) {
    const double x = at(a, i), y = at(b, i);
    dot += x * y;
    na += x * x;
    nb += y * y;
  }
  if (na == 0 && nb == 0) return 1.0;  // both exactly zero: identical
  return dot / (std::sqrt(na) * std::sqrt(nb));
}

}  // namespace detail

using detail::check_pair;
using detail::cosine;

const char* band_name(ParityBand b) {
  return b == ParityBand::pass ? "pass" : b == ParityBand::warn ? "warn" : "low";
}

ValueMetrics value_metrics(const TensorView& got, const TensorView& want) {
  check_pair(got, want);
  ValueMetrics m;
  m.elements = elements_of(got);
  m.cosine = cosine(got, want, 0, m.elements);
  m.max_abs = max_abs(got, want, m.elements);
  return m;
}

DistributionMetrics distribution_metrics(const TensorView& got, const TensorView& want) {
  check_pair(got, want);
  if (got.rank < 1 || got.shape[got.rank - 1] < 1)
    throw InvalidArgument("gate: logits need a vocabulary dimension, got " + got.describe());
  const int64_t vocab = got.shape[got.rank - 1], n = elements_of(got);
  DistributionMetrics m;
  m.positions = n / vocab;
  int64_t agree = 0;
  for (int64_t p = 0; p < m.positions; ++p) {
    int64_t ag = 0, aw = 0;
    for (int64_t v = 1; v < vocab; ++v) {
      if (at(got, p * vocab + v) > at(got, p * vocab + ag)) ag = v;
      if (at(want, p * vocab + v) > at(want, p * vocab + aw)) aw = v;
    }
    agree += ag == aw;
  }
  m.top1_agreement = m.positions ? static_cast<double>(agree) / m.positions : 0.0;
  m.last_position_cosine = cosine(got, want, n - vocab, n);
  m.max_abs = max_abs(got, want, n);
  return m;
}

ParityBand parity_band(const OutputBand& band, double m) {
  return m >= band.pass ? ParityBand::pass : m >= band.warn ? ParityBand::warn : ParityBand::low;
}

LatencyVerdict latency_verdict(const std::vector<double>& host, const std::vector<double>& arm,
                               double min_speedup) {
  if (host.size() != arm.size() || host.empty())
    throw InvalidArgument("latency gate: need the same, non-zero number of rounds per arm");
  LatencyVerdict v;
  for (size_t i = 0; i < host.size(); ++i) v.ratios.push_back(host[i] / arm[i]);
  std::vector<double> sorted = v.ratios;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  v.median_ratio = n % 2 ? sorted[n / 2] : 0.5 * (sorted[n / 2 - 1] + sorted[n / 2]);
  v.activates = v.median_ratio >= min_speedup;
  return v;
}

std::string floors_shortfall(const std::map<std::string, double>& metrics,
                             const std::map<std::string, double>& floors) {
  for (const auto& [name, bound] : floors) {
    auto it = metrics.find(name);
    if (it == metrics.end()) {
      std::string known;
      for (const auto& [k, v] : metrics) known += (known.empty() ? "" : ", ") + k;
      throw InvalidArgument("floor on '" + name + "', which this gate does not measure (" + known +
                            ")");
    }
    const bool ceiling = name.find("abs") != std::string::npos;
    const double value = it->second;
    const bool ok = ceiling ? value <= bound : value >= bound;
    if (!ok || std::isnan(value)) {
      std::ostringstream s;
      s << name << " " << value << (ceiling ? " > ceiling " : " < floor ") << bound;
      return s.str();
    }
  }
  return "";
}

}  // namespace frt

namespace frt {

UnitVerdict judge_unit(const OutputBand& band, const GateSpec& gate,
                       const std::map<std::string, double>& metrics, int64_t fallbacks,
                       const std::vector<double>& host_seconds,
                       const std::vector<double>& arm_seconds,
                       std::optional<double> min_speedup_override,
                       const std::map<std::string, double>& floors) {
  const double min_speedup = min_speedup_override.value_or(gate.min_speedup);
  UnitVerdict v;
  const auto metric = metrics.find(band.metric);
  if (metric == metrics.end())
    throw InvalidArgument("unit gate: the parity figures lack the band's metric '" + band.metric +
                          "'");
  v.band = parity_band(band, metric->second);
  v.latency = latency_verdict(host_seconds, arm_seconds, min_speedup);
  const std::string shortfall = floors_shortfall(metrics, floors);
  std::ostringstream s;
  if (fallbacks > 0) {
    v.decision = UnitDecision::refused_fallbacks;
    s << "refused: " << fallbacks << " fallbacks in the ledger (fallback parity is the host's)";
  } else if (!shortfall.empty()) {
    v.decision = UnitDecision::refused_floor;
    s << "refused: " << shortfall;
  } else if (!v.latency.activates) {
    v.decision = UnitDecision::refused_latency;
    s.precision(3);
    s << std::fixed << "refused: median speedup " << v.latency.median_ratio << "x < ";
    s.unsetf(std::ios::floatfield);
    s.precision(6);
    s << min_speedup << "x";
  } else {
    s << "activated";
  }
  v.text = s.str();
  return v;
}

// Note [Gated auto]: "auto" asks the gated door for the best the machine offers. Integer
// activation forms (w8a8, w4a8) stream fewer bytes or fewer instructions than the weight-only
// ones and on a CPU with VNNI reach the bandwidth where the weight-only forms are bound by their
// converts, but they are other numeric forms: whether one keeps a host's outputs is a fact of
// that host. So the door measures every candidate the catalog lists (gated_auto) on the host,
// unit by unit, and keeps the fastest whose verdict is activated (no fallbacks, the caller's
// floors met, the structure's minimum speedup reached) and whose parity lies in the pass band:
// a warn band, which an explicitly chosen scheme is allowed, is not good enough for auto.
int pick_candidate(const std::vector<UnitVerdict>& verdicts) {
  int best = -1;
  for (size_t i = 0; i < verdicts.size(); ++i) {
    const UnitVerdict& v = verdicts[i];
    if (v.decision != UnitDecision::activated || v.band != ParityBand::pass) continue;
    if (best < 0 || v.latency.median_ratio > verdicts[best].latency.median_ratio)
      best = static_cast<int>(i);
  }
  return best;
}

}  // namespace frt
