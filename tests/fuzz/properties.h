// What every parser input must give (issue 13): a parsed object, or the project's own error whose
// message names the file and is valid UTF-8. Never a crash, a hang, a sanitizer report, or any
// other exception type. Shared by the GoogleTest fuzz tests and the optional libFuzzer targets.
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace frt::fuzz {

struct Verdict {
  bool parsed = false;
  std::string error;      // the refusal's message; "" when parsed
  std::string violation;  // "" when the property holds
};

// Tallies one parser's inputs and prints "[fuzz] <name>: N inputs, R refused, P parsed, 0 crashes".
struct Tally {
  std::string name;
  size_t inputs = 0, parsed = 0, refused = 0, violations = 0;
  double slowest_s = 0;
  void add(const Verdict& v, double seconds);
  std::string line() const;
};

// A metadata.json error may quote a value; quotes are cut short, so the whole message stays
// readable in a report. nlohmann's own parse message is cut at 240 bytes.
inline constexpr size_t kMaxMetadataMessage = 2048;

// Parses `text` as `pkg_dir`/metadata.json for package `repo`: through parse_metadata, or, when
// via_file, written to pkg_dir and read back through read_metadata.
Verdict check_metadata(std::string_view text, const std::filesystem::path& pkg_dir,
                       std::string_view repo, bool via_file);

// A private copy of a catalog directory (every file, subdirectories included) in which one
// *.yaml file at a time is replaced by an input and the whole directory is loaded through the
// public Catalog::load(dir).
class CatalogSandbox {
 public:
  CatalogSandbox(const std::filesystem::path& seed_dir, const std::filesystem::path& work_dir);
  ~CatalogSandbox();
  CatalogSandbox(const CatalogSandbox&) = delete;
  CatalogSandbox& operator=(const CatalogSandbox&) = delete;

  // Every *.yaml under the copy, relative to it, sorted.
  const std::vector<std::filesystem::path>& files() const { return files_; }
  const std::string& original(size_t i) const { return originals_[i]; }
  const std::filesystem::path& dir() const { return dir_; }

  // Loads the unmodified copy.
  Verdict check_seeds() const;
  // Writes `text` over files()[i], loads the directory, puts the original back.
  Verdict check(size_t i, std::string_view text) const;

 private:
  Verdict load() const;
  std::filesystem::path dir_;
  std::vector<std::filesystem::path> files_;
  std::vector<std::string> originals_;
};

std::string read_file(const std::filesystem::path& p);
void write_file(const std::filesystem::path& p, std::string_view text);

}  // namespace frt::fuzz
