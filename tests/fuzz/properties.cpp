#include "properties.h"

#include <flashrt/catalog.h>
#include <flashrt/errors.h>
#include <flashrt/utf8.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <typeinfo>

#include "hub/metadata.h"

namespace frt::fuzz {
namespace {

namespace fs = std::filesystem;

// A message shown in a violation: escaped and cut, so the report itself stays printable.
std::string shown(std::string_view s) {
  return escape_invalid_utf8(utf8_prefix(s, 300)) + (s.size() > 300 ? "..." : "");
}

Verdict violation(std::string what) {
  Verdict v;
  v.violation = std::move(what);
  return v;
}

}  // namespace

void Tally::add(const Verdict& v, double seconds) {
  ++inputs;
  if (!v.violation.empty()) {
    ++violations;
  } else if (v.parsed) {
    ++parsed;
  } else {
    ++refused;
  }
  slowest_s = std::max(slowest_s, seconds);
}

std::string Tally::line() const {
  char slow[32];
  std::snprintf(slow, sizeof slow, "%.3f", slowest_s);
  return "[fuzz] " + name + ": " + std::to_string(inputs) + " inputs, " + std::to_string(refused) +
         " refused, " + std::to_string(parsed) + " parsed, " + std::to_string(violations) +
         " crashes (slowest input " + slow + " s)";
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + p.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_file(const fs::path& p, std::string_view text) {
  // A fresh file, not a truncated one: ext4 flushes a file rewritten through truncation when it is
  // closed (auto_da_alloc), which made each input wait on the disk.
  std::error_code ec;
  fs::remove(p, ec);
  std::ofstream out(p, std::ios::binary);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

Verdict check_metadata(std::string_view text, const fs::path& pkg_dir, std::string_view repo,
                       bool via_file) {
  const std::string file = (fs::absolute(pkg_dir) / "metadata.json").lexically_normal().string();
  Verdict v;
  try {
    if (via_file) {
      write_file(file, text);
      detail::read_metadata(pkg_dir, repo);
    } else {
      detail::parse_metadata(text, pkg_dir, repo);
    }
    v.parsed = true;
    return v;
  } catch (const detail::MetadataError& e) {
    v.error = e.what();
  } catch (const std::exception& e) {
    return violation(std::string("not a MetadataError: ") + typeid(e).name() + ": " +
                     shown(e.what()));
  } catch (...) {
    return violation("not a MetadataError: an exception not derived from std::exception");
  }
  std::string bad;
  if (!is_valid_utf8(v.error)) {
    bad = "message is not valid UTF-8: " + shown(v.error);
  } else if (v.error.rfind(file + ": ", 0) != 0) {
    bad = "message does not start with the file '" + file + "': " + shown(v.error);
  }
  if (bad.empty() && v.error.size() > kMaxMetadataMessage) {
    bad = "message of " + std::to_string(v.error.size()) +
          " bytes swamps the report: " + shown(v.error);
  }
  // Past the file name the message says what is wrong: the JSON, or which field.
  static constexpr std::string_view kNamed[] = {"invalid JSON", "top level", "field '",
                                                "'variants[", "variant '"};
  if (bad.empty() && std::none_of(std::begin(kNamed), std::end(kNamed), [&](std::string_view k) {
        return v.error.find(k) != std::string::npos;
      })) {
    bad = "message names neither the JSON problem nor a field: " + shown(v.error);
  }
  if (!bad.empty()) return violation(bad);
  return v;
}

CatalogSandbox::CatalogSandbox(const fs::path& seed_dir, const fs::path& work_dir)
    : dir_(work_dir) {
  fs::remove_all(dir_);
  fs::create_directories(dir_);
  fs::copy(seed_dir, dir_, fs::copy_options::recursive);
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir_)) {
    if (e.is_regular_file() && e.path().extension() == ".yaml") {
      files_.push_back(fs::relative(e.path(), dir_));
    }
  }
  std::sort(files_.begin(), files_.end());
  for (const fs::path& f : files_) originals_.push_back(read_file(dir_ / f));
}

CatalogSandbox::~CatalogSandbox() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

Verdict CatalogSandbox::load() const {
  Verdict v;
  try {
    Catalog::load(dir_.string());
    v.parsed = true;
    return v;
  } catch (const InvalidArgument& e) {
    v.error = e.what();
  } catch (const std::exception& e) {
    return violation(std::string("not an InvalidArgument: ") + typeid(e).name() + ": " +
                     shown(e.what()));
  } catch (...) {
    return violation("not an InvalidArgument: an exception not derived from std::exception");
  }
  if (!is_valid_utf8(v.error)) return violation("message is not valid UTF-8: " + shown(v.error));
  // Any file of the set may be the one named (a mutated name can clash with another file's), by
  // its path or by its name alone.
  const bool names_a_file = std::any_of(files_.begin(), files_.end(), [&](const fs::path& f) {
    return v.error.find(f.filename().string()) != std::string::npos;
  });
  if (!names_a_file) return violation("message names no file of the catalog: " + shown(v.error));
  return v;
}

Verdict CatalogSandbox::check_seeds() const { return load(); }

Verdict CatalogSandbox::check(size_t i, std::string_view text) const {
  write_file(dir_ / files_[i], text);
  Verdict v = load();
  write_file(dir_ / files_[i], originals_[i]);
  return v;
}

}  // namespace frt::fuzz
