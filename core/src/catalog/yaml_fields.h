// Typed reads of YAML fields for every catalog file. Each failure names the file and the dotted
// field path, so a catalog edit that breaks fails at load with the line to fix, never later
// inside a planner (DESIGN §10).
#pragma once

#include <flashrt/errors.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

namespace frt::detail {

std::string join(const std::vector<std::string>& items, std::string_view sep = ", ");
std::string child(const std::string& field, std::string_view key);

class YamlFields {
 public:
  explicit YamlFields(std::string file) : file_(std::move(file)) {}
  const std::string& file() const { return file_; }

  [[noreturn]] void fail(const std::string& field, const std::string& what) const;
  YAML::Node require(const YAML::Node& map, const std::string& field, std::string_view key) const;
  // Unknown keys are errors, not ignored: a misspelt `requried: false` must not silently keep
  // the default. yaml-cpp keeps duplicate keys and answers lookups with the first, so a second
  // definition would be dropped unseen; refuse it instead.
  void check_keys(const YAML::Node& map, const std::string& field,
                  std::initializer_list<std::string_view> allowed) const;
  void expect_map(const YAML::Node& node, const std::string& field, bool allow_empty) const;
  std::string text(const YAML::Node& node, const std::string& field) const;
  int64_t integer(const YAML::Node& node, const std::string& field) const;
  double number(const YAML::Node& node, const std::string& field) const;
  bool boolean(const YAML::Node& node, const std::string& field) const;
  std::vector<std::string> string_list(const YAML::Node& node, const std::string& field,
                                       bool allow_empty) const;
  // A value parsed through `parse` (an enum's name table); `known` lists the table.
  template <typename Parse>
  auto named(const YAML::Node& node, const std::string& field, const char* what, Parse parse,
             const std::string& known) const {
    const std::string name = text(node, field);
    auto v = parse(name);
    if (!v) fail(field, "unknown " + std::string(what) + " '" + name + "' (known: " + known + ")");
    return *v;
  }

 private:
  std::string file_;
};

// Reads and parses one YAML file; a syntax error names the file, line and column.
YAML::Node load_yaml_file(const std::string& file);

}  // namespace frt::detail
