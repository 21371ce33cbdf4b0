// A kernel package's metadata.json, parsed once into typed records (STYLE (f): no string
// plumbing past this point). Written by the build; see DESIGN §5 for the folder layout.
#pragma once

#include <flashrt/utf8.h>

#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace frt::detail {

// metadata.json could not be read or does not say what a package must say. The message names
// the file, the field and the offending value. It quotes file content and paths, so it is
// escaped to valid UTF-8 on construction: it ends up verbatim in unavailable_report(), which the
// door hands to Python as str.
class MetadataError : public std::runtime_error {
 public:
  explicit MetadataError(std::string_view what) : std::runtime_error(escape_invalid_utf8(what)) {}
};

// metadata.json is at most three containers deep; anything past this is refused before it can
// reach code that recurses per level (nlohmann's dump, used to quote a bad value, does).
inline constexpr int kMaxMetadataDepth = 64;

// "cpu-<arch>-<os>-<isa>", e.g. "cpu-x86_64-linux-avx2".
struct VariantName {
  std::string arch, os, isa;
};
// Throws MetadataError (without a file name) when `name` has another shape.
VariantName parse_variant_name(std::string_view name);

struct VariantMetadata {
  std::string name;  // "cpu-x86_64-linux-avx2"
  std::string arch, os, isa;
  std::vector<std::string> requires_features;  // CPU features, as metadata lists them
  std::string library;                         // as written: relative to the package folder
  std::filesystem::path library_path;          // absolute
  std::string sha256;                          // 64 lower-case hex digits
};

struct PackageMetadata {
  std::string name;  // "<org>/<pkg>"
  std::string version, revision;
  int abi_major = 0, abi_minor = 0;
  std::vector<VariantMetadata> variants;
  std::filesystem::path dir;  // absolute package folder
};

// Parses the text of `<dir>/metadata.json`; `expected_name` is the repo the folder stands for
// ("<org>/<pkg>" for a root, the LOCAL_KERNELS repo otherwise). Throws MetadataError.
PackageMetadata parse_metadata(std::string_view json_text, const std::filesystem::path& dir,
                               std::string_view expected_name);
// Reads and parses `<dir>/metadata.json`. Throws MetadataError.
PackageMetadata read_metadata(const std::filesystem::path& dir, std::string_view expected_name);

}  // namespace frt::detail
