// Fuzz test of the kernel package metadata.json parser (core/src/hub/metadata.cpp). Seeds: the
// metadata the build wrote for every bundled package, plus one written here so the test stands
// without them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_driver.h"

namespace frt::fuzz {
namespace {

namespace fs = std::filesystem;

constexpr const char* kEmbeddedSeed = R"({
  "name": "flashrt/linear",
  "version": "1.0.0",
  "revision": "3f2a9c1b7d0e",
  "abi_major": 1,
  "abi_minor": 1,
  "variants": [
    {"name": "cpu-x86_64-linux-generic", "arch": "x86_64", "os": "linux", "isa": "generic",
     "requires": [], "library": "build/cpu-x86_64-linux-generic/libfrt_linear.so",
     "sha256": "94a58cec187e0d420a71cb9728f96c184708588f56fc3cc7db1de366b36122ab"},
    {"name": "cpu-x86_64-linux-avx2", "arch": "x86_64", "os": "linux", "isa": "avx2",
     "requires": ["avx2", "fma", "f16c"], "library": "build/cpu-x86_64-linux-avx2/libfrt_linear.so",
     "sha256": "b3157217d2960bbd9e1e2f171cf5d8cb043e14377a55dd8670335a4d82403a29"}
  ]
}
)";

struct MetadataSeed {
  Seed seed;
  std::string repo;  // "<org>/<pkg>": where the package sits
};

std::vector<MetadataSeed> seeds() {
  std::vector<MetadataSeed> out = {{{"(embedded)", kEmbeddedSeed}, "flashrt/linear"}};
  std::error_code ec;
  for (fs::recursive_directory_iterator it(FRT_TEST_KERNEL_ROOT, ec), end; !ec && it != end;
       it.increment(ec)) {
    if (it->path().filename() != "metadata.json") continue;
    const fs::path pkg = it->path().parent_path();
    const std::string repo = pkg.parent_path().filename().string() + "/" + pkg.filename().string();
    out.push_back({{it->path().string(), read_file(it->path())}, repo});
  }
  return out;
}

TEST(MetadataFuzzTest, EveryInputParsesOrIsRefusedNamingTheFile) {
  const std::vector<MetadataSeed> all = seeds();
  const fs::path work =
      fs::temp_directory_path() / ("frt_fuzz_metadata_" + std::to_string(::getpid()));
  std::vector<Seed> texts;
  std::vector<fs::path> dirs;
  for (const MetadataSeed& s : all) {
    texts.push_back(s.seed);
    dirs.push_back(work / s.repo);
    fs::create_directories(dirs.back());
    // The harness must start from input the parser accepts, or it would test nothing.
    const Verdict v = check_metadata(s.seed.text, dirs.back(), s.repo, false);
    ASSERT_TRUE(v.parsed) << s.seed.name << ": " << v.error << v.violation;
  }
  size_t next = 0;
  const Tally t = run_fuzz("metadata.json", texts, Syntax::kJson, fuzz_inputs(4000),
                           [&](size_t s, const std::string& text) {
                             // Every eighth input goes through the file, as the hub reads it.
                             const bool via_file = next++ % 8 == 0;
                             return check_metadata(text, dirs[s], all[s].repo, via_file);
                           });
  fs::remove_all(work);
  EXPECT_EQ(t.violations, 0u);
  // Both outcomes occur: the mutations break the input and also get past the lexer.
  EXPECT_GT(t.refused, 0u);
  EXPECT_GT(t.parsed, 0u);
}

}  // namespace
}  // namespace frt::fuzz
