// Gates (DESIGN §7): parity by output kind, paired latency, caller floors. A band warns; only a
// caller's floors turn a number into a refusal.
#pragma once

#include <flashrt/catalog.h>
#include <flashrt/tensor.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
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

// The band of a parity metric (cosine for values, top-1 agreement for distributions) under the
// catalog's bands for that output kind (gates.yaml). NaN is low.
ParityBand parity_band(const OutputBand& band, double metric);

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

// The verdict on one unit of the gated door (DESIGN §7), judged in this order: a unit whose
// ledger shows fallbacks did not run; a caller's floor not met; a median speedup below the
// structure's minimum. The door runs the forwards and times them; the core decides.
enum class UnitDecision : int32_t { activated, refused_fallbacks, refused_floor, refused_latency };

struct UnitVerdict {
  UnitDecision decision = UnitDecision::activated;
  std::string text;  // "activated" or "refused: <reason>"
  ParityBand band = ParityBand::low;
  LatencyVerdict latency;
};

// metrics: the parity figures (band metric among them); fallbacks: the unit's ledger count;
// gate: the unit's structure's gates (its minimum speedup), unless the caller overrides it.
UnitVerdict judge_unit(const OutputBand& band, const GateSpec& gate,
                       const std::map<std::string, double>& metrics, int64_t fallbacks,
                       const std::vector<double>& host_seconds,
                       const std::vector<double>& arm_seconds,
                       std::optional<double> min_speedup_override,
                       const std::map<std::string, double>& floors);

// Auto in the gated door (Note [Gated auto] in gates.cpp): of one unit's verdicts under each
// candidate scheme, the index of the fastest whose decision is activated and whose parity is in
// the pass band, or -1 when none is.
int pick_candidate(const std::vector<UnitVerdict>& verdicts);

// Note [Unit arbitration]: the gated door measures each unit (a structure's seats) under each
// candidate scheme; the arbiter decides. A unit keeps its best candidate (gated auto: the fastest
// that pick_candidate accepts; a named scheme: its one candidate when activated), unless one of
// its modules is, holds or sits inside a module of a unit kept before it (offer order), and every
// module of a unit that keeps nothing is refused with the unit's decision. A module some plan
// refused and no unit decided is refused with the plans' reasons (each prefixed by its scheme
// under gated auto). The door times and converts; it seats what settle() keeps. A function seat
// holds no module: the door names it `<module>:<structure>`, which overlaps nothing else. A unit
// that runs other units' seats (a decoder block runs its parts') lists their holdings in
// `needs`: it is kept only if each of them is kept, by a unit settled before it, under the
// same scheme; else it is refused naming what is not.
struct CandidateResult {
  std::string scheme;
  std::optional<UnitVerdict> verdict;  // none: the unit could not be measured
  std::string unmeasured;              // why, when there is no verdict ("refused: ...")
  std::vector<std::string> paths;      // the modules this candidate seats
  std::vector<std::string> needs;      // holdings of other units whose seats it runs
};

struct UnitOutcome {
  std::string unit;
  std::string scheme;              // the kept candidate's scheme; "" when the unit keeps nothing
  std::string best;                // the best candidate's scheme, kept or yielded; "" if none
  std::string decision;            // "activated" or "refused: <reason>"
  std::vector<std::string> paths;  // kept: the seated modules; else every module refused
  bool kept() const { return !scheme.empty(); }
};

struct Arbitration {
  std::vector<UnitOutcome> units;                            // in the order units were offered
  std::vector<std::pair<std::string, std::string>> refused;  // (module, reason)
};

class UnitArbiter {
 public:
  explicit UnitArbiter(bool gated_auto) : gated_auto_(gated_auto) {}
  // One unit measured under one candidate. True when it is now the unit's best: the door keeps
  // its seats (and may drop the previous best's).
  bool offer(const std::string& unit, CandidateResult result);
  // A plan's refusal of a module under `scheme`.
  void plan_refused(const std::string& scheme, const std::string& path, const std::string& why);
  Arbitration settle() const;

 private:
  struct Unit {
    std::string name;
    std::vector<CandidateResult> tried;
    int best = -1;
  };
  bool gated_auto_;
  std::vector<Unit> units_;
  std::vector<std::pair<std::string, std::vector<std::string>>> plan_refusals_;
};

// Whether a module path is, holds or sits inside one of `taken`.
bool overlaps(const std::string& path, const std::vector<std::string>& taken);

// decode_loop's self-check (SelfCheckSpec): got and want are logits [positions, vocab]; got_keys
// and want_keys the keys each layer cached after rotary, [layers * positions, kv_heads *
// head_dim] (layer major). f32 or bf16, contiguous; throws InvalidArgument otherwise.
struct SelfCheckVerdict {
  bool passed = false;
  double top1_agreement = 0;
  double min_cosine = 0;  // the worst position's logits cosine
  int64_t worst_position = 0;
  double min_keys_cosine = 0;  // the worst cached key's cosine
  int64_t worst_key_layer = 0, worst_key_position = 0;
  int64_t positions = 0;
  std::string text;  // "passed" or the refusal ("self-check against the host: ...")
};
// The keys are [layers * kept, width]: each layer's positions [first_key_position, positions),
// kept = positions - first_key_position (a host whose sliding layers cache their window only
// holds the probe's last positions).
SelfCheckVerdict judge_self_check(const SelfCheckSpec& spec, const TensorView& got,
                                  const TensorView& want, const TensorView& got_keys,
                                  const TensorView& want_keys, int64_t first_key_position = 0);

// get().bind()'s certification: the worst of the samples' cosines against a floor (the
// structure's parity pass band unless the caller names one; a floor <= 0 checks nothing).
struct CertificationVerdict {
  bool passed = false;
  double worst_cosine = 1.0;
  int64_t samples = 0;
  std::string text;  // "passed" or "worst cosine 0.912345 < gate 0.999"
};
CertificationVerdict judge_certification(const std::vector<double>& cosines, double floor);

}  // namespace frt
