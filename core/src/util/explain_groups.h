// explain()'s grouping: a 30-layer decoder has 30 seats that differ only by the layer index, and a
// plan that lists them one per line hides the few lines that differ (Note [Explain groups]).
#pragma once

#include <string>
#include <vector>

namespace frt::detail {

// One entry of an explain() section: the site it is about (a dotted module path, "" for none)
// and its text as the verbose form prints it, one or more lines each ending in '\n', the site
// written in it as it is.
struct ExplainEntry {
  std::string site;
  std::string text;
};

// The entries' texts, those that differ only by one index of their site's path merged into one
// entry: the index written as the set ("{0..29}", "{0..3,5,7..9}"), "  xN" after its first line.
// A group has at least two members; every other entry is printed as it is. Groups come in the
// order of their first member. Sets the flag when anything was merged.
std::string group_entries(const std::vector<ExplainEntry>& entries, bool* merged = nullptr);

// The sorted distinct indices as explain() writes them: runs of two or more as "a..b", joined
// by commas ({0..3,5,7..9}).
std::string index_set(std::vector<long long> indices);

// The line explain() adds when group_entries merged anything.
extern const char* const kGroupedNote;

}  // namespace frt::detail
