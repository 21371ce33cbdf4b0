#include "yaml_guard.h"

#include <flashrt/errors.h>
#include <flashrt/utf8.h>

#include <algorithm>
#include <cstdio>

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

// The code point of the well-formed sequence at text[i] (the text is valid UTF-8), and its length.
char32_t decode(std::string_view text, size_t i, size_t* len) {
  const auto b = [&](size_t k) {
    return static_cast<char32_t>(static_cast<unsigned char>(text[i + k]));
  };
  if (b(0) < 0x80) {
    *len = 1;
    return b(0);
  }
  if (b(0) < 0xe0) {
    *len = 2;
    return ((b(0) & 0x1f) << 6) | (b(1) & 0x3f);
  }
  if (b(0) < 0xf0) {
    *len = 3;
    return ((b(0) & 0x0f) << 12) | ((b(1) & 0x3f) << 6) | (b(2) & 0x3f);
  }
  *len = 4;
  return ((b(0) & 0x07) << 18) | ((b(1) & 0x3f) << 12) | ((b(2) & 0x3f) << 6) | (b(3) & 0x3f);
}

// YAML 1.2 §5.1 c-printable. Surrogates cannot occur in valid UTF-8.
bool printable(char32_t c) {
  return c == 0x09 || c == 0x0a || c == 0x0d || (c >= 0x20 && c <= 0x7e) || c == 0x85 ||
         (c >= 0xa0 && c <= 0xfffd) || c >= 0x10000;
}

}  // namespace

void check_yaml_text(const std::string& file, std::string_view text) {
  const size_t bad = first_invalid_utf8(text);
  if (bad != std::string_view::npos) {
    throw InvalidArgument(where(file, text, bad) + "bytes that are not UTF-8 (" +
                          escape_invalid_utf8(text.substr(bad, 4)) + "); a catalog file is UTF-8");
  }
  for (size_t i = 0, len = 0; i < text.size(); i += len) {
    const char32_t c = decode(text, i, &len);
    if (!printable(c)) {
      char code[16];
      std::snprintf(code, sizeof code, "U+%04X", static_cast<unsigned>(c));
      throw InvalidArgument(where(file, text, i) + "character " + code +
                            " is not allowed in YAML (a control character)");
    }
  }
  const size_t deep = too_deep_at(text);
  if (deep != std::string_view::npos) {
    throw InvalidArgument(where(file, text, deep) + "flow collections nested deeper than " +
                          std::to_string(kMaxYamlFlowDepth) + " levels");
  }
}

}  // namespace frt::detail
