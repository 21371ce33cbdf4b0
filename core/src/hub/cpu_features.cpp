// CPUID-based feature detection. This file is compiled without ISA flags (the core has none) so
// that running the detector can never SIGILL on the machine it is asked about.
#include <flashrt/cpu_features.h>
#include <flashrt/errors.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#endif

namespace frt {
namespace {

// Tiers from best to worst; tier() answers the first whose features are all present.
constexpr std::array<std::string_view, 4> kTiers = {"amx", "avx512vnni", "avx2", "generic"};

#if defined(__x86_64__) || defined(__i386__)

// XCR0 bits the OS sets when it saves the register state on context switch. CPUID alone says
// what the silicon has; without these an AVX instruction still faults (Intel SDM 13.3).
constexpr uint64_t kXcr0Ymm = (1u << 1) | (1u << 2);              // SSE + AVX state
constexpr uint64_t kXcr0Zmm = (1u << 5) | (1u << 6) | (1u << 7);  // opmask, ZMM_Hi256, Hi16_ZMM
constexpr uint64_t kXcr0Tile = (1u << 17) | (1u << 18);           // XTILECFG, XTILEDATA

// Linux keeps the AMX tile data (8 KiB of XSAVE state) out of a process until it asks for it:
// the first tile instruction without ARCH_REQ_XCOMP_PERM is a SIGILL (Linux
// Documentation/arch/x86/xstate.rst). "" once granted, else why not. Asked once per process; the
// grant covers every thread, present and future.
std::string request_tile_data() {
#if defined(__linux__) && defined(SYS_arch_prctl)
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0) return "";
  return std::string(
             "Linux refused the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, "
             "XTILEDATA): ") +
         std::strerror(errno);
#else
  return "this OS has no way to grant the AMX tile state";
#endif
}

uint64_t read_xcr0() {
  uint32_t eax = 0, edx = 0;
  // xgetbv is only valid once CPUID.1:ECX.OSXSAVE is known to be set (checked by the caller).
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<uint64_t>(edx) << 32) | eax;
}

bool bit(uint32_t reg, int n) { return (reg >> n) & 1u; }

std::set<std::string> detect_x86() {
  std::set<std::string> f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(1, 0, &a, &b, &c, &d)) return f;
  const uint32_t ecx1 = c, edx1 = d;
  if (bit(edx1, 26)) f.insert("sse2");
  if (bit(ecx1, 19)) f.insert("sse4_1");
  if (bit(ecx1, 20)) f.insert("sse4_2");

  const bool osxsave = bit(ecx1, 27);
  const uint64_t xcr0 = osxsave ? read_xcr0() : 0;
  const bool os_ymm = (xcr0 & kXcr0Ymm) == kXcr0Ymm;
  const bool os_zmm = os_ymm && (xcr0 & kXcr0Zmm) == kXcr0Zmm;

  if (os_ymm) {
    if (bit(ecx1, 28)) f.insert("avx");
    if (bit(ecx1, 12)) f.insert("fma");
    if (bit(ecx1, 29)) f.insert("f16c");
  }

  unsigned max_leaf = 0;
  if (!__get_cpuid_count(0, 0, &max_leaf, &b, &c, &d) || max_leaf < 7) return f;
  __get_cpuid_count(7, 0, &a, &b, &c, &d);
  const uint32_t max_sub7 = a, ebx7 = b, ecx7 = c, edx7 = d;
  if (bit(ebx7, 8)) f.insert("bmi2");  // scalar, no OS state needed
  if (os_ymm && bit(ebx7, 5)) f.insert("avx2");
  if (os_zmm) {
    if (bit(ebx7, 16)) f.insert("avx512f");
    if (bit(ebx7, 17)) f.insert("avx512dq");
    if (bit(ebx7, 30)) f.insert("avx512bw");
    if (bit(ebx7, 31)) f.insert("avx512vl");
    if (bit(ecx7, 11)) f.insert("avx512_vnni");
    if (max_sub7 >= 1) {
      __get_cpuid_count(7, 1, &a, &b, &c, &d);
      if (bit(a, 5)) f.insert("avx512_bf16");
    }
  }
  // AMX: the silicon (CPUID.7.0:EDX bits 24, 25, 22) and the OS's XSAVE state for the tiles;
  // the process's grant is asked later, only if a cap leaves the tiles in (grant_tiles).
  if (bit(edx7, 24) && (xcr0 & kXcr0Tile) == kXcr0Tile) {
    f.insert("amx_tile");
    if (bit(edx7, 25)) f.insert("amx_int8");
    if (bit(edx7, 22)) f.insert("amx_bf16");
  }
  return f;
}

#endif

// Asks for the tile state when the (capped) features still name AMX; a refusal moves every AMX
// feature to `withheld` with Linux's reason.
void grant_tiles(CpuFeatures* cpu) {
  if (!cpu->has("amx_tile")) return;
#if defined(__x86_64__)
  const std::string why = request_tile_data();
#else
  const std::string why = "no AMX off x86-64";
#endif
  if (why.empty()) return;
  for (auto it = cpu->features.begin(); it != cpu->features.end();) {
    if (it->rfind("amx", 0) != 0) {
      ++it;
      continue;
    }
    cpu->withheld[*it] = why;
    it = cpu->features.erase(it);
  }
}

// "<model name> (family F model M stepping S)" from /proc/cpuinfo's first processor.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::map<std::string, std::string> fields;
  for (std::string line; std::getline(in, line) && !line.empty();) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, colon), value = line.substr(colon + 1);
    while (!key.empty() && (key.back() == ' ' || key.back() == '\t')) key.pop_back();
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    fields.emplace(key, value);
  }
  auto at = [&](const char* k) { return fields.count(k) ? fields[k] : std::string("?"); };
  return at("model name") + " (family " + at("cpu family") + " model " + at("model") +
         " stepping " + at("stepping") + ")";
}

CpuFeatures detect_uncapped() {
  CpuFeatures cpu;
  cpu.model = cpu_model();
#if defined(__x86_64__)
  cpu.arch = "x86_64";
  cpu.features = detect_x86();
#elif defined(__aarch64__)
  cpu.arch = "aarch64";
#else
  cpu.arch = "unknown";
#endif
  cpu.os = "linux";
  return cpu;
}

int tier_rank(std::string_view tier) {
  for (size_t i = 0; i < kTiers.size(); ++i) {
    if (kTiers[i] == tier) return static_cast<int>(kTiers.size() - i);
  }
  return 0;
}

}  // namespace

bool CpuFeatures::has(std::string_view feature) const {
  return features.find(std::string(feature)) != features.end();
}

std::string CpuFeatures::tier() const {
  for (std::string_view t : kTiers) {
    bool all = true;
    for (const std::string& f : tier_features(t)) all = all && has(f);
    if (all) return std::string(t);
  }
  return "generic";
}

std::set<std::string> tier_features(std::string_view tier) {
  if (tier == "generic") return {};
  if (tier == "avx2") return {"avx2", "fma", "f16c"};
  if (tier == "avx512vnni") {
    return {"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma", "f16c"};
  }
  if (tier == "amx") {
    return {"amx_tile",    "amx_int8", "avx512f", "avx512bw", "avx512vl",
            "avx512_vnni", "avx2",     "fma",     "f16c"};
  }
  throw InvalidArgument("unknown CPU tier '" + std::string(tier) +
                        "' (expected generic, avx2, avx512vnni or amx)");
}

CpuFeatures cap_to_tier(const CpuFeatures& cpu, std::string_view tier) {
  const std::set<std::string> keep = tier_features(tier);  // throws on an unknown tier
  const int rank = tier_rank(tier);
  CpuFeatures out = cpu;
  for (std::string_view higher : kTiers) {
    if (tier_rank(higher) <= rank) continue;
    for (const std::string& f : tier_features(higher)) {
      if (!keep.count(f)) out.features.erase(f);
    }
  }
  // Below the AVX-512 tier drop the whole family, including members no tier names (dq, bf16):
  // a capped CPU must not look like it still runs 512-bit code.
  if (rank < tier_rank("avx512vnni")) {
    for (auto it = out.features.begin(); it != out.features.end();) {
      it = it->rfind("avx512", 0) == 0 ? out.features.erase(it) : std::next(it);
    }
  }
  // Below the AMX tier, every AMX feature goes (amx_bf16 too), and nothing is withheld: a cap
  // is not a refusal.
  if (rank < tier_rank("amx")) {
    for (auto it = out.features.begin(); it != out.features.end();) {
      it = it->rfind("amx", 0) == 0 ? out.features.erase(it) : std::next(it);
    }
    std::erase_if(out.withheld, [](const auto& kv) { return kv.first.rfind("amx", 0) == 0; });
  }
  return out;
}

const CpuFeatures& detect_cpu() {
  // A throwing initializer leaves the static uninitialised, so a bad FRT_CPU_CAP is reported on
  // every call rather than once.
  static const CpuFeatures cpu = [] {
    CpuFeatures detected = detect_uncapped();
    const char* cap = std::getenv("FRT_CPU_CAP");
    if (cap != nullptr && *cap != '\0') {
      try {
        detected = cap_to_tier(detected, cap);
      } catch (const InvalidArgument& e) {
        throw InvalidArgument(std::string("FRT_CPU_CAP: ") + e.what());
      }
    }
    grant_tiles(&detected);  // after the cap: a process held below AMX never asks
    return detected;
  }();
  return cpu;
}

}  // namespace frt
