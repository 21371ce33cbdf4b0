#include "mutate.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <vector>

namespace frt::fuzz {

uint64_t Rng::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

size_t fuzz_inputs(size_t default_count) {
  const char* v = std::getenv("FRT_FUZZ_INPUTS");
  if (v == nullptr || *v == '\0') return default_count;
  return static_cast<size_t>(std::strtoull(v, nullptr, 10));
}

uint64_t fuzz_seed() {
  const char* v = std::getenv("FRT_FUZZ_SEED");
  if (v == nullptr || *v == '\0') return 20240613;
  return std::strtoull(v, nullptr, 10);
}

namespace {

struct Span {
  size_t begin = 0, end = 0;  // [begin, end)
  size_t indent = 0;          // YAML: the indentation of the line the span sits on
  bool block = false;         // YAML: a block container (the lines under a "key:" line)
};

// Where a seed's values, containers and key/value members are: the structural mutations need
// them. Only seeds are scanned, and seeds are well-formed.
struct Structure {
  std::vector<Span> scalars;      // values, and in YAML also keys
  std::vector<Span> numbers;      // the scalars that are numbers
  std::vector<Span> containers;   // arrays / objects, flow or block
  std::vector<Span> members;      // one key with its value, to duplicate
  std::vector<Span> line_values;  // YAML: the scalar after "key: " (may turn into a block list)
};

bool is_number_char(char c) {
  return (c >= '0' && c <= '9') || c == '-' || c == '+' || c == '.' || c == 'e' || c == 'E';
}

bool looks_numeric(std::string_view s) {
  return !s.empty() && ((s[0] >= '0' && s[0] <= '9') || s[0] == '-' || s[0] == '.') &&
         std::all_of(s.begin(), s.end(), is_number_char);
}

Structure scan_json(std::string_view s) {
  Structure st;
  std::vector<size_t> open;                 // positions of unclosed [ and {
  std::vector<size_t> key_at(1, SIZE_MAX);  // per depth: where a pending member's key starts
  const auto value_done = [&](size_t end) {
    size_t& k = key_at[open.size()];
    if (k != SIZE_MAX) st.members.push_back({k, end});
    k = SIZE_MAX;
  };
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    if (c == '"') {
      size_t j = i + 1;
      while (j < s.size() && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
      j = std::min(j + 1, s.size());
      size_t k = j;
      while (k < s.size() && (s[k] == ' ' || s[k] == '\n' || s[k] == '\t' || s[k] == '\r')) ++k;
      if (k < s.size() && s[k] == ':') {
        key_at[open.size()] = i;
      } else {
        st.scalars.push_back({i, j});
        value_done(j);
      }
      i = j;
    } else if ((c >= '0' && c <= '9') || c == '-') {
      size_t j = i;
      while (j < s.size() && is_number_char(s[j])) ++j;
      st.scalars.push_back({i, j});
      st.numbers.push_back({i, j});
      value_done(j);
      i = j;
    } else if (c >= 'a' && c <= 'z') {
      size_t j = i;
      while (j < s.size() && s[j] >= 'a' && s[j] <= 'z') ++j;
      st.scalars.push_back({i, j});
      value_done(j);
      i = j;
    } else if (c == '[' || c == '{') {
      open.push_back(i);
      key_at.push_back(SIZE_MAX);
      ++i;
    } else if ((c == ']' || c == '}') && !open.empty()) {
      st.containers.push_back({open.back(), i + 1});
      open.pop_back();
      key_at.pop_back();
      value_done(i + 1);
      ++i;
    } else {
      ++i;
    }
  }
  return st;
}

size_t line_end(std::string_view s, size_t i) {
  const size_t e = s.find('\n', i);
  return e == std::string_view::npos ? s.size() : e;
}

// Where a comment starts on [b, e), or e: '#' at the start or after a blank, outside quotes.
size_t comment_start(std::string_view s, size_t b, size_t e) {
  char quote = 0;
  for (size_t i = b; i < e; ++i) {
    if (quote != 0) {
      if (s[i] == quote) quote = 0;
    } else if (s[i] == '"' || s[i] == '\'') {
      quote = s[i];
    } else if (s[i] == '#' && (i == b || s[i - 1] == ' ')) {
      return i;
    }
  }
  return e;
}

// Plain scalars and nested containers inside one flow collection [b, e) on a line.
void scan_flow(std::string_view s, size_t b, size_t e, size_t indent, Structure& st) {
  std::vector<size_t> open;
  size_t word = SIZE_MAX;
  const auto end_word = [&](size_t i) {
    if (word == SIZE_MAX) return;
    size_t wb = word, we = i;
    while (we > wb && s[we - 1] == ' ') --we;
    if (we > wb) {
      st.scalars.push_back({wb, we, indent});
      if (looks_numeric(s.substr(wb, we - wb))) st.numbers.push_back({wb, we, indent});
    }
    word = SIZE_MAX;
  };
  for (size_t i = b; i < e; ++i) {
    const char c = s[i];
    if (c == '[' || c == '{') {
      end_word(i);
      open.push_back(i);
    } else if (c == ']' || c == '}') {
      end_word(i);
      if (!open.empty()) {
        st.containers.push_back({open.back(), i + 1, indent});
        open.pop_back();
      }
    } else if (c == ',' || c == ':') {
      end_word(i);
    } else if (c != ' ' && word == SIZE_MAX) {
      word = i;
    }
  }
  end_word(e);
}

Structure scan_yaml(std::string_view s) {
  Structure st;
  struct Line {
    size_t begin, end, indent;
    bool blank;
  };
  std::vector<Line> lines;
  for (size_t b = 0; b <= s.size();) {
    const size_t e = line_end(s, b);
    size_t ind = b;
    while (ind < e && s[ind] == ' ') ++ind;
    const bool blank = ind == e || s[ind] == '#';
    lines.push_back({b, e, ind - b, blank});
    if (e == s.size()) break;
    b = e + 1;
  }
  for (size_t li = 0; li < lines.size(); ++li) {
    const Line& L = lines[li];
    if (L.blank) continue;
    const size_t ce = comment_start(s, L.begin, L.end);
    size_t p = L.begin + L.indent;
    if (s.compare(p, 2, "- ") == 0) p += 2;
    // "key:" followed by a blank or the end of the line.
    size_t k = p;
    while (k < ce && (std::isalnum(static_cast<unsigned char>(s[k])) || s[k] == '_')) ++k;
    const bool is_key = k > p && k < ce && s[k] == ':' && (k + 1 == ce || s[k + 1] == ' ');
    if (!is_key) {
      // A list item or a continuation: treat the rest as one scalar.
      size_t ve = ce;
      while (ve > p && s[ve - 1] == ' ') --ve;
      if (ve > p) st.scalars.push_back({p, ve, L.indent});
      continue;
    }
    st.scalars.push_back({p, k, L.indent});  // the key itself
    // The member runs to the next non-blank line indented no deeper than this one.
    size_t next = li + 1;
    while (next < lines.size() && (lines[next].blank || lines[next].indent > L.indent)) ++next;
    const size_t block_end = next < lines.size() ? lines[next].begin : s.size();
    st.members.push_back({L.begin, block_end, L.indent});
    size_t v = k + 1;
    while (v < ce && s[v] == ' ') ++v;
    size_t ve = ce;
    while (ve > v && s[ve - 1] == ' ') --ve;
    if (v == ve) {
      if (block_end > L.end) st.containers.push_back({k + 1, block_end, L.indent, true});
    } else if (s[v] == '[' || s[v] == '{') {
      scan_flow(s, v, ve, L.indent, st);
    } else {
      st.scalars.push_back({v, ve, L.indent});
      st.line_values.push_back({v, ve, L.indent});
      if (looks_numeric(s.substr(v, ve - v))) st.numbers.push_back({v, ve, L.indent});
    }
  }
  return st;
}

template <typename T>
const T* pick(const std::vector<T>& v, Rng& rng) {
  return v.empty() ? nullptr : &v[rng.below(v.size())];
}

std::string replace(std::string_view s, const Span& sp, std::string_view with) {
  std::string out(s.substr(0, sp.begin));
  out += with;
  out += s.substr(sp.end);
  return out;
}

// Byte sequences that are not UTF-8: a stray FF, lone continuation bytes, truncated sequences,
// overlong forms, a surrogate, a code point past U+10FFFF.
constexpr std::array<std::string_view, 10> kBadUtf8 = {
    "\xff",     "\xfe\xff",     "\x80",     "\xbf\xbf",     "\xc3",
    "\xe2\x82", "\xf0\x9f\x98", "\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80"};

// Values past what a parser's number types hold, or spelled in ways a converter may choke on.
constexpr std::array<std::string_view, 12> kHugeNumbers = {
    "1e999",
    "-1e999",
    "9223372036854775808",
    "-9223372036854775809",
    "18446744073709551616",
    "2147483648",
    "4294967296",
    "1e-400",
    "0x7fffffffffffffff",
    "-0",
    "1.7976931348623157e309",
    "123456789012345678901234567890123456789012345678901234567890"};

// YAML's less common syntax: anchors and aliases, tags, document markers, complex keys, tabs.
constexpr std::array<std::string_view, 12> kYamlTokens = {
    "&a ",   "*a", "!!binary ", "!!int ", "!custom ", "---\n",
    "...\n", "? ", "\t",        "|\n",    ">-\n",     "<<: *a\n"};

std::string random_bytes(Rng& rng, size_t n) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng.below(256));
  return out;
}

bool structural(std::string_view s, Syntax syntax, const Structure& st, Rng& rng, Mutation& m) {
  const bool json = syntax == Syntax::kJson;
  switch (rng.below(7)) {
    case 0: {  // a scalar where a list or a map belongs, and the other way round
      if (rng.one_in(2)) {
        const Span* sp = pick(st.scalars, rng);
        if (sp == nullptr) return false;
        static constexpr std::array<std::string_view, 4> kJson = {"[1, \"a\"]", "{\"k\": 1}", "[]",
                                                                  "{}"};
        static constexpr std::array<std::string_view, 4> kYaml = {"[a, 1]", "{k: v}", "[]", "{}"};
        m.text = replace(s, *sp, json ? kJson[rng.below(4)] : kYaml[rng.below(4)]);
        m.kind = "scalar-to-container";
        // In YAML a scalar after "key: " may also become a block list.
        if (!json && !st.line_values.empty() && rng.one_in(3)) {
          const Span& lv = st.line_values[rng.below(st.line_values.size())];
          const std::string pad(lv.indent + 2, ' ');
          m.text = replace(s, lv, "\n" + pad + "- a\n" + pad + "- 1");
          m.kind = "scalar-to-block-list";
        }
        return true;
      }
      const Span* sp = pick(st.containers, rng);
      if (sp == nullptr) return false;
      static constexpr std::array<std::string_view, 3> kScalars = {"7", "\"text\"", "true"};
      std::string with(kScalars[rng.below(3)]);
      if (sp->block) with = " " + with + "\n";
      m.text = replace(s, *sp, with);
      m.kind = "container-to-scalar";
      return true;
    }
    case 1: {  // a huge string
      const Span* sp = pick(st.scalars, rng);
      if (sp == nullptr) return false;
      // 16 KiB .. 128 KiB: past any buffer a parser might keep on the stack, small enough that
      // yaml-cpp (about 40 ms per MiB, three times that under ASan) keeps the run short.
      const size_t n = size_t{1} << (14 + rng.below(4));
      std::string big(n, static_cast<char>('a' + rng.below(26)));
      if (json) big = "\"" + big + "\"";
      m.text = replace(s, *sp, big);
      m.kind = "huge-string";
      return true;
    }
    case 2: {  // a huge or odd number
      const Span* sp = pick(st.numbers.empty() ? st.scalars : st.numbers, rng);
      if (sp == nullptr) return false;
      std::string with(kHugeNumbers[rng.below(kHugeNumbers.size())]);
      if (rng.one_in(4)) with = "9" + std::string(1000 + rng.below(9000), '9');
      m.text = replace(s, *sp, with);
      m.kind = "huge-number";
      return true;
    }
    case 3: {  // deep nesting at a value: 10^3 .. 10^5 levels, closed or not
      const Span* sp = pick(st.scalars, rng);
      if (sp == nullptr) return false;
      static constexpr std::array<size_t, 4> kDepths = {1000, 3000, 10000, 100000};
      const size_t depth = kDepths[rng.below(kDepths.size())];
      const bool maps = rng.one_in(2);
      const std::string_view open = maps ? (json ? "{\"a\":" : "{a: ") : "[";
      std::string with;
      with.reserve(depth * (open.size() + 1) + 2);
      for (size_t i = 0; i < depth; ++i) with += open;
      with += "1";
      if (!rng.one_in(4)) with += std::string(depth, maps ? '}' : ']');
      m.text = replace(s, *sp, with);
      m.kind = "deep-nesting";
      return true;
    }
    case 4: {  // a key twice
      const Span* sp = pick(st.members, rng);
      if (sp == nullptr) return false;
      const std::string member(s.substr(sp->begin, sp->end - sp->begin));
      std::string dup = json ? ", " + member : member;
      if (!json && (member.empty() || member.back() != '\n')) dup = "\n" + member;
      m.text = std::string(s.substr(0, sp->end)) + dup + std::string(s.substr(sp->end));
      m.kind = "duplicate-key";
      return true;
    }
    case 5: {  // invalid UTF-8 inside a value, where a lexer reads it as text
      const Span* sp = pick(st.scalars, rng);
      if (sp == nullptr) return false;
      const size_t at =
          sp->begin + (sp->end > sp->begin + 1 ? 1 + rng.below(sp->end - sp->begin - 1) : 0);
      m.text = std::string(s.substr(0, at)) + std::string(kBadUtf8[rng.below(kBadUtf8.size())]) +
               std::string(s.substr(at));
      m.kind = "invalid-utf8-in-value";
      return true;
    }
    default: {  // YAML's rarer syntax; for JSON, an empty or null value
      const Span* sp = pick(st.scalars, rng);
      if (sp == nullptr) return false;
      if (json) {
        static constexpr std::array<std::string_view, 4> kOdd = {"null", "\"\"", "-1", "0"};
        m.text = replace(s, *sp, kOdd[rng.below(kOdd.size())]);
        m.kind = "odd-value";
        return true;
      }
      const std::string_view tok = kYamlTokens[rng.below(kYamlTokens.size())];
      m.text =
          std::string(s.substr(0, sp->begin)) + std::string(tok) + std::string(s.substr(sp->begin));
      m.kind = "yaml-syntax";
      return true;
    }
  }
}

void bytewise(std::string& s, Rng& rng, std::string& kind) {
  const auto pos = [&](bool inclusive) { return rng.below(s.size() + (inclusive ? 1 : 0)); };
  switch (rng.below(7)) {
    case 0:
      s.resize(pos(true));
      kind += "truncate";
      return;
    case 1: {
      if (s.empty()) break;
      const size_t at = pos(false), n = std::min(1 + rng.below(8), s.size() - at);
      for (size_t i = 0; i < n; ++i) s[at + i] = static_cast<char>(rng.below(256));
      kind += "random-bytes";
      return;
    }
    case 2: {
      if (s.empty()) break;
      const size_t flips = 1 + rng.below(4);
      for (size_t i = 0; i < flips; ++i) s[pos(false)] ^= static_cast<char>(1u << rng.below(8));
      kind += "bit-flip";
      return;
    }
    case 3:
      s.insert(pos(true), random_bytes(rng, 1 + rng.below(16)));
      kind += "insert-bytes";
      return;
    case 4: {
      if (s.empty()) break;
      const size_t at = pos(false);
      s.erase(at, 1 + rng.below(std::min<size_t>(64, s.size() - at)));
      kind += "delete-bytes";
      return;
    }
    case 5: {  // a chunk copied elsewhere: brackets and quotes out of balance
      if (s.empty()) break;
      const size_t from = pos(false), n = 1 + rng.below(std::min<size_t>(32, s.size() - from));
      const std::string chunk = s.substr(from, n);
      s.insert(pos(true), chunk);
      kind += "copy-chunk";
      return;
    }
    default:
      break;
  }
  s.insert(pos(true), kBadUtf8[rng.below(kBadUtf8.size())]);
  kind += "invalid-utf8";
}

}  // namespace

Mutation mutate(std::string_view seed, Syntax syntax, Rng& rng) {
  Mutation m;
  // Half structural (each needs the seed's structure), half byte-level; a quarter of the
  // structural ones get a byte-level mutation on top.
  if (rng.one_in(2)) {
    const Structure st = syntax == Syntax::kJson ? scan_json(seed) : scan_yaml(seed);
    if (structural(seed, syntax, st, rng, m)) {
      if (rng.one_in(4)) {
        m.kind += "+";
        bytewise(m.text, rng, m.kind);
      }
      return m;
    }
  }
  m.text = std::string(seed);
  m.kind.clear();
  const size_t rounds = 1 + (rng.one_in(3) ? rng.below(4) : 0);
  for (size_t i = 0; i < rounds; ++i) {
    if (i) m.kind += "+";
    bytewise(m.text, rng, m.kind);
  }
  return m;
}

}  // namespace frt::fuzz
