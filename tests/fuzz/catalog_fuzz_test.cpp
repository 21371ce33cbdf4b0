// Fuzz test of the catalog YAML loader through its public API, Catalog::load(dir). Seeds: every
// *.yaml under the repository's catalog/ (subdirectories included), copied whole into a private
// directory; each input replaces one file, so every file the loader reads is covered, not only
// the structure specs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "fuzz_driver.h"

namespace frt::fuzz {
namespace {

namespace fs = std::filesystem;

TEST(CatalogFuzzTest, EveryInputLoadsOrIsRefusedNamingTheFile) {
  const CatalogSandbox box(
      FRT_TEST_CATALOG_DIR,
      fs::temp_directory_path() / ("frt_fuzz_catalog_" + std::to_string(::getpid())));
  ASSERT_FALSE(box.files().empty()) << "no *.yaml under " << FRT_TEST_CATALOG_DIR;
  const Verdict base = box.check_seeds();
  ASSERT_TRUE(base.parsed) << "the repository's catalog does not load: " << base.error
                           << base.violation;
  std::vector<Seed> seeds;
  for (size_t i = 0; i < box.files().size(); ++i) {
    seeds.push_back({box.files()[i].string(), box.original(i)});
  }
  const Tally t = run_fuzz("catalog-yaml", seeds, Syntax::kYaml, fuzz_inputs(2000),
                           [&](size_t s, const std::string& text) { return box.check(s, text); });
  EXPECT_EQ(t.violations, 0u);
  EXPECT_GT(t.refused, 0u);
  EXPECT_GT(t.parsed, 0u);
}

}  // namespace
}  // namespace frt::fuzz
