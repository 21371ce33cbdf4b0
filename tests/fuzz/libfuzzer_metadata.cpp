// libFuzzer entry point for the metadata.json parser (optional: -DFRT_LIBFUZZER=ON with clang;
// README, "Fuzzing"). Same property as metadata_fuzz_test.cpp; a violation aborts, so libFuzzer
// saves the input.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "properties.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::filesystem::path dir = [] {
    const auto d = std::filesystem::temp_directory_path() /
                   ("frt_libfuzzer_metadata_" + std::to_string(::getpid())) / "flashrt/linear";
    std::filesystem::create_directories(d);
    return d;
  }();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const frt::fuzz::Verdict v = frt::fuzz::check_metadata(text, dir, "flashrt/linear", false);
  if (!v.violation.empty()) {
    std::fprintf(stderr, "property violated: %s\n", v.violation.c_str());
    std::abort();
  }
  return 0;
}
