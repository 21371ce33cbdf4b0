// The gated door's decisions across units and candidate schemes (Note [Unit arbitration] in
// gates.h): which candidate each unit keeps, which units yield to others, what is refused.
#include <flashrt/errors.h>
#include <flashrt/gates.h>

#include <algorithm>
#include <map>
#include <set>

namespace frt {
namespace {

std::string decision_of(const CandidateResult& c) {
  return c.verdict ? c.verdict->text : c.unmeasured;
}

std::string band_of(const CandidateResult& c) {
  return c.verdict ? band_name(c.verdict->band) : "unmeasured";
}

}  // namespace

bool overlaps(const std::string& path, const std::vector<std::string>& taken) {
  const auto inside = [](const std::string& a, const std::string& b) {
    return a.size() > b.size() && a.compare(0, b.size(), b) == 0 && a[b.size()] == '.';
  };
  return std::any_of(taken.begin(), taken.end(), [&](const std::string& t) {
    return path == t || inside(path, t) || inside(t, path);
  });
}

bool UnitArbiter::offer(const std::string& unit, CandidateResult result) {
  auto it =
      std::find_if(units_.begin(), units_.end(), [&](const Unit& u) { return u.name == unit; });
  if (it == units_.end()) {
    units_.push_back(Unit{unit, {}, -1});
    it = units_.end() - 1;
  }
  Unit& u = *it;
  u.tried.push_back(std::move(result));
  const CandidateResult& now = u.tried.back();
  if (!now.verdict) return false;
  bool better = false;
  if (gated_auto_) {  // the faster of the best so far and this one, if either passes
    std::vector<UnitVerdict> held;
    if (u.best >= 0) held.push_back(*u.tried[u.best].verdict);
    held.push_back(*now.verdict);
    better = pick_candidate(held) == static_cast<int>(held.size()) - 1;
  } else {
    better = now.verdict->decision == UnitDecision::activated;
  }
  if (better) u.best = static_cast<int>(u.tried.size()) - 1;
  return better;
}

void UnitArbiter::plan_refused(const std::string& scheme, const std::string& path,
                               const std::string& why) {
  auto it = std::find_if(plan_refusals_.begin(), plan_refusals_.end(),
                         [&](const auto& r) { return r.first == path; });
  if (it == plan_refusals_.end()) {
    plan_refusals_.emplace_back(path, std::vector<std::string>{});
    it = plan_refusals_.end() - 1;
  }
  it->second.push_back(gated_auto_ ? scheme + ": " + why : why);
}

Arbitration UnitArbiter::settle() const {
  Arbitration a;
  std::vector<std::string> seated;
  std::map<std::string, std::string> kept_under;  // a kept unit's holding -> its scheme
  std::set<std::string> decided;
  for (const Unit& u : units_) {
    UnitOutcome o;
    o.unit = u.name;
    if (u.best >= 0) {
      const CandidateResult& kept = u.tried[u.best];
      o.scheme = o.best = kept.scheme;
      o.decision = decision_of(kept);
      o.paths = kept.paths;
      if (std::any_of(kept.paths.begin(), kept.paths.end(),
                      [&](const std::string& p) { return overlaps(p, seated); })) {
        o.scheme.clear();
        o.decision = "refused: its modules are seated by another unit";
      }
      std::string missing;
      for (const std::string& r : kept.needs) {
        const auto it = kept_under.find(r);
        if (it == kept_under.end() || it->second != kept.scheme)
          missing += (missing.empty() ? "" : ", ") + r;
      }
      if (o.kept() && !missing.empty()) {
        o.scheme.clear();
        o.decision = "refused: the seats it runs are not all kept under " + kept.scheme + " (" +
                     missing + ")";
      }
    } else if (gated_auto_) {
      o.decision = "refused: no candidate passed (";
      for (size_t i = 0; i < u.tried.size(); ++i)
        o.decision += (i ? "; " : "") + u.tried[i].scheme + ": " + decision_of(u.tried[i]) +
                      ", parity " + band_of(u.tried[i]);
      o.decision += ")";
    } else {
      o.decision = decision_of(u.tried.front());
    }
    if (o.kept()) {
      seated.insert(seated.end(), o.paths.begin(), o.paths.end());
      for (const std::string& p : o.paths) kept_under[p] = o.scheme;
      decided.insert(o.paths.begin(), o.paths.end());
    } else {
      std::set<std::string> every;  // every module some candidate seats for the unit, sorted
      for (const CandidateResult& c : u.tried) every.insert(c.paths.begin(), c.paths.end());
      o.paths.assign(every.begin(), every.end());
      for (const std::string& p : o.paths) {
        a.refused.emplace_back(p, u.name + " unit " + o.decision);
        decided.insert(p);
      }
    }
    a.units.push_back(std::move(o));
  }
  for (const auto& [path, reasons] : plan_refusals_) {
    if (decided.count(path)) continue;
    std::string joined;
    for (const std::string& r : reasons) joined += (joined.empty() ? "" : "; ") + r;
    a.refused.emplace_back(path, joined);
  }
  return a;
}

}  // namespace frt
