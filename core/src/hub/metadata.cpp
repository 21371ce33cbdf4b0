#include "metadata.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <vector>

namespace frt::detail {
namespace {

using nlohmann::json;

// Values quoted in an error message are cut short so a huge blob cannot swamp the report, and
// cut between characters: a cut inside a multi-byte character would be invalid UTF-8.
constexpr size_t kMaxShown = 80;

std::string clip(std::string_view s, size_t max_bytes = kMaxShown) {
  const std::string_view head = utf8_prefix(s, max_bytes);
  return head.size() < s.size() ? std::string(head) + "..." : std::string(s);
}

std::string show(const json& v) { return clip(v.dump()); }

// nlohmann's message ends with the whole token read so far ("last read: '...'"), which for an
// unterminated string is the rest of the file.
constexpr size_t kMaxParseMessage = 240;

// Field access that names the field path and the bad value on failure.
class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& msg) const { throw MetadataError(file_ + ": " + msg); }

  const json& field(const json& obj, const std::string& where, const char* key) const {
    auto it = obj.find(key);
    if (it == obj.end()) fail("missing field '" + where + key + "'");
    return *it;
  }

  std::string string(const json& obj, const std::string& where, const char* key) const {
    const json& v = field(obj, where, key);
    if (!v.is_string()) {
      fail("field '" + where + key + "' must be a string, got " + v.type_name() + " " + show(v));
    }
    std::string s = v.get<std::string>();
    if (s.empty()) fail("field '" + where + key + "' is empty");
    return s;
  }

  int integer(const json& obj, const std::string& where, const char* key) const {
    const json& v = field(obj, where, key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1'000'000) {
      fail("field '" + where + key + "' must be a non-negative integer, got " + v.type_name() +
           " " + show(v));
    }
    return v.get<int>();
  }

  const json& array(const json& obj, const std::string& where, const char* key) const {
    const json& v = field(obj, where, key);
    if (!v.is_array()) {
      fail("field '" + where + key + "' must be an array, got " + v.type_name() + " " + show(v));
    }
    return v;
  }

 private:
  std::string file_;
};

bool is_lower_hex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool is_repo_name(std::string_view s) {
  const size_t slash = s.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == s.size()) return false;
  if (s.find('/', slash + 1) != std::string_view::npos) return false;
  return s.substr(0, slash) != ".." && s.substr(slash + 1) != ".." && s.substr(0, slash) != "." &&
         s.substr(slash + 1) != ".";
}

VariantMetadata parse_variant(const Reader& r, const json& v, size_t index,
                              const std::filesystem::path& dir) {
  const std::string where = "variants[" + std::to_string(index) + "].";
  if (!v.is_object()) {
    r.fail("'variants[" + std::to_string(index) + "]' must be an object, got " + v.type_name() +
           " " + show(v));
  }
  VariantMetadata out;
  out.name = r.string(v, where, "name");
  out.arch = r.string(v, where, "arch");
  out.os = r.string(v, where, "os");
  out.isa = r.string(v, where, "isa");

  VariantName parsed;
  try {
    parsed = parse_variant_name(out.name);
  } catch (const MetadataError& e) {
    r.fail("field '" + where + "name': " + e.what());
  }
  const auto agree = [&](const char* key, const std::string& from_name, const std::string& field) {
    if (from_name != field) {
      r.fail("variant '" + clip(out.name) + "' names " + key + " '" + clip(from_name) +
             "' but field '" + where + key + "' is '" + clip(field) + "'");
    }
  };
  agree("arch", parsed.arch, out.arch);
  agree("os", parsed.os, out.os);
  agree("isa", parsed.isa, out.isa);

  const json& req = r.array(v, where, "requires");
  for (size_t i = 0; i < req.size(); ++i) {
    if (!req[i].is_string() || req[i].get<std::string>().empty()) {
      r.fail("field '" + where + "requires[" + std::to_string(i) +
             "]' must be a non-empty string, got " + req[i].type_name() + " " + show(req[i]));
    }
    out.requires_features.push_back(req[i].get<std::string>());
  }

  out.library = r.string(v, where, "library");
  out.library_path = (dir / out.library).lexically_normal();

  out.sha256 = r.string(v, where, "sha256");
  if (out.sha256.size() != 64 || !is_lower_hex(out.sha256)) {
    r.fail("field '" + where + "sha256' must be 64 lower-case hex digits, got '" +
           clip(out.sha256) + "'");
  }
  return out;
}

}  // namespace

VariantName parse_variant_name(std::string_view name) {
  std::vector<std::string> parts;
  std::string cur;
  for (char c : name) {
    if (c == '-') {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  parts.push_back(cur);
  const bool ok = parts.size() == 4 && parts[0] == "cpu" && !parts[1].empty() &&
                  !parts[2].empty() && !parts[3].empty();
  if (!ok) {
    throw MetadataError("variant name '" + clip(name) +
                        "' is not of the form cpu-<arch>-<os>-<isa>");
  }
  return {parts[1], parts[2], parts[3]};
}

PackageMetadata parse_metadata(std::string_view json_text, const std::filesystem::path& dir,
                               std::string_view expected_name) {
  const std::filesystem::path abs_dir = std::filesystem::absolute(dir).lexically_normal();
  const Reader r((abs_dir / "metadata.json").string());

  // Two checks nlohmann does not make, done while it parses (`depth` counts the arrays and
  // objects around the event):
  // - nesting: parsing does not recurse, but dumping a value to quote it does, once per level;
  //   10^5 nested brackets overflowed the stack. Refused past kMaxMetadataDepth.
  // - duplicate keys: nlohmann keeps the last, so a second "sha256" would silently win. Refused,
  //   as the catalog refuses them.
  std::vector<std::set<std::string>> keys;  // keys[d]: the keys seen in the open object at depth d
  const json::parser_callback_t guard = [&](int depth, json::parse_event_t event, json& parsed) {
    const auto d = static_cast<size_t>(depth);
    if (event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) {
      if (depth >= kMaxMetadataDepth) {
        r.fail("invalid JSON: arrays and objects nested deeper than " +
               std::to_string(kMaxMetadataDepth) + " levels");
      }
      // An object at depth d reports its keys at depth d + 1.
      if (keys.size() < d + 2) keys.resize(d + 2);
      keys[d + 1].clear();
    } else if (event == json::parse_event_t::key && d < keys.size()) {
      const std::string& key = parsed.get_ref<const std::string&>();
      if (!keys[d].insert(key).second) {
        r.fail("invalid JSON: key '" + clip(key) + "' appears twice in one object");
      }
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(json_text.begin(), json_text.end(), guard);
  } catch (const json::exception& e) {
    // Not only parse_error: a number past double's range ("1e999") is an out_of_range.
    r.fail(std::string("invalid JSON: ") + clip(e.what(), kMaxParseMessage));
  }
  if (!doc.is_object()) r.fail(std::string("top level must be an object, got ") + doc.type_name());

  PackageMetadata out;
  out.dir = abs_dir;
  out.name = r.string(doc, "", "name");
  if (!is_repo_name(out.name)) {
    r.fail("field 'name' must be '<org>/<package>', got '" + clip(out.name) + "'");
  }
  if (out.name != expected_name) {
    r.fail("field 'name' is '" + clip(out.name) + "' but the package sits where '" +
           std::string(expected_name) + "' belongs");
  }
  out.version = r.string(doc, "", "version");
  out.revision = r.string(doc, "", "revision");
  out.abi_major = r.integer(doc, "", "abi_major");
  out.abi_minor = r.integer(doc, "", "abi_minor");

  const json& variants = r.array(doc, "", "variants");
  std::set<std::string> seen;
  for (size_t i = 0; i < variants.size(); ++i) {
    VariantMetadata v = parse_variant(r, variants[i], i, abs_dir);
    if (!seen.insert(v.name).second) r.fail("variant '" + clip(v.name) + "' is declared twice");
    out.variants.push_back(std::move(v));
  }
  return out;
}

PackageMetadata read_metadata(const std::filesystem::path& dir, std::string_view expected_name) {
  const std::filesystem::path file =
      std::filesystem::absolute(dir / "metadata.json").lexically_normal();
  std::ifstream in(file, std::ios::binary);
  if (!in) throw MetadataError(file.string() + ": cannot be opened for reading");
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw MetadataError(file.string() + ": read error");
  return parse_metadata(text.str(), dir, expected_name);
}

}  // namespace frt::detail
