// Kernel path tests. Fake packages are built in a fresh temp folder from copies of the real
// variant libraries in FRT_TEST_KERNEL_ROOT; every hub gets an explicit KernelPathConfig so the
// test process environment never leaks in.
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/utf8.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "metadata.h"
#include "sha256.h"

#ifndef FRT_TEST_KERNEL_ROOT
#error "FRT_TEST_KERNEL_ROOT must name the build tree's bundled kernel root"
#endif
#ifndef FRT_TEST_ABI99_LIB
#error "FRT_TEST_ABI99_LIB must name the ABI 99 fixture library"
#endif

namespace frt {
namespace {

namespace fs = std::filesystem;

constexpr const char* kRevision = "3f2a9c1b7d0e";

class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("frt_hub_test_" + std::to_string(::getpid()) + "_" +
                                         std::to_string(counter++) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A bundled package's variant as its own metadata describes it (empty if it has none).
detail::VariantMetadata bundled_variant(const std::string& pkg, const std::string& isa) {
  const detail::PackageMetadata md =
      detail::read_metadata(fs::path(FRT_TEST_KERNEL_ROOT) / "flashrt" / pkg, "flashrt/" + pkg);
  for (const auto& v : md.variants) {
    if (v.isa == isa) return v;
  }
  ADD_FAILURE() << "no " << isa << " variant in bundled flashrt/" << pkg;
  return {};
}

// The real variant library of a bundled package.
fs::path real_library(const std::string& pkg, const std::string& isa) {
  return bundled_variant(pkg, isa).library_path;
}

struct FakeVariant {
  std::string name;  // "cpu-<arch>-<os>-<isa>"
  std::vector<std::string> requires_features;
  fs::path copy_from;                 // empty: no file is written
  std::optional<std::string> sha256;  // default: the digest of copy_from
  std::string library;                // default: build/<name>/libfrt_test.so
};

FakeVariant real_variant(const std::string& isa, const std::string& pkg = "linear") {
  const std::set<std::string> needs = tier_features(isa);
  return {"cpu-x86_64-linux-" + isa,
          {needs.begin(), needs.end()},
          real_library(pkg, isa),
          std::nullopt,
          ""};
}

void write_file(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// Writes <dir>/metadata.json for `name` and copies each variant's library into place.
void write_package(const fs::path& dir, const std::string& name, const std::string& revision,
                   const std::vector<FakeVariant>& variants, int abi_major = FRT_KERNEL_ABI_MAJOR) {
  nlohmann::json vs = nlohmann::json::array();
  for (const FakeVariant& v : variants) {
    const detail::VariantName parsed = detail::parse_variant_name(v.name);
    const std::string library =
        v.library.empty() ? "build/" + v.name + "/libfrt_test.so" : v.library;
    std::string sha = v.sha256.value_or(std::string(64, '0'));
    if (!v.copy_from.empty()) {
      fs::create_directories((dir / library).parent_path());
      fs::copy_file(v.copy_from, dir / library, fs::copy_options::overwrite_existing);
      if (!v.sha256) sha = *detail::sha256_file_hex(v.copy_from);
    }
    vs.push_back({{"name", v.name},
                  {"arch", parsed.arch},
                  {"os", parsed.os},
                  {"isa", parsed.isa},
                  {"requires", v.requires_features},
                  {"library", library},
                  {"sha256", sha}});
  }
  const nlohmann::json md = {{"name", name},           {"version", "2.0.0"}, {"revision", revision},
                             {"abi_major", abi_major}, {"abi_minor", 0},     {"variants", vs}};
  write_file(dir / "metadata.json", md.dump(2));
}

KernelPathConfig roots(std::vector<fs::path> dirs) {
  KernelPathConfig c;
  for (const fs::path& d : dirs) c.roots.push_back(d.string());
  return c;
}

std::string report_text(const KernelHub& hub) {
  std::string out;
  for (const UnavailableEntry& e : hub.unavailable_report()) {
    out += e.repo + " [" + e.version + "] " + e.error + " | " + e.detail + "\n";
  }
  return out.empty() ? "(empty report)" : out;
}

// True when some report row names `text` in its error or detail.
bool report_mentions(const KernelHub& hub, const std::string& text) {
  for (const UnavailableEntry& e : hub.unavailable_report()) {
    if (e.error.find(text) != std::string::npos || e.detail.find(text) != std::string::npos) {
      return true;
    }
  }
  return false;
}

const VariantDecision* decision(const PackageResolution& r, const std::string& isa) {
  for (const VariantDecision& d : r.variants) {
    if (d.isa == isa) return &d;
  }
  return nullptr;
}

// (1)
TEST(HubTest, BundledPackagesChooseTheCpuTier) {
  KernelPathConfig c;
  c.bundled_root = FRT_TEST_KERNEL_ROOT;
  KernelHub hub(c);
  const std::string cpu_tier = hub.cpu().tier();
  // Each package lists exactly the ops it owns.
  const std::map<std::string, std::vector<OpKind>> owns = {
      {"flashrt/linear", {OpKind::linear}},
      {"flashrt/ffn", {OpKind::gated_ffn, OpKind::ffn, OpKind::moe_ffn}},
      {"flashrt/decode",
       {OpKind::rmsnorm, OpKind::rotary, OpKind::attention, OpKind::dense, OpKind::capped_attention,
        OpKind::gated_act, OpKind::paged_attention, OpKind::cache_attention}},
      {"flashrt/gemm", {OpKind::linear, OpKind::ffn, OpKind::moe_ffn, OpKind::sequence_attention}},
      {"flashrt/recurrent", {OpKind::gated_delta, OpKind::causal_conv1d}}};
  for (const std::string repo :
       {"flashrt/linear", "flashrt/ffn", "flashrt/decode", "flashrt/gemm", "flashrt/recurrent"}) {
    // flashrt/gemm, linear and ffn have tile code: on an AMX CPU the others serve their
    // avx512vnni build (and so do these where the CPU lacks AVX512-BF16 or AMX-BF16, which their
    // amx builds need).
    const bool tiles =
        (repo == "flashrt/gemm" || repo == "flashrt/linear" || repo == "flashrt/ffn") &&
        hub.cpu().has("avx512_bf16") && hub.cpu().has("amx_bf16");
    const std::string tier = cpu_tier == "amx" && !tiles ? "avx512vnni" : cpu_tier;
    const PackageResolution& r = hub.resolve(repo);
    ASSERT_NE(r.table, nullptr) << report_text(hub);
    EXPECT_EQ(r.source, "bundled");
    EXPECT_EQ(r.chosen, "cpu-x86_64-linux-" + tier);
    EXPECT_EQ(std::string(r.table->isa), tier);
    EXPECT_EQ(std::string(r.table->package), repo);
    EXPECT_EQ(r.table->abi_major, FRT_KERNEL_ABI_MAJOR);
    EXPECT_EQ(&hub.table(repo), r.table);
    EXPECT_EQ(r.table->n_ops, static_cast<int32_t>(owns.at(repo).size())) << repo;
    for (OpKind kind : owns.at(repo)) EXPECT_NE(find_op(*r.table, kind), nullptr) << repo;
    // The chosen variant names the digest of the library it loaded (receipts record it).
    const VariantDecision* chosen = decision(r, tier);
    ASSERT_NE(chosen, nullptr);
    EXPECT_EQ(detail::sha256_file_hex(chosen->library).value_or(""), chosen->sha256) << repo;
    if (tier == "avx2") {
      EXPECT_EQ(decision(r, "generic")->reason, "not tried: cpu-x86_64-linux-avx2 chosen");
    }
  }
  // Nothing unavailable; a better build withheld (Linux refusing AMX's tile data) is its reason.
  for (const UnavailableEntry& e : hub.unavailable_report())
    EXPECT_EQ(e.error.rfind("build variant withheld: ", 0), 0u) << report_text(hub);
  EXPECT_EQ(hub.visible_packages(),
            (std::vector<std::string>{"flashrt/decode", "flashrt/ffn", "flashrt/gemm",
                                      "flashrt/linear", "flashrt/recurrent"}));
}

// (2)
TEST(HubTest, RefusesVariantNeedingAMissingFeature) {
  TempDir tmp;
  write_package(tmp.path() / "flashrt/linear", "flashrt/linear", kRevision,
                {{"cpu-x86_64-linux-avx2",
                  {"avx2", "fma", "f16c"},
                  real_library("linear", "avx2"),
                  std::nullopt,
                  ""}});
  KernelHub hub(roots({tmp.path()}), cap_to_tier(detect_cpu(), "generic"));
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);
  EXPECT_TRUE(report_mentions(hub, "no build variant for this host")) << report_text(hub);
  EXPECT_TRUE(
      report_mentions(hub, "cpu-x86_64-linux-avx2: variant needs avx2, this CPU has generic"))
      << report_text(hub);
}

// flashrt/gemm resolved from a package of its amx and generic builds where the amx one is
// refused: generic serves, and the amx build's reason (empty, with a failure, if anything else).
std::string amx_refusal_with_generic_serving(KernelHub& hub) {
  const PackageResolution& r = hub.resolve("flashrt/gemm");
  EXPECT_NE(r.table, nullptr) << report_text(hub);
  EXPECT_EQ(r.chosen, "cpu-x86_64-linux-generic");
  const VariantDecision* amx = decision(r, "amx");
  EXPECT_NE(amx, nullptr);
  return amx != nullptr ? amx->reason : "";
}

// A build the CPU could run but the process was refused (Linux withholding AMX's tile data) is
// refused with that reason, a lesser build serves, and the report says so.
TEST(HubTest, AWithheldFeatureRefusesItsBuildByReasonAndALesserOneServes) {
  TempDir tmp;
  write_package(tmp.path() / "flashrt/gemm", "flashrt/gemm", kRevision,
                {{"cpu-x86_64-linux-amx",
                  {"amx_tile", "amx_int8", "avx2", "fma", "f16c"},
                  real_library("gemm", "amx"),
                  std::nullopt,
                  ""},
                 real_variant("generic", "gemm")});
  CpuFeatures cpu = cap_to_tier(detect_cpu(), "generic");
  cpu.withheld["amx_tile"] = "Linux refused the AMX tile state: Operation not permitted";
  KernelHub hub(roots({tmp.path()}), cpu);
  EXPECT_EQ(amx_refusal_with_generic_serving(hub),
            "variant needs amx_tile, which this CPU has but this process may not use: Linux "
            "refused the AMX tile state: Operation not permitted");
  EXPECT_TRUE(report_mentions(hub, "build variant withheld: cpu-x86_64-linux-amx"))
      << report_text(hub);
  EXPECT_TRUE(report_mentions(hub, "cpu-x86_64-linux-generic serves instead")) << report_text(hub);
  // A CPU without the feature at all is no news: nothing is reported.
  KernelHub plain(roots({tmp.path()}), cap_to_tier(detect_cpu(), "generic"));
  EXPECT_NE(plain.resolve("flashrt/gemm").table, nullptr);
  EXPECT_TRUE(plain.unavailable_report().empty()) << report_text(plain);
}

// The bundled amx build needs AVX512-BF16 and AMX-BF16 beside the amx tier's features (its bf16
// stores and the weight-only panels' bf16 tiles, which the tier does not name): a CPU of the amx
// tier without either (a guest may mask the bit) is refused that build by name, and a lesser one
// serves. Metadata decides, so this runs on any machine.
TEST(HubTest, TheAmxBuildNeedsTheBf16FeaturesBesideTheAmxTier) {
  const std::vector<std::string> needs = bundled_variant("gemm", "amx").requires_features;
  for (const char* f : {"amx_bf16", "avx512_bf16"}) {
    ASSERT_NE(std::find(needs.begin(), needs.end(), f), needs.end()) << f;
    TempDir tmp;
    write_package(tmp.path() / "flashrt/gemm", "flashrt/gemm", kRevision,
                  {{"cpu-x86_64-linux-amx", needs, real_library("gemm", "amx"), std::nullopt, ""},
                   real_variant("generic", "gemm")});
    CpuFeatures cpu = cap_to_tier(detect_cpu(), "generic");
    for (const std::string& g : tier_features("amx")) cpu.features.insert(g);
    cpu.features.insert("amx_bf16");
    cpu.features.insert("avx512_bf16");
    cpu.features.erase(f);
    ASSERT_EQ(cpu.tier(), "amx");
    KernelHub hub(roots({tmp.path()}), cpu);
    EXPECT_EQ(amx_refusal_with_generic_serving(hub),
              std::string("variant needs ") + f + ", this CPU has amx");
  }
}

TEST(HubTest, RealAvx512VariantRefusedOnAvx2Cpu) {
  if (detect_cpu().tier() != "avx2") GTEST_SKIP() << "needs an AVX2 (not AVX-512) CPU";
  TempDir tmp;
  write_package(tmp.path() / "flashrt/linear", "flashrt/linear", kRevision,
                {real_variant("avx512vnni")});
  KernelHub hub(roots({tmp.path()}));
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);
  // The message names the first missing feature in the order metadata lists them.
  EXPECT_TRUE(report_mentions(hub, "cpu-x86_64-linux-avx512vnni: variant needs avx512"))
      << report_text(hub);
  EXPECT_TRUE(report_mentions(hub, ", this CPU has avx2")) << report_text(hub);

  // The bundled package says the same about its own avx512vnni build.
  KernelPathConfig c;
  c.bundled_root = FRT_TEST_KERNEL_ROOT;
  KernelHub bundled(c);
  const VariantDecision* d = decision(bundled.resolve("flashrt/linear"), "avx512vnni");
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->reason.rfind("variant needs avx512", 0), 0u) << d->reason;
  EXPECT_NE(d->reason.find(", this CPU has avx2"), std::string::npos) << d->reason;
}

// (3)
TEST(HubTest, RefusesOtherArchitectureAndOs) {
  TempDir tmp;
  write_package(
      tmp.path() / "flashrt/linear", "flashrt/linear", kRevision,
      {{"cpu-aarch64-linux-neon", {}, real_library("linear", "generic"), std::nullopt, ""},
       {"cpu-x86_64-windows-avx2", {}, real_library("linear", "avx2"), std::nullopt, ""}});
  KernelHub hub(roots({tmp.path()}));
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);
  EXPECT_TRUE(report_mentions(
      hub, "cpu-aarch64-linux-neon: CPU (aarch64) does not match system CPU (x86_64)"))
      << report_text(hub);
  EXPECT_TRUE(report_mentions(
      hub, "cpu-x86_64-windows-avx2: OS (windows) does not match system OS (linux)"))
      << report_text(hub);
}

// (4)
TEST(HubTest, CorruptMetadataIsReportedWithoutFallThrough) {
  TempDir tmp;
  const fs::path truncated = tmp.path() / "a", wrong_type = tmp.path() / "b",
                 misnamed = tmp.path() / "c";
  write_package(truncated / "flashrt/linear", "flashrt/linear", kRevision,
                {real_variant("generic")});
  {
    std::ifstream in(truncated / "flashrt/linear/metadata.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    write_file(truncated / "flashrt/linear/metadata.json", text.substr(0, text.size() / 2));
  }
  write_file(wrong_type / "flashrt/linear/metadata.json",
             R"({"name": "flashrt/linear", "version": "2.0.0", "revision": "r", "abi_major": 2,
                 "abi_minor": 0, "variants": {"cpu-x86_64-linux-generic": {}}})");
  write_package(misnamed / "flashrt/linear", "flashrt/ffn", kRevision, {real_variant("generic")});

  struct Case {
    fs::path root;
    std::string says;
  };
  for (const Case& c :
       {Case{truncated, "invalid JSON"},
        Case{wrong_type, "field 'variants' must be an array, got object"},
        Case{misnamed,
             "field 'name' is 'flashrt/ffn' but the package sits where 'flashrt/linear' "
             "belongs"}}) {
    // The bundled root has a good copy; a broken first copy must still win.
    KernelPathConfig config = roots({c.root});
    config.bundled_root = FRT_TEST_KERNEL_ROOT;
    KernelHub hub(config);
    const PackageResolution& r = hub.resolve("flashrt/linear");
    EXPECT_EQ(r.table, nullptr) << c.says;
    EXPECT_EQ(r.source, "FLASHRT_KERNEL_PATH");
    EXPECT_TRUE(report_mentions(hub, "corrupt metadata")) << report_text(hub);
    EXPECT_TRUE(report_mentions(hub, c.says)) << report_text(hub);
    EXPECT_TRUE(report_mentions(hub, (c.root / "flashrt/linear/metadata.json").string()))
        << report_text(hub);
  }
}

// Issue 13: metadata.json holding bytes that are not UTF-8, in a folder whose name is not UTF-8
// either. The refusal is recorded with the bytes escaped, so it reaches Python as a str.
TEST(HubTest, BytesThatAreNotUtf8AreEscapedInTheReport) {
  TempDir tmp;
  const fs::path pkg = tmp.path() / "pkg\xff";
  write_package(pkg, "flashrt/linear", kRevision, {real_variant("generic")});
  std::string text;
  {
    std::ifstream in(pkg / "metadata.json");
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  text.replace(text.find("2.0.0"), 5, "2.0\xff");
  write_file(pkg / "metadata.json", text);

  KernelPathConfig config;
  config.local_kernels = {{"flashrt/linear", pkg.string()}};
  config.bundled_root = FRT_TEST_KERNEL_ROOT;
  KernelHub hub(config);
  const PackageResolution& r = hub.resolve("flashrt/linear");
  EXPECT_EQ(r.table, nullptr);
  EXPECT_TRUE(is_valid_utf8(r.dir)) << escape_invalid_utf8(r.dir);
  const std::vector<UnavailableEntry> report = hub.unavailable_report();
  ASSERT_EQ(report.size(), 1u) << report_text(hub);
  const UnavailableEntry& e = report[0];
  EXPECT_EQ(e.error, "corrupt metadata");
  for (const std::string& s : {e.repo, e.version, e.error, e.detail}) {
    EXPECT_TRUE(is_valid_utf8(s)) << escape_invalid_utf8(s);
  }
  // Verbatim but escaped: the folder and the offending byte are both there.
  EXPECT_NE(e.detail.find("pkg\\xff/metadata.json: invalid JSON"), std::string::npos) << e.detail;
  EXPECT_NE(e.detail.find("ill-formed UTF-8 byte"), std::string::npos) << e.detail;
  EXPECT_NE(e.detail.find("\\xff'"), std::string::npos) << e.detail;
  try {
    hub.table("flashrt/linear");
    FAIL() << "no KernelUnavailable";
  } catch (const KernelUnavailable& k) {
    EXPECT_TRUE(is_valid_utf8(k.what())) << escape_invalid_utf8(k.what());
  }
  // The other package still serves from the bundled root.
  EXPECT_NE(hub.resolve("flashrt/ffn").table, nullptr) << report_text(hub);
}

// A package folder named with bytes that are not UTF-8 is listed escaped.
TEST(HubTest, VisiblePackagesAreValidUtf8) {
  TempDir tmp;
  write_package(tmp.path() / "org\xfe" / "pkg", "org/pkg", kRevision, {real_variant("generic")});
  KernelHub hub(roots({tmp.path()}));
  EXPECT_EQ(hub.visible_packages(), std::vector<std::string>{"org\\xfe/pkg"});
}

// (5)
TEST(HubTest, MissingLibraryFile) {
  TempDir tmp;
  FakeVariant v = real_variant("generic");
  v.copy_from.clear();
  v.sha256 = *detail::sha256_file_hex(real_library("linear", "generic"));
  write_package(tmp.path() / "flashrt/linear", "flashrt/linear", kRevision, {v});
  KernelHub hub(roots({tmp.path()}));
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);
  const fs::path expected =
      tmp.path() / "flashrt/linear/build/cpu-x86_64-linux-generic" / "libfrt_test.so";
  EXPECT_TRUE(report_mentions(hub, "library file missing: " + expected.string()))
      << report_text(hub);
}

// (6)
TEST(HubTest, DigestMismatch) {
  TempDir tmp;
  const FakeVariant v = real_variant("generic");
  const fs::path pkg = tmp.path() / "flashrt/linear";
  write_package(pkg, "flashrt/linear", kRevision, {v});
  const fs::path lib = pkg / "build/cpu-x86_64-linux-generic/libfrt_test.so";
  {
    std::fstream f(lib, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(100);
    const char c = static_cast<char>(f.get());
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x5a));
  }
  const std::string meta_sha = *detail::sha256_file_hex(v.copy_from);
  const std::string file_sha = *detail::sha256_file_hex(lib);
  KernelHub hub(roots({tmp.path()}));
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);
  EXPECT_TRUE(report_mentions(
      hub, "library digest mismatch: metadata sha256 " + meta_sha + ", file " + file_sha))
      << report_text(hub);
}

// (7)
const std::string kAbi = std::to_string(FRT_KERNEL_ABI_MAJOR);

TEST(HubTest, AbiMismatchInMetadata) {
  TempDir tmp;
  write_package(tmp.path() / "flashrt/linear", "flashrt/linear", kRevision,
                {real_variant("generic")}, /*abi_major=*/1);
  KernelHub hub(roots({tmp.path()}));
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);
  EXPECT_TRUE(
      report_mentions(hub, "cpu-x86_64-linux-generic: ABI version 1, loader speaks " + kAbi))
      << report_text(hub);
}

TEST(HubTest, AbiMismatchInLibrary) {
  TempDir tmp;
  write_package(tmp.path() / "flashrt/linear", "flashrt/linear", kRevision,
                {{"cpu-x86_64-linux-generic", {}, FRT_TEST_ABI99_LIB, std::nullopt, ""}});
  KernelHub hub(roots({tmp.path()}));
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);
  EXPECT_TRUE(
      report_mentions(hub, "cpu-x86_64-linux-generic: ABI version 99, loader speaks " + kAbi))
      << report_text(hub);

  std::string why;
  EXPECT_EQ(open_variant_library(FRT_TEST_ABI99_LIB, &why), nullptr);
  EXPECT_EQ(why, "ABI version 99, loader speaks " + kAbi);
  const frt_kernel_table* t = open_variant_library(real_library("linear", "generic"), &why);
  ASSERT_NE(t, nullptr) << why;
  EXPECT_EQ(std::string(t->isa), "generic");
  EXPECT_EQ(open_variant_library((tmp.path() / "nope.so").string(), &why), nullptr);
  EXPECT_EQ(why, "library file missing: " + (tmp.path() / "nope.so").string());
}

TEST(HubTest, AnOpListWithoutARunFunctionIsRefusedByName) {
  TempDir tmp;
  write_package(tmp.path() / "flashrt/linear", "flashrt/linear", kRevision,
                {{"cpu-x86_64-linux-generic", {}, FRT_TEST_BAD_OPS_LIB, std::nullopt, ""}});
  KernelHub hub(roots({tmp.path()}));
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);
  EXPECT_TRUE(report_mentions(hub, "op 0 (kind 1) lacks supports, run or phases"))
      << report_text(hub);
}

// (8)
TEST(HubTest, PinToAbsentRevision) {
  TempDir tmp;
  write_package(tmp.path() / "flashrt/linear", "flashrt/linear", kRevision,
                {real_variant("generic")});
  KernelPathConfig c = roots({tmp.path()});
  c.pins["flashrt/linear"] = "deadbeef";
  KernelHub hub(c);
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);
  EXPECT_TRUE(report_mentions(hub, "pinned revision not found")) << report_text(hub);
  EXPECT_TRUE(report_mentions(
      hub, "FRT_KERNEL_REV_FLASHRT_LINEAR=deadbeef; found revisions: " + std::string(kRevision) +
               " (" + (tmp.path() / "flashrt/linear").string() + ")"))
      << report_text(hub);
}

TEST(HubTest, PinSelectsTheSecondRoot) {
  TempDir tmp;
  const fs::path first = tmp.path() / "first", second = tmp.path() / "second";
  write_package(first / "flashrt/linear", "flashrt/linear", "aaaa1111", {real_variant("generic")});
  write_package(second / "flashrt/linear", "flashrt/linear", "bbbb2222", {real_variant("generic")});
  KernelPathConfig by_repo = roots({first, second});
  by_repo.pins["flashrt/linear"] = "bbbb2222";
  KernelPathConfig by_variable = roots({first, second});
  by_variable.pin_variables["FRT_KERNEL_REV_FLASHRT_LINEAR"] = "bbbb2222";
  for (const KernelPathConfig& c : {by_repo, by_variable}) {
    KernelHub hub(c);
    const PackageResolution& r = hub.resolve("flashrt/linear");
    ASSERT_NE(r.table, nullptr) << report_text(hub);
    EXPECT_EQ(r.source, "pin");
    EXPECT_EQ(r.revision, "bbbb2222");
    EXPECT_EQ(r.dir, (second / "flashrt/linear").string());
    EXPECT_TRUE(hub.unavailable_report().empty()) << report_text(hub);
  }
}

// (9)
TEST(HubTest, PackageNotFound) {
  TempDir tmp;
  KernelPathConfig c = roots({tmp.path()});
  c.bundled_root = FRT_TEST_KERNEL_ROOT;
  KernelHub hub(c);
  EXPECT_EQ(hub.resolve("flashrt/nothing").table, nullptr);
  EXPECT_TRUE(report_mentions(hub, "package 'flashrt/nothing' not found on the kernel path"))
      << report_text(hub);
  EXPECT_TRUE(
      report_mentions(hub, "FLASHRT_KERNEL_PATH " + (tmp.path() / "flashrt/nothing").string()))
      << report_text(hub);
  try {
    hub.table("flashrt/nothing");
    FAIL() << "table() did not throw";
  } catch (const KernelUnavailable& e) {
    EXPECT_EQ(std::string(e.what()).rfind(
                  "flashrt/nothing: package 'flashrt/nothing' not found on the kernel path: ", 0),
              0u)
        << e.what();
  }
}

// (10)
TEST(HubTest, LocalKernelsThenKernelPathThenBundled) {
  TempDir tmp;
  const fs::path staged = tmp.path() / "staged", path_root = tmp.path() / "path",
                 bundled = tmp.path() / "bundled";
  write_package(staged, "flashrt/linear", "local1", {real_variant("generic")});
  write_package(path_root / "flashrt/linear", "flashrt/linear", "path1", {real_variant("generic")});
  write_package(bundled / "flashrt/linear", "flashrt/linear", "bund1", {real_variant("generic")});

  KernelPathConfig all = roots({tmp.path() / "empty", path_root});
  all.bundled_root = bundled.string();
  all.local_kernels.emplace_back("flashrt/ffn", (tmp.path() / "elsewhere").string());
  all.local_kernels.emplace_back("flashrt/linear", staged.string());
  KernelPathConfig no_local = all;
  no_local.local_kernels.clear();
  KernelPathConfig only_bundled = no_local;
  only_bundled.roots.clear();

  struct Case {
    const KernelPathConfig* config;
    const char* source;
    const char* revision;
  };
  for (const Case& c :
       {Case{&all, "LOCAL_KERNELS", "local1"}, Case{&no_local, "FLASHRT_KERNEL_PATH", "path1"},
        Case{&only_bundled, "bundled", "bund1"}}) {
    KernelHub hub(*c.config);
    const PackageResolution& r = hub.resolve("flashrt/linear");
    ASSERT_NE(r.table, nullptr) << report_text(hub);
    EXPECT_EQ(r.source, c.source);
    EXPECT_EQ(r.revision, c.revision);
  }
  KernelHub hub(all);
  EXPECT_EQ(hub.visible_packages(), (std::vector<std::string>{"flashrt/linear"}));
}

// (11)
TEST(HubTest, CpuCapPicksGeneric) {
  KernelPathConfig c;
  c.bundled_root = FRT_TEST_KERNEL_ROOT;
  KernelHub hub(c, cap_to_tier(detect_cpu(), "generic"));
  const PackageResolution& r = hub.resolve("flashrt/linear");
  ASSERT_NE(r.table, nullptr) << report_text(hub);
  EXPECT_EQ(r.chosen, "cpu-x86_64-linux-generic");
  EXPECT_EQ(std::string(r.table->isa), "generic");
  EXPECT_NE(decision(r, "avx2")->reason.find("this CPU has generic"), std::string::npos)
      << decision(r, "avx2")->reason;
}

// (12)
TEST(HubTest, NotASharedLibrary) {
  TempDir tmp;
  const fs::path junk = tmp.path() / "junk.so";
  write_file(junk, "this is not an ELF file\n");
  write_package(tmp.path() / "flashrt/linear", "flashrt/linear", kRevision,
                {{"cpu-x86_64-linux-generic", {}, junk, std::nullopt, ""}});
  KernelHub hub(roots({tmp.path()}));
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);
  EXPECT_TRUE(report_mentions(hub, "cpu-x86_64-linux-generic: dlopen failed: "))
      << report_text(hub);
}

// A failing best variant falls back to the next one, and the report stays empty.
TEST(HubTest, FallsBackPastABrokenBetterVariant) {
  if (detect_cpu().tier() == "generic") GTEST_SKIP() << "needs a CPU above generic";
  TempDir tmp;
  FakeVariant avx2 = real_variant("avx2");
  avx2.sha256 = std::string(64, 'f');
  write_package(tmp.path() / "flashrt/linear", "flashrt/linear", kRevision,
                {real_variant("generic"), avx2});
  KernelHub hub(roots({tmp.path()}), cap_to_tier(detect_cpu(), "avx2"));
  const PackageResolution& r = hub.resolve("flashrt/linear");
  ASSERT_NE(r.table, nullptr) << report_text(hub);
  EXPECT_EQ(r.chosen, "cpu-x86_64-linux-generic");
  EXPECT_EQ(decision(r, "avx2")->reason.rfind("library digest mismatch: metadata sha256 ffff", 0),
            0u);
  EXPECT_TRUE(hub.unavailable_report().empty()) << report_text(hub);
}

// (13)
TEST(HubTest, ReportIsDeduplicatedAndClearRetries) {
  TempDir tmp;
  KernelHub hub(roots({tmp.path()}));
  const PackageResolution& before = hub.resolve("flashrt/linear");
  hub.resolve("flashrt/linear");
  EXPECT_THROW(hub.table("flashrt/linear"), KernelUnavailable);
  hub.resolve("flashrt/ffn");
  ASSERT_EQ(hub.unavailable_report().size(), 2u) << report_text(hub);
  EXPECT_TRUE(report_mentions(hub, "package 'flashrt/linear' not found")) << report_text(hub);

  write_package(tmp.path() / "flashrt/linear", "flashrt/linear", kRevision,
                {real_variant("generic")});
  EXPECT_EQ(hub.resolve("flashrt/linear").table, nullptr);  // cached until cleared
  hub.clear_unavailable_report();
  EXPECT_TRUE(hub.unavailable_report().empty());
  EXPECT_EQ(before.repo, "flashrt/linear");  // an old reference stays readable
  const PackageResolution& after = hub.resolve("flashrt/linear");
  ASSERT_NE(after.table, nullptr) << report_text(hub);
  EXPECT_EQ(after.source, "FLASHRT_KERNEL_PATH");
  EXPECT_TRUE(hub.unavailable_report().empty()) << report_text(hub);
  EXPECT_EQ(hub.resolutions().size(), 1u);
}

// (14)
TEST(HubTest, FromEnvParsesLists) {
  const std::map<std::string, std::string> env = {
      {"LOCAL_KERNELS", "::flashrt/linear=/stage/lin::flashrt/ffn=/stage/ffn:"},
      {"FLASHRT_KERNEL_PATH", ":/r1::/r2:"},
      {"FRT_KERNEL_REV_FLASHRT_LINEAR", "abc123"},
      {"FRT_KERNEL_REV_FLASHRT_FFN", ""}};
  const auto fake = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  const KernelPathConfig c =
      KernelPathConfig::from_env("/bundled", {"flashrt/linear", "flashrt/ffn"}, fake);
  EXPECT_EQ(c.bundled_root, "/bundled");
  EXPECT_EQ(c.local_kernels, (std::vector<std::pair<std::string, std::string>>{
                                 {"flashrt/linear", "/stage/lin"}, {"flashrt/ffn", "/stage/ffn"}}));
  EXPECT_EQ(c.roots, (std::vector<std::string>{"/r1", "/r2"}));
  EXPECT_EQ(c.pins, (std::map<std::string, std::string>{{"flashrt/linear", "abc123"}}));

  const KernelPathConfig empty =
      KernelPathConfig::from_env("", {}, [](const char*) -> const char* { return nullptr; });
  EXPECT_TRUE(empty.local_kernels.empty());
  EXPECT_TRUE(empty.roots.empty());
  EXPECT_TRUE(empty.pins.empty());

  const auto bad = [](const char* name) -> const char* {
    return std::string(name) == "LOCAL_KERNELS" ? "flashrt/linear" : nullptr;
  };
  EXPECT_THROW(KernelPathConfig::from_env("", {}, bad), InvalidArgument);

  EXPECT_EQ(pin_variable("flashrt/linear"), "FRT_KERNEL_REV_FLASHRT_LINEAR");
  EXPECT_EQ(pin_variable("my-org/x.y2"), "FRT_KERNEL_REV_MY_ORG_X_Y2");
}

// Pins for repos from_env was not told about: the name comes from the process environment, the
// value from the getenv it was given.
TEST(HubTest, FromEnvFindsPinsForUnlistedRepos) {
  constexpr const char* kVar = "FRT_KERNEL_REV_FRT_HUB_TEST_ENVSCAN";
  ASSERT_EQ(::setenv(kVar, "from-real-env", 1), 0);
  const auto fake = [&](const char* name) -> const char* {
    return std::string(name) == kVar ? "r9" : nullptr;
  };
  const KernelPathConfig c = KernelPathConfig::from_env("", {"flashrt/linear"}, fake);
  ::unsetenv(kVar);
  EXPECT_EQ(c.pin_variables.count(kVar), 1u);
  EXPECT_EQ(c.pin_variables.at(kVar), "r9");
  EXPECT_EQ(pin_variable("frt_hub_test/envscan"), kVar);
}

// (15)
TEST(HubTest, ConcurrentResolveGivesOneResolution) {
  KernelPathConfig c;
  c.bundled_root = FRT_TEST_KERNEL_ROOT;
  KernelHub hub(c);
  std::vector<const PackageResolution*> seen(4, nullptr), missing(4, nullptr);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      seen[i] = &hub.resolve("flashrt/linear");
      missing[i] = &hub.resolve("flashrt/nothing");
    });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(seen[i], seen[0]);
    EXPECT_EQ(missing[i], missing[0]);
  }
  EXPECT_NE(seen[0]->table, nullptr) << report_text(hub);
  EXPECT_EQ(hub.resolutions().size(), 2u);
  EXPECT_EQ(hub.unavailable_report().size(), 1u) << report_text(hub);
}

TEST(HubTest, InvalidRepoNameIsRecordedNotThrown) {
  KernelHub hub(KernelPathConfig{});
  EXPECT_EQ(hub.resolve("../etc").table, nullptr);
  EXPECT_TRUE(report_mentions(hub, "invalid package name '../etc'")) << report_text(hub);
}

TEST(HubTest, ProcessHubKeepsItsBundledRoot) {
  // Other tests in this binary may create the process hub first; they use the same root.
  try {
    set_bundled_root(FRT_TEST_KERNEL_ROOT);
  } catch (const InvalidArgument&) {
  }
  KernelHub& hub = process_hub();
  EXPECT_EQ(&hub, &process_hub());
  EXPECT_THROW(set_bundled_root(hub.config().bundled_root + "/other"), InvalidArgument);
  EXPECT_NO_THROW(set_bundled_root(hub.config().bundled_root));
}

}  // namespace
}  // namespace frt
