// The loop both GoogleTest fuzz tests run: mutate a seed, check the property, tally, keep the
// first failing inputs on disk for reproduction.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mutate.h"
#include "properties.h"

namespace frt::fuzz {

// A single input slower than this is reported as a hang. Measured: the slowest input (a 128 KiB
// YAML scalar, or 10^5 nested brackets) takes under 0.3 s under ASan+UBSan.
inline constexpr double kHangSeconds = 10.0;
// Failing inputs past this many are counted, not saved.
inline constexpr size_t kSavedFailures = 10;

struct Seed {
  std::string name;  // shown in a failure
  std::string text;
};

// Runs `inputs` mutations of the seeds (round-robin) through `check(seed_index, text)`.
inline Tally run_fuzz(const std::string& name, const std::vector<Seed>& seeds, Syntax syntax,
                      size_t inputs,
                      const std::function<Verdict(size_t, const std::string&)>& check) {
  Tally tally;
  tally.name = name;
  const uint64_t seed = fuzz_seed();
  Rng rng(seed);
  struct KindTally {
    size_t inputs = 0, refused = 0;
    double seconds = 0;
  };
  std::map<std::string, KindTally> by_kind;  // by the first mutation applied
  const std::filesystem::path failures =
      std::filesystem::temp_directory_path() / ("frt_fuzz_failures_" + std::to_string(::getpid()));
  for (size_t i = 0; i < inputs; ++i) {
    const size_t s = i % seeds.size();
    const Mutation m = mutate(seeds[s].text, syntax, rng);
    const auto t0 = std::chrono::steady_clock::now();
    const Verdict v = check(s, m.text);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    tally.add(v, dt);
    const std::string kind = m.kind.substr(0, m.kind.find('+'));
    KindTally& k = by_kind[kind];
    ++k.inputs;
    k.seconds += dt;
    if (!v.parsed && v.violation.empty()) ++k.refused;
    const bool hang = dt > kHangSeconds;
    if (v.violation.empty() && !hang) continue;
    std::string saved = "(not saved)";
    if (tally.violations + (hang ? 1 : 0) <= kSavedFailures) {
      std::filesystem::create_directories(failures);
      const auto path = failures / (name + "_" + std::to_string(i) + ".bin");
      write_file(path, m.text);
      saved = path.string();
    }
    ADD_FAILURE() << name << " input " << i << " (FRT_FUZZ_SEED=" << seed << ", seed file "
                  << seeds[s].name << ", mutation " << m.kind << ", saved to " << saved
                  << "): " << (hang ? "took " + std::to_string(dt) + " s" : v.violation);
  }
  std::string kinds;
  for (const auto& [kind, k] : by_kind) {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.2f", k.seconds);
    kinds += "\n[fuzz]   " + kind + ": " + std::to_string(k.refused) + "/" +
             std::to_string(k.inputs) + " refused, " + secs + " s";
  }
  std::printf("%s\n[fuzz] %s by first mutation:%s\n", tally.line().c_str(), name.c_str(),
              kinds.c_str());
  std::fflush(stdout);
  return tally;
}

}  // namespace frt::fuzz
