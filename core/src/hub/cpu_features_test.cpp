#include <flashrt/cpu_features.h>
#include <flashrt/errors.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace frt {
namespace {

const std::set<std::string> kAllReported = {
    "sse2",        "sse4_1",      "sse4_2",   "avx",      "avx2",     "fma",
    "f16c",        "bmi2",        "avx512f",  "avx512bw", "avx512vl", "avx512dq",
    "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16"};

TEST(CpuFeaturesTest, ReportsArchAndOs) {
  const CpuFeatures& cpu = detect_cpu();
#if defined(__x86_64__)
  EXPECT_EQ(cpu.arch, "x86_64");
#elif defined(__aarch64__)
  EXPECT_EQ(cpu.arch, "aarch64");
#endif
  EXPECT_EQ(cpu.os, "linux");
  for (const std::string& f : cpu.features) EXPECT_TRUE(kAllReported.count(f)) << f;
}

TEST(CpuFeaturesTest, TierFeaturesArePresent) {
  const CpuFeatures& cpu = detect_cpu();
  for (const std::string& f : tier_features(cpu.tier())) EXPECT_TRUE(cpu.has(f)) << f;
}

// The kernel's own view (it also checks XSAVE state) must agree with ours on every feature we
// report, unless a cap is in force.
TEST(CpuFeaturesTest, AgreesWithProcCpuinfo) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "x86 only";
#endif
  const char* cap = std::getenv("FRT_CPU_CAP");
  if (cap != nullptr && *cap != '\0') GTEST_SKIP() << "FRT_CPU_CAP is set";
  std::ifstream in("/proc/cpuinfo");
  std::string line, flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') + 1);
      break;
    }
  }
  if (flags.empty()) GTEST_SKIP() << "no flags line in /proc/cpuinfo";
  std::set<std::string> kernel;
  std::istringstream words(flags);
  for (std::string w; words >> w;) {
    if (kAllReported.count(w)) kernel.insert(w);
  }
  // A feature the process was refused (AMX's tile data) is withheld, not lost.
  std::set<std::string> ours = detect_cpu().features;
  for (const auto& [name, why] : detect_cpu().withheld) {
    EXPECT_FALSE(why.empty()) << name;
    ours.insert(name);
  }
  EXPECT_EQ(ours, kernel);
}

TEST(CpuFeaturesTest, TierFeatureSets) {
  EXPECT_TRUE(tier_features("generic").empty());
  EXPECT_EQ(tier_features("avx2"), (std::set<std::string>{"avx2", "fma", "f16c"}));
  EXPECT_EQ(tier_features("avx512vnni"),
            (std::set<std::string>{"avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx2", "fma",
                                   "f16c"}));
  EXPECT_EQ(tier_features("amx"),
            (std::set<std::string>{"amx_tile", "amx_int8", "avx512f", "avx512bw", "avx512vl",
                                   "avx512_vnni", "avx2", "fma", "f16c"}));
  EXPECT_THROW(tier_features("sse9"), InvalidArgument);
}

CpuFeatures everything() {
  CpuFeatures cpu;
  cpu.arch = "x86_64";
  cpu.os = "linux";
  cpu.features = kAllReported;
  return cpu;
}

TEST(CpuFeaturesTest, TierPicksBestComplete) {
  CpuFeatures cpu = everything();
  EXPECT_EQ(cpu.tier(), "amx");
  cpu.features.erase("amx_int8");
  EXPECT_EQ(cpu.tier(), "avx512vnni");
  cpu.features.erase("avx512_vnni");
  EXPECT_EQ(cpu.tier(), "avx2");
  cpu.features.erase("f16c");
  EXPECT_EQ(cpu.tier(), "generic");
}

TEST(CpuFeaturesTest, CapRemovesOnlyHigherTiers) {
  CpuFeatures all = everything();
  EXPECT_EQ(cap_to_tier(all, "amx").features, all.features);

  // Below the AMX tier every AMX feature goes, amx_bf16 (no tier names it) included, and so does
  // what was withheld: a capped process is not a refused one.
  all.withheld["amx_fp16"] = "refused";
  const CpuFeatures vnni = cap_to_tier(all, "avx512vnni");
  EXPECT_EQ(vnni.tier(), "avx512vnni");
  for (const std::string& f : vnni.features) EXPECT_NE(f.rfind("amx", 0), 0u) << f;
  EXPECT_TRUE(vnni.withheld.empty());
  EXPECT_TRUE(vnni.has("avx512_bf16"));

  const CpuFeatures avx2 = cap_to_tier(all, "avx2");
  EXPECT_EQ(avx2.tier(), "avx2");
  for (const std::string& f : avx2.features) EXPECT_NE(f.rfind("avx512", 0), 0u) << f;
  EXPECT_TRUE(avx2.has("bmi2"));

  const CpuFeatures generic = cap_to_tier(all, "generic");
  EXPECT_EQ(generic.tier(), "generic");
  EXPECT_EQ(generic.features, (std::set<std::string>{"sse2", "sse4_1", "sse4_2", "avx", "bmi2"}));
  EXPECT_EQ(generic.arch, "x86_64");
}

TEST(CpuFeaturesTest, CapNeverAdds) {
  CpuFeatures cpu;
  cpu.arch = "x86_64";
  cpu.os = "linux";
  cpu.features = {"sse2"};
  EXPECT_EQ(cap_to_tier(cpu, "avx512vnni").features, cpu.features);
  EXPECT_EQ(cap_to_tier(cpu, "avx512vnni").tier(), "generic");
}

TEST(CpuFeaturesTest, CapToUnknownTierThrows) {
  EXPECT_THROW(cap_to_tier(everything(), "avx10"), InvalidArgument);
}

}  // namespace
}  // namespace frt
