#include <flashrt/utf8.h>

namespace frt {
namespace {

bool in(unsigned char c, unsigned char lo, unsigned char hi) { return c >= lo && c <= hi; }

// Length of the well-formed sequence that starts at s[i], or 0 when none does.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const size_t left = s.size() - i;
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char b0 = at(0);
  if (b0 <= 0x7f) return 1;
  // The second byte's range depends on the first: that is what rules out overlong forms
  // (E0 80..9F, F0 80..8F), UTF-16 surrogates (ED A0..BF) and code points past U+10FFFF (F4 90..).
  unsigned char lo = 0x80, hi = 0xbf;
  size_t n = 0;
  if (in(b0, 0xc2, 0xdf)) {
    n = 2;
  } else if (in(b0, 0xe0, 0xef)) {
    n = 3;
    if (b0 == 0xe0) lo = 0xa0;
    if (b0 == 0xed) hi = 0x9f;
  } else if (in(b0, 0xf0, 0xf4)) {
    n = 4;
    if (b0 == 0xf0) lo = 0x90;
    if (b0 == 0xf4) hi = 0x8f;
  } else {
    return 0;  // a continuation byte, C0/C1 (always overlong) or F5..FF (never used)
  }
  if (left < n || !in(at(1), lo, hi)) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (!in(at(k), 0x80, 0xbf)) return 0;
  }
  return n;
}

}  // namespace

size_t first_invalid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

std::string escape_invalid_utf8(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_sequence_length(s, i);
    if (n > 0) {
      out.append(s.substr(i, n));
      i += n;
      continue;
    }
    // One byte at a time: the bytes after a bad lead are looked at afresh, so a valid character
    // right after a truncated sequence survives.
    const auto b = static_cast<unsigned char>(s[i]);
    out += "\\x";
    out += kHex[b >> 4];
    out += kHex[b & 0xf];
    ++i;
  }
  return out;
}

std::string_view utf8_prefix(std::string_view s, size_t max_bytes) {
  size_t end = 0;
  while (end < s.size()) {
    const size_t n = utf8_sequence_length(s, end);
    const size_t step = n == 0 ? 1 : n;  // an invalid byte is its own unit
    if (end + step > max_bytes) break;
    end += step;
  }
  return s.substr(0, end);
}

}  // namespace frt
