#include "catalog/yaml_fields.h"

#include <flashrt/utf8.h>

#include <cmath>
#include <fstream>
#include <set>
#include <sstream>

#include "catalog/yaml_guard.h"

namespace frt::detail {
namespace {

std::string got(const YAML::Node& node) {
  return node.IsScalar() ? ", got '" + node.Scalar() + "'" : "";
}

}  // namespace

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += sep;
    out += item;
  }
  return out;
}

std::string child(const std::string& field, std::string_view key) {
  return field.empty() ? std::string(key) : field + "." + std::string(key);
}

void YamlFields::fail(const std::string& field, const std::string& what) const {
  // Field names and values come from the file and file names from the file system: the message
  // crosses into Python as str, so bytes that are not UTF-8 are escaped.
  throw InvalidArgument(escape_invalid_utf8(file_ + ": " + field + ": " + what));
}

YAML::Node YamlFields::require(const YAML::Node& map, const std::string& field,
                               std::string_view key) const {
  const YAML::Node node = map[std::string(key)];
  if (!node) fail(child(field, key), "missing required field");
  return node;
}

void YamlFields::check_keys(const YAML::Node& map, const std::string& field,
                            std::initializer_list<std::string_view> allowed) const {
  std::set<std::string> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) fail(field.empty() ? "(top level)" : field, "keys must be names");
    const std::string key = kv.first.Scalar();
    if (!seen.insert(key).second)
      fail(field.empty() ? "(top level)" : field, "duplicate key '" + key + "'");
    if (std::find(allowed.begin(), allowed.end(), key) == allowed.end()) {
      std::vector<std::string> names(allowed.begin(), allowed.end());
      fail(child(field, key), "unknown field (allowed: " + join(names) + ")");
    }
  }
}

void YamlFields::expect_map(const YAML::Node& node, const std::string& field,
                            bool allow_empty) const {
  if (!node.IsMap()) fail(field, "expected a mapping");
  if (!allow_empty && node.size() == 0) fail(field, "must not be empty");
  std::set<std::string> seen;
  for (const auto& kv : node) {
    if (!kv.first.IsScalar()) fail(field, "keys must be plain names");
    if (!seen.insert(kv.first.Scalar()).second) {
      fail(field, "duplicate name '" + kv.first.Scalar() + "'");
    }
  }
}

std::string YamlFields::text(const YAML::Node& node, const std::string& field) const {
  if (!node.IsScalar()) fail(field, "expected a string");
  if (node.Scalar().empty()) fail(field, "must not be empty");
  return node.Scalar();
}

int64_t YamlFields::integer(const YAML::Node& node, const std::string& field) const {
  int64_t value = 0;
  if (!node.IsScalar() || !YAML::convert<int64_t>::decode(node, value)) {
    fail(field, "expected an integer" + got(node));
  }
  return value;
}

double YamlFields::number(const YAML::Node& node, const std::string& field) const {
  double value = 0;
  if (!node.IsScalar() || !YAML::convert<double>::decode(node, value) || !std::isfinite(value)) {
    fail(field, "expected a finite number" + got(node));
  }
  return value;
}

bool YamlFields::boolean(const YAML::Node& node, const std::string& field) const {
  bool value = false;
  if (!node.IsScalar() || !YAML::convert<bool>::decode(node, value)) {
    fail(field, "expected true or false" + got(node));
  }
  return value;
}

std::vector<std::string> YamlFields::string_list(const YAML::Node& node, const std::string& field,
                                                 bool allow_empty) const {
  if (!node.IsSequence()) fail(field, "expected a list");
  if (!allow_empty && node.size() == 0) fail(field, "must not be empty");
  std::vector<std::string> out;
  for (size_t i = 0; i < node.size(); ++i) {
    const std::string item_field = field + "[" + std::to_string(i) + "]";
    std::string item = text(node[i], item_field);
    if (std::find(out.begin(), out.end(), item) != out.end()) {
      fail(item_field, "duplicate entry '" + item + "'");
    }
    out.push_back(std::move(item));
  }
  return out;
}

YAML::Node load_yaml_file(const std::string& path) {
  const std::string file = escape_invalid_utf8(path);
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InvalidArgument(file + ": cannot be read");
  std::ostringstream text;
  text << in.rdbuf();
  check_yaml_text(file, text.str());  // UTF-8, YAML's characters, bounded nesting
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::ParserException& e) {
    throw InvalidArgument(file + ": YAML syntax error at line " + std::to_string(e.mark.line + 1) +
                          ", column " + std::to_string(e.mark.column + 1) + ": " +
                          escape_invalid_utf8(e.msg));
  } catch (const YAML::Exception& e) {
    throw InvalidArgument(file + ": " + escape_invalid_utf8(e.what()));
  }
  if (root.IsNull()) throw InvalidArgument(file + ": empty file");
  return root;
}

}  // namespace frt::detail
