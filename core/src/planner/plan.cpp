// Qualification: for every seam, the scheme picks a weight form (or keeps the seam at host
// precision, with a reason), then the structure's ladder is walked until an impl qualifies;
// every step aside is recorded. A seam no impl takes is refused with the form and the shape.
#include <flashrt/errors.h>
#include <flashrt/plan.h>

#include <algorithm>
#include <set>
#include <sstream>

namespace frt {
namespace {

constexpr int64_t kBandMin = 1, kBandMax = FRT_MAX_ROWS;

std::string shape_of(const Seam& s) {
  if (s.structure == "decoder_ffn")
    return "hidden " + std::to_string(s.in_features) + ", intermediate " +
           std::to_string(s.intermediate);
  return "[" + std::to_string(s.out_features) + "x" + std::to_string(s.in_features) + "]";
}

int64_t weight_count(const Seam& s) {
  if (s.structure == "decoder_ffn") return 3 * s.in_features * s.intermediate;
  return s.in_features * s.out_features;
}

Scheme resolve_scheme(const std::string& name, KernelHub& hub) {
  Scheme s;
  s.name = name;
  if (name == "auto") {
    // On CPU, weight-only int8 is the form that keeps parity (cosine >= 0.999 on real hosts)
    // while halving to quartering the bytes; it needs the linear package.
    s.name = hub.resolve("flashrt/linear").table != nullptr ? "w8a16_decode" : "none";
  }
  const WeightForm int8{"int8", 0, true}, int4{"int4", 32, true};
  if (s.name == "w8a16_decode") {
    s.formats = {{"linear_proj", int8}, {"decoder_ffn", int8}, {"lm_head", int8}};
  } else if (s.name == "w4a16_decode") {
    // The head stays at int8: its error moves the argmax directly (teacher-forced agreement).
    s.formats = {{"linear_proj", int4}, {"decoder_ffn", int4}, {"lm_head", int8}};
  } else if (s.name != "none") {
    throw InvalidArgument("unknown scheme '" + name +
                          "'; known: auto, none, w8a16_decode, w4a16_decode");
  }
  return s;
}

// The impls a structure's ladder tries, best first.
struct Rung {
  std::string impl, package;
};

std::vector<Rung> ladder_for(const std::string& structure, const std::string& format) {
  const std::string suffix = format == "int8" ? "_w8a16" : "_w4a16";
  if (structure == "decoder_ffn")
    return {{"ffn" + suffix, "flashrt/ffn"}, {"ffn_as_projections" + suffix, "flashrt/linear"}};
  return {{"linear" + suffix, "flashrt/linear"}};
}

bool takes_dtype(const std::string& dt) { return dt == "f32" || dt == "bf16"; }

}  // namespace

std::string WeightForm::describe() const {
  if (format == "int8") return "int8 per-channel";
  return "int4 g" + std::to_string(group) + (symmetric ? " symmetric" : " asymmetric");
}

std::vector<std::string> scheme_names() { return {"auto", "none", "w8a16_decode", "w4a16_decode"}; }

Plan plan(const HostGraph& graph, const PlanOptions& options, KernelHub& hub) {
  Plan p;
  p.scheme = resolve_scheme(options.scheme, hub);
  Discovery d = discover(graph, options.structures);
  p.refused = d.refused;
  p.assumed = d.assumed;
  p.seams_found = static_cast<int64_t>(d.seams.size());
  std::set<std::string> unavailable_noted;
  for (Seam& seam : d.seams) {
    const std::string where = seam.structure + " " + shape_of(seam);
    auto form_it = p.scheme.formats.find(seam.structure);
    if (form_it == p.scheme.formats.end()) {
      p.keep_host.emplace_back(
          seam.site, "scheme '" + p.scheme.name + "' keeps " + where + " at host precision");
      continue;
    }
    if (weight_count(seam) < options.min_seat_weights) {
      p.keep_host.emplace_back(seam.site, where + ": " + std::to_string(weight_count(seam)) +
                                              " weights, below the " +
                                              std::to_string(options.min_seat_weights) +
                                              " where a seat pays for its call");
      continue;
    }
    if (!takes_dtype(seam.weight_dtype)) {
      p.refused.emplace_back(
          seam.site, where + ": weight dtype " + seam.weight_dtype + "; impls take f32, bf16");
      continue;
    }
    if (!seam.act_dtype.empty() && !takes_dtype(seam.act_dtype)) {
      p.refused.emplace_back(seam.site, where + ": activations " + seam.act_dtype +
                                            " in the observed forward; impls take f32, bf16");
      continue;
    }
    WeightForm form = form_it->second;
    std::vector<std::string> steps;
    if (form.format == "int4") {
      const bool inter_ok = seam.structure != "decoder_ffn" || seam.intermediate % form.group == 0;
      if (seam.in_features % form.group != 0 || !inter_ok) {
        steps.push_back(form.describe() + " needs widths divisible by " +
                        std::to_string(form.group) + " (" + shape_of(seam) + "): int8 instead");
        form = WeightForm{"int8", 0, true};
      }
    }
    if (std::all_of(seam.rows_seen.begin(), seam.rows_seen.end(),
                    [](int64_t r) { return r > kBandMax; }) &&
        !seam.rows_seen.empty())
      p.assumed.push_back(seam.site + ": observed only " + std::to_string(seam.rows_seen.front()) +
                          "-row calls; seated for decode rows 1.." + std::to_string(kBandMax) +
                          ", larger calls run the host (band dispatch)");
    bool seated = false;
    for (const Rung& rung : ladder_for(seam.structure, form.format)) {
      const PackageResolution& r = hub.resolve(rung.package);
      if (r.table == nullptr) {
        steps.push_back(rung.impl + ": kernel package " + rung.package + " unavailable");
        if (unavailable_noted.insert(rung.package).second)
          for (const UnavailableEntry& e : hub.unavailable_report())
            if (e.repo == rung.package) p.kernel_unavailable.push_back(e);
        continue;
      }
      SeatPlan s;
      s.seam = seam;
      s.impl = rung.impl;
      s.package = rung.package;
      s.form = form;
      s.band_min = kBandMin;
      s.band_max = kBandMax;
      s.ladder = steps;
      p.seats.push_back(std::move(s));
      seated = true;
      break;
    }
    if (!seated) {
      std::string why = where + ": no impl qualifies";
      for (const std::string& step : steps) why += "; " + step;
      p.refused.emplace_back(seam.site, why);
    }
  }
  return p;
}

std::string explain(const Plan& p) {
  std::ostringstream s;
  s << "flashrt plan: scheme " << p.scheme.name << ", " << p.seams_found << " seams found, "
    << p.seats.size() << " seated, " << p.keep_host.size() << " kept at host, " << p.refused.size()
    << " refused\n";
  if (!p.seats.empty()) s << "\nseated:\n";
  for (const SeatPlan& seat : p.seats) {
    s << "  " << seat.seam.site << "  " << seat.seam.structure << " " << shape_of(seat.seam)
      << " -> " << seat.impl << " (" << seat.form.describe() << ", rows " << seat.band_min << ".."
      << seat.band_max << ", " << seat.package << ")\n";
    for (const std::string& step : seat.ladder) s << "      ladder: " << step << "\n";
  }
  if (!p.keep_host.empty()) s << "\nkept at host:\n";
  for (const auto& [site, why] : p.keep_host) s << "  " << site << "  " << why << "\n";
  if (!p.refused.empty()) s << "\nrefused:\n";
  for (const auto& [site, why] : p.refused) s << "  " << site << "  " << why << "\n";
  if (!p.assumed.empty()) s << "\nassumed:\n";
  for (const std::string& a : p.assumed) s << "  " << a << "\n";
  for (const UnavailableEntry& e : p.kernel_unavailable)
    s << "\nkernel unavailable: " << e.repo << " " << e.version << ": " << e.error << ": "
      << e.detail << "\n";
  return s.str();
}

}  // namespace frt
