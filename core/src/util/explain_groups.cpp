#include "util/explain_groups.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string_view>

namespace frt::detail {

// Note [Explain groups]
// ~~~~~~~~~~~~~~~~~~~~~
// Entries are merged only when their texts are equal once one index of the site's path is
// blanked out wherever the text writes that path prefix with that index ("model.layers.7" in
// "model.layers.7.mlp: ..."), so a merged line says exactly what each member's line said: the
// same structure, shape, impl, form, band, ladder and reason. A reason naming another layer, or a
// count that differs, keeps the entries apart. Numbers that are not path components (shapes,
// rows, weight counts) are never touched.
//
// Which index: the outermost first. Entries that find no partner there are tried on their next
// index, and so on, so "down.1.attn.{0..1}" groups where only the inner index varies. A path
// is grouped along one index only: a grid blocks.{0..3}.attn.{0..1} prints as two lines,
// "blocks.{0..3}.attn.0 ... x4" and "blocks.{0..3}.attn.1 ... x4"; merging the product as well
// would need every combination present, and two lines of eight stay readable.
//
// A group's members have distinct indices (the same index twice would make "{0..1} x3"): a
// repeated entry goes to a further group, or stands alone. A single member is printed as the
// verbose form prints it, without braces or a count.

const char* const kGroupedNote =
    "\n(entries that differ only by one index of their path are written once: {a..b} is the "
    "index set, xN the count; the verbose form lists each)\n";

namespace {

constexpr char kMark = '\x01';  // where the index stood in a template; no explain text holds it

bool is_index(std::string_view c) {
  // Nine digits at most (fits long long); "07" is a name, not an index.
  if (c.empty() || c.size() > 9 || (c.size() > 1 && c[0] == '0')) return false;
  return std::all_of(c.begin(), c.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
}

bool ident(char ch) {
  return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
         ch == '_';
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t dot = path.find('.'); dot != std::string::npos; dot = path.find('.', start)) {
    parts.push_back(path.substr(start, dot - start));
    start = dot + 1;
  }
  parts.push_back(path.substr(start));
  return parts;
}

// The path prefix that carries the site's n-th index ("model.layers.7"), what replaces it in a
// template ("model.layers.<mark>"), and the index.
struct Cut {
  std::string needle, replacement;
  long long index = 0;
};

std::optional<Cut> cut(const std::string& site, size_t n) {
  if (site.empty()) return std::nullopt;
  const std::vector<std::string> parts = split_path(site);
  size_t seen = 0;
  for (size_t c = 0; c < parts.size(); ++c) {
    if (!is_index(parts[c]) || seen++ != n) continue;
    Cut k;
    k.index = std::stoll(parts[c]);
    if (c == 0) {
      // A path that starts with an index (an nn.Sequential's "0.weight"): a bare number is too
      // common in a text to stand for the path, so the next component goes with it.
      if (parts.size() < 2) return std::nullopt;
      k.needle = parts[0] + "." + parts[1];
      k.replacement = std::string(1, kMark) + "." + parts[1];
      return k;
    }
    std::string prefix;
    for (size_t i = 0; i < c; ++i) prefix += parts[i] + ".";
    k.needle = prefix + parts[c];
    k.replacement = prefix + kMark;
    return k;
  }
  return std::nullopt;
}

// text with every occurrence of the cut's needle that stands as a whole path prefix (no name
// character or dot before it, no name character after it) replaced.
std::string blank(const std::string& text, const Cut& k) {
  std::string out;
  size_t from = 0;
  for (size_t at = text.find(k.needle); at != std::string::npos; at = text.find(k.needle, at + 1)) {
    const size_t end = at + k.needle.size();
    const bool starts = at == 0 || !(ident(text[at - 1]) || text[at - 1] == '.');
    const bool ends = end == text.size() || !ident(text[end]);
    if (at < from || !starts || !ends) continue;
    out.append(text, from, at - from);
    out += k.replacement;
    from = end;
  }
  out.append(text, from, std::string::npos);
  return out;
}

struct Group {
  std::string text;  // the template
  std::vector<long long> indices;
};

std::string render(const Group& g) {
  const std::string set = "{" + index_set(g.indices) + "}";
  std::string out;
  for (char ch : g.text) {
    if (ch == kMark)
      out += set;
    else
      out += ch;
  }
  const std::string count = "  x" + std::to_string(g.indices.size());
  const size_t eol = out.find('\n');
  if (eol == std::string::npos)
    out += count;
  else
    out.insert(eol, count);
  return out;
}

}  // namespace

std::string index_set(std::vector<long long> indices) {
  std::sort(indices.begin(), indices.end());
  indices.erase(std::unique(indices.begin(), indices.end()), indices.end());
  std::string out;
  for (size_t i = 0; i < indices.size();) {
    size_t j = i;
    while (j + 1 < indices.size() && indices[j + 1] == indices[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += std::to_string(indices[i]);
    if (j > i) out += ".." + std::to_string(indices[j]);
    i = j + 1;
  }
  return out;
}

std::string group_entries(const std::vector<ExplainEntry>& entries, bool* merged) {
  const size_t n = entries.size();
  std::vector<int> group_of(n, -1);
  std::vector<size_t> first_of;  // per group, its first member
  std::vector<Group> groups;
  for (size_t level = 0;; ++level) {
    // Per template (site and text with this level's index blanked), its ungrouped members in
    // order; templates in the order of their first member.
    std::map<std::string, std::vector<std::pair<size_t, long long>>> members;
    std::vector<std::string> order;
    std::map<std::string, std::string> text_of;
    bool deeper = false;
    for (size_t i = 0; i < n; ++i) {
      if (group_of[i] != -1) continue;
      const ExplainEntry& e = entries[i];
      const std::optional<Cut> k = cut(e.site, level);
      if (!k) continue;
      deeper = true;
      if (e.text.find(kMark) != std::string::npos) continue;
      const std::string text = blank(e.text, *k);
      const std::string key = blank(e.site, *k) + '\0' + text;
      auto [it, fresh] = members.try_emplace(key);
      if (fresh) {
        order.push_back(key);
        text_of[key] = text;
      }
      it->second.emplace_back(i, k->index);
    }
    if (!deeper) break;
    for (const std::string& key : order) {
      std::vector<std::pair<size_t, long long>> left = members[key];
      while (left.size() >= 2) {
        std::vector<std::pair<size_t, long long>> take, rest;
        for (const auto& m : left) {
          const bool repeat = std::any_of(take.begin(), take.end(),
                                          [&](const auto& t) { return t.second == m.second; });
          (repeat ? rest : take).push_back(m);
        }
        if (take.size() < 2) break;
        Group g;
        g.text = text_of[key];
        for (const auto& [i, index] : take) {
          group_of[i] = static_cast<int>(groups.size());
          g.indices.push_back(index);
        }
        first_of.push_back(take.front().first);
        groups.push_back(std::move(g));
        left = std::move(rest);
      }
    }
  }
  if (merged != nullptr) *merged = !groups.empty();
  std::string out;
  for (size_t i = 0; i < n; ++i) {
    if (group_of[i] == -1)
      out += entries[i].text;
    else if (first_of[static_cast<size_t>(group_of[i])] == i)
      out += render(groups[static_cast<size_t>(group_of[i])]);
  }
  return out;
}

}  // namespace frt::detail
