// Checks on the raw text of a catalog YAML file, made before yaml-cpp parses it. yaml-cpp passes
// bytes that are not UTF-8 through into scalars; the loader then quotes them in messages that
// cross into Python as str, and its canonical JSON form (the spec digest) throws
// nlohmann::json::type_error on them, which is not the loader's own error. yaml-cpp's own
// messages may still hold a piece of a character ("unknown escape character: " and the first
// byte of a multi-byte one), so the loader escapes those too (escape_invalid_utf8).
#pragma once

#include <string>
#include <string_view>

namespace frt::detail {

// Flow collections ([...] and {...}) nested deeper than this are refused. A catalog file nests
// three or four levels; yaml-cpp's own limit (2000 levels of recursion, reported as "bad file")
// still applies to block nesting.
inline constexpr size_t kMaxYamlFlowDepth = 64;

// Throws InvalidArgument("<file>: line L, column C: ...") when `text` is not a YAML stream the
// loader accepts:
// - bytes that are not UTF-8 (YAML 1.2 §5.2: a stream is Unicode; the catalog is UTF-8), shown
//   escaped;
// - characters YAML does not allow in a stream (§5.1 c-printable: no C0 or C1 controls but tab,
//   line feed, carriage return and NEL; no DEL, U+FFFE or U+FFFF). yaml-cpp reads a file that
//   starts with a byte and three NULs as UTF-32 and then quotes pieces of what it decoded;
// - flow collections nested deeper than kMaxYamlFlowDepth, refused here with a message that says
//   so, before the parser recurses into them.
void check_yaml_text(const std::string& file, std::string_view text);

}  // namespace frt::detail
