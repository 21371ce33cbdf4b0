// The core's single CPU detector. Kernel package selection and the benchmarks read features
// from here and nowhere else (STYLE (f): no CPU detection in two places).
#pragma once

#include <map>
#include <set>
#include <string>
#include <string_view>

namespace frt {

struct CpuFeatures {
  std::string arch;  // "x86_64", "aarch64"
  std::string os;    // "linux"
  // The CPU as /proc/cpuinfo names it: "<model name> (family F model M stepping S)" (a guest
  // may blank the name; the numbers stay). What machine decisions are keyed by.
  std::string model;
  std::set<std::string> features;  // lower-case names: "avx2", "fma", "avx512_vnni", ...
  // Features the CPU and the OS have that this process was refused, and why (Linux's grant of
  // AMX's tile data, asked only when no cap removes the tiles).
  std::map<std::string, std::string> withheld;

  bool has(std::string_view feature) const;
  // The best ISA tier the features reach: "amx", "avx512vnni", "avx2" or "generic".
  std::string tier() const;
};

// Features this process may use: CPUID (with the OS's XSAVE state checked), then capped by the
// environment variable FRT_CPU_CAP=<tier> when it is set ("generic", "avx2", "avx512vnni", "amx"):
// a cap only removes features, never adds them. Detected once per process.
const CpuFeatures& detect_cpu();

// The features a tier needs; unknown tier names throw InvalidArgument.
std::set<std::string> tier_features(std::string_view tier);

// `cpu` with everything above `tier` removed.
CpuFeatures cap_to_tier(const CpuFeatures& cpu, std::string_view tier);

}  // namespace frt
