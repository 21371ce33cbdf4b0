// Choosing a package's build variant: refuse from metadata and the core's one CPU detector alone
// (arch, OS, CPU features, ABI, ISA: no dlopen), rank the rest by ISA, then try them best first
// and keep the first whose library loads (load.cpp). Every variant's decision is kept as text.
#include <flashrt/hub.h>

#include <algorithm>
#include <set>

#include "hub_internal.h"
#include "metadata.h"

namespace frt::detail {
namespace {

constexpr const char* kErrNoVariant = "no build variant for this host";

// Every feature name the detector can report; anything else in a variant's "requires" is a
// feature this loader cannot vouch for.
const std::set<std::string>& known_features() {
  static const std::set<std::string> kKnown = {
      "sse2",        "sse4_1",      "sse4_2",   "avx",      "avx2",     "fma",
      "f16c",        "bmi2",        "avx512f",  "avx512bw", "avx512vl", "avx512dq",
      "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"};
  return kKnown;
}

// Higher is better; 0 = an ISA this loader does not know.
int isa_rank(const std::string& isa) {
  if (isa == "amx") return 4;
  if (isa == "avx512vnni") return 3;
  if (isa == "avx2") return 2;
  if (isa == "generic") return 1;
  return 0;
}

// Metadata-only refusals (no dlopen): arch, OS, CPU features, ABI, ISA. "" = may be tried.
// *withheld says the refusal is a feature the CPU has but this process may not use.
std::string static_refusal(const VariantMetadata& v, const PackageMetadata& md,
                           const CpuFeatures& cpu, bool* withheld) {
  if (v.arch != cpu.arch) {
    return "CPU (" + v.arch + ") does not match system CPU (" + cpu.arch + ")";
  }
  if (v.os != cpu.os) return "OS (" + v.os + ") does not match system OS (" + cpu.os + ")";
  // The ISA's own features count even when metadata forgot to list them: running an avx2
  // library on a CPU without avx2 is a SIGILL, not a refusal.
  std::vector<std::string> needs = v.requires_features;
  if (isa_rank(v.isa) > 0) {
    for (const std::string& f : tier_features(v.isa)) needs.push_back(f);
  }
  for (const std::string& f : needs) {
    if (!known_features().count(f)) return "variant needs unknown CPU feature '" + f + "'";
    if (cpu.has(f)) continue;
    if (auto w = cpu.withheld.find(f); w != cpu.withheld.end()) {
      *withheld = true;
      return "variant needs " + f +
             ", which this CPU has but this process may not use: " + w->second;
    }
    return "variant needs " + f + ", this CPU has " + cpu.tier();
  }
  if (md.abi_major != FRT_KERNEL_ABI_MAJOR) return abi_refusal(md.abi_major);
  if (isa_rank(v.isa) == 0) return "unknown isa '" + v.isa + "'";
  return "";
}

}  // namespace

void choose_variant(const PackageMetadata& md, const CpuFeatures& cpu, Outcome* out) {
  PackageResolution& res = out->resolution;
  std::vector<size_t> candidates, withheld;
  for (size_t i = 0; i < md.variants.size(); ++i) {
    const VariantMetadata& v = md.variants[i];
    VariantDecision d;
    d.name = v.name;
    d.isa = v.isa;
    d.library = v.library_path.string();
    d.sha256 = v.sha256;
    bool refused_by_withholding = false;
    d.reason = static_refusal(v, md, cpu, &refused_by_withholding);
    if (d.reason.empty()) candidates.push_back(i);
    if (refused_by_withholding) withheld.push_back(i);
    res.variants.push_back(std::move(d));
  }
  std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
    return isa_rank(md.variants[a].isa) > isa_rank(md.variants[b].isa);
  });
  for (size_t i : candidates) {
    VariantDecision& d = res.variants[i];
    if (!res.chosen.empty()) {
      d.reason = "not tried: " + res.chosen + " chosen";
      continue;
    }
    const frt_kernel_table* table = try_variant(md.variants[i], &d.reason);
    if (table != nullptr) {
      d.chosen = true;
      d.reason.clear();
      res.chosen = d.name;
      res.table = table;
    }
  }
  // A build this CPU could run but the process was refused (AMX's tile data) is reported even
  // though a lesser build serves: the user asked for a machine's best and is not getting it.
  for (size_t i : withheld) {
    const VariantDecision& d = res.variants[i];
    out->withheld.push_back(UnavailableEntry{
        res.repo, res.version, "build variant withheld: " + d.name,
        d.reason + (res.chosen.empty() ? "" : "; " + res.chosen + " serves instead")});
  }
  if (res.table != nullptr) return;

  std::string detail;
  for (const VariantDecision& d : res.variants) {
    if (!detail.empty()) detail += "; ";
    detail += d.name + ": " + d.reason;
  }
  if (detail.empty()) detail = "metadata declares no variants";
  out->unavailable = UnavailableEntry{res.repo, res.version, kErrNoVariant, detail};
}

}  // namespace frt::detail
