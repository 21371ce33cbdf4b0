// What the kernel tests share: opening a package's variant (skipping where this CPU cannot run
// it), fresh seeds (printed by each test, so a failure can be replayed), bf16 rounding.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/cpu_features.h>
#include <flashrt/hub.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace frt::ktest {

// The shipped variants, then "avx512vnni-simde": the avx512vnni sources built on AVX2 through
// SIMDe, test only (Note [Emulated zmm variant], kernels/common/include/frt_kern/zmm_simde.h).
inline const std::vector<std::string> kIsas = {"generic", "avx2", "avx512vnni", "avx512vnni-simde"};

inline constexpr const char* kEmulatedSuffix = "-simde";

inline bool emulated(const std::string& isa) { return isa.ends_with(kEmulatedSuffix); }

inline std::string library(const std::string& pkg, const std::string& isa) {
#if defined(FRT_TEST_EMULATED_KERNEL_ROOT)
  const std::string root = emulated(isa) ? FRT_TEST_EMULATED_KERNEL_ROOT : FRT_TEST_KERNEL_ROOT;
#else
  const std::string root = FRT_TEST_KERNEL_ROOT;
#endif
  return root + "/flashrt/" + pkg + "/build/cpu-x86_64-linux-" + isa + "/libfrt_" + pkg + ".so";
}

// The variant's table, or nullptr (and a skip reason) when this CPU cannot run it or this build
// has no emulated variant. The emulated one needs what its flags target: the avx2 tier.
inline const frt_kernel_table* open_variant(const std::string& pkg, const std::string& isa,
                                            std::string* skip) {
#if !defined(FRT_TEST_EMULATED_KERNEL_ROOT)
  if (emulated(isa)) {
    *skip = "the " + isa + " variant was not built (SIMDe's simde/x86/avx512.h not found)";
    return nullptr;
  }
#endif
  for (const std::string& f : tier_features(emulated(isa) ? "avx2" : isa))
    if (!detect_cpu().has(f)) {
      *skip = "this CPU lacks " + f + " for the " + isa + " variant";
      return nullptr;
    }
  std::string why;
  const frt_kernel_table* t = open_variant_library(library(pkg, isa), &why);
  if (t == nullptr) ADD_FAILURE() << "cannot open " << library(pkg, isa) << ": " << why;
  return t;
}

inline uint64_t fresh_seed() {
  static std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

// The value a bf16 tensor holds for f (round to nearest even).
inline float to_bf16_value(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace frt::ktest
