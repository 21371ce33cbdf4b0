// UTF-8 checks for text that crosses into Python. The door hands every message and report field
// to Python as str, which must be valid UTF-8: one raw byte from a file (a metadata.json value,
// a catalog line, a path) would turn a refusal into a UnicodeDecodeError at the binding. The core
// escapes texts built from file content where it makes them; the door escapes again as a last
// line of defence.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace frt {

// Offset of the first byte that is not part of a well-formed sequence (Unicode Table 3-7: no
// overlongs, no surrogates, nothing past U+10FFFF, no truncated sequence); npos when s is valid.
size_t first_invalid_utf8(std::string_view s);

inline bool is_valid_utf8(std::string_view s) {
  return first_invalid_utf8(s) == std::string_view::npos;
}

// s with every byte that is not part of a well-formed sequence written as "\xHH" (lower-case
// hex); valid text, multi-byte characters and backslashes included, is kept as it is. The result
// is valid UTF-8, and escaping it again changes nothing.
std::string escape_invalid_utf8(std::string_view s);

// The longest prefix of s of at most max_bytes that does not end inside a well-formed sequence:
// cutting a long value short for a message must not turn valid text into invalid text.
std::string_view utf8_prefix(std::string_view s, size_t max_bytes);

}  // namespace frt
