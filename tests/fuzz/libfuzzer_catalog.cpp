// libFuzzer entry point for the catalog loader (optional: -DFRT_LIBFUZZER=ON with clang; README,
// "Fuzzing"). The input replaces one file of a private copy of catalog/: the file whose stem the
// input names on a "name:" line, else the one its size picks. So the repository's *.yaml files
// are seeds for their own slot.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "properties.h"

namespace {

size_t target_file(const frt::fuzz::CatalogSandbox& box, std::string_view text) {
  for (size_t i = 0; i < box.files().size(); ++i) {
    const std::string line = "name: " + box.files()[i].stem().string() + "\n";
    if (text.find(line) != std::string_view::npos) return i;
  }
  return text.size() % box.files().size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const frt::fuzz::CatalogSandbox box(
      FRT_TEST_CATALOG_DIR, std::filesystem::temp_directory_path() /
                                ("frt_libfuzzer_catalog_" + std::to_string(::getpid())));
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const frt::fuzz::Verdict v = box.check(target_file(box, text), text);
  if (!v.violation.empty()) {
    std::fprintf(stderr, "property violated: %s\n", v.violation.c_str());
    std::abort();
  }
  return 0;
}
