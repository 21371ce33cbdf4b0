#include "yaml_guard.h"

#include <flashrt/errors.h>
#include <flashrt/utf8.h>

#include <algorithm>

namespace frt::detail {
namespace {

// "<file>: line L, column C: " for the byte at `at`; columns count characters, as an editor
// shows them (the bytes before `at` are valid UTF-8 when this is called).
std::string where(const std::string& file, std::string_view text, size_t at) {
  const std::string_view before = text.substr(0, at);
  const size_t line = 1 + static_cast<size_t>(std::count(before.begin(), before.end(), '\n'));
  const size_t nl = before.rfind('\n');
  const size_t line_start = nl == std::string_view::npos ? 0 : nl + 1;
  size_t column = 1;
  for (size_t i = line_start; i < at; ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xc0) != 0x80) ++column;
  }
  return escape_invalid_utf8(file) + ": line " + std::to_string(line) + ", column " +
         std::to_string(column) + ": ";
}

// Offset of the bracket that opens flow level kMaxYamlFlowDepth + 1, or npos. Quoted scalars and
// comments are skipped; brackets inside a plain scalar are counted too, which can only refuse
// more, and no catalog value nests 64 of them.
size_t too_deep_at(std::string_view text) {
  size_t depth = 0;
  char quote = 0;
  bool comment = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (comment) {
      comment = c != '\n';
    } else if (quote == '"') {
      if (c == '\\') {
        ++i;  // an escaped character, a quote included
      } else if (c == '"') {
        quote = 0;
      }
    } else if (quote == '\'') {
      if (c == '\'') quote = 0;  // '' inside is a quote, read as close and reopen
    } else if (c == '#' &&
               (i == 0 || text[i - 1] == ' ' || text[i - 1] == '\t' || text[i - 1] == '\n')) {
      comment = true;
    } else if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxYamlFlowDepth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string_view::npos;
}

}  // namespace

void check_yaml_text(const std::string& file, std::string_view text) {
  const size_t bad = first_invalid_utf8(text);
  if (bad != std::string_view::npos) {
    throw InvalidArgument(where(file, text, bad) + "bytes that are not UTF-8 (" +
                          escape_invalid_utf8(text.substr(bad, 4)) + "); a catalog file is UTF-8");
  }
  const size_t deep = too_deep_at(text);
  if (deep != std::string_view::npos) {
    throw InvalidArgument(where(file, text, deep) + "flow collections nested deeper than " +
                          std::to_string(kMaxYamlFlowDepth) + " levels");
  }
}

}  // namespace frt::detail
