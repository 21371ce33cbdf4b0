#include "quant/weight_memory.h"

#include <flashrt/weight_memory.h>
#include <sys/mman.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace frt {

// Note [Weights in huge pages]
// A decode step streams every weight once, hundreds of MiB of it. In 4 KiB pages that is a TLB
// miss per 4 KiB, and under a hypervisor each miss walks two page tables. Measured on the AMX
// Xeon guest, one M = 1 call of a 3.2 MB int8 pack read from DRAM took 338 us in small pages and
// 291 us with its first 2 MiB in a huge page (one thread); on two threads the half in huge pages
// finished in 121 us, the half in small ones in 156.
//
// So weight memory comes from an arena of chunks that are 2 MiB aligned and advised
// MADV_HUGEPAGE before anything touches them: the kernel backs them with transparent huge pages
// where the system allows it (THP "madvise" or "always"; elsewhere the advice fails and they stay
// in small pages, still correct). Buffers are carved from a chunk one after another, so a 1 MiB
// projection, a pack's tail past its last whole 2 MiB and the scales beside it lie in huge pages
// too. The arena is needed, not only the advice: the C library serves a buffer below its mmap
// threshold from its heap, which that threshold rises to 32 MiB once a process frees a large
// block (torch does at once), and a heap block reused after being touched in small pages stays
// in them whatever is advised. In a PyTorch process 4 MiB of 1.1 GB of packs got huge pages that
// way.
//
// Pieces are never reused: fresh mapped memory is zero, so a piece needs no clearing. A freed
// piece's whole 2 MiB pages go back to the system (MADV_DONTNEED) at once, its partial pages when
// the chunk's last piece is freed and the chunk unmapped. FRT_HUGE_PAGES=0 (read at every
// allocation, so bench/kernels.py can pair the two) and AddressSanitizer builds (which must see
// every buffer's bounds) take the C library's zeroed 64-byte aligned blocks instead.
//
// The advice is a request. The kernel backs a fault with a huge page only where it finds (or
// compacts) a free 2 MiB run; in a process whose memory has fragmented the pieces land in small
// pages, silently (OLMo 2 1B's packs taken after a 40-layer Granite had run in the same process:
// 1175 huge-page faults fell back and its w4a8 loop read 70% of its floor, 81% in another
// run). weight_memory_pages() says how many of the arena's resident bytes are in huge pages
// (from /proc/self/smaps), and settle_weight_memory() asks the kernel to collapse the rest
// (MADV_COLLAPSE: synchronous, compacting as it goes, whatever khugepaged's pace).
namespace {

constexpr int64_t kHugePage = int64_t{1} << 21;
constexpr int64_t kChunkBytes = int64_t{32} << 20;  // a new chunk's least size

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }

bool huge_pages_wanted() {
  const char* env = std::getenv("FRT_HUGE_PAGES");
  return env == nullptr || std::strcmp(env, "0") != 0;
}

struct Chunk {
  int64_t length = 0;
  int64_t used = 0;  // the next piece starts here
  int64_t live = 0;  // pieces not yet freed
};

class Arena {
 public:
  void* take(int64_t size) {
    std::lock_guard lock(mu_);
    uintptr_t base = current_;
    if (base == 0 || chunks_.at(base).used + size > chunks_.at(base).length) base = map(size);
    Chunk& c = chunks_.at(base);
    const uintptr_t piece = base + static_cast<uintptr_t>(c.used);
    c.used += size;
    ++c.live;
    pieces_.emplace(piece, size);
    // The chunk with more room left serves the next piece (a large buffer's own chunk may have
    // less than the one it did not fit in).
    if (current_ == 0 || room(base) > room(current_)) current_ = base;
    return reinterpret_cast<void*>(piece);
  }

  // False when p is not the arena's.
  bool give(void* p) {
    std::lock_guard lock(mu_);
    const auto at = pieces_.find(reinterpret_cast<uintptr_t>(p));
    if (at == pieces_.end()) return false;
    const uintptr_t piece = at->first;
    const int64_t size = at->second;
    pieces_.erase(at);
    auto c = std::prev(chunks_.upper_bound(piece));
    if (--c->second.live == 0) {
      munmap(reinterpret_cast<void*>(c->first), static_cast<size_t>(c->second.length));
      if (current_ == c->first) current_ = 0;
      chunks_.erase(c);
      return true;
    }
    const auto first = static_cast<uintptr_t>(round_up(static_cast<int64_t>(piece), kHugePage));
    const uintptr_t end = (piece + static_cast<uintptr_t>(size)) / kHugePage * kHugePage;
    if (end > first) (void)madvise(reinterpret_cast<void*>(first), end - first, MADV_DONTNEED);
    return true;
  }

  WeightMemoryStats stats() {
    std::lock_guard lock(mu_);
    WeightMemoryStats s;
    s.chunks = static_cast<int64_t>(chunks_.size());
    for (const auto& [base, c] : chunks_) s.mapped_bytes += c.length;
    s.pieces = static_cast<int64_t>(pieces_.size());
    for (const auto& [piece, size] : pieces_) s.piece_bytes += size;
    return s;
  }

  // The chunks' [begin, end) address ranges, by address.
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges() {
    std::lock_guard lock(mu_);
    std::vector<std::pair<uintptr_t, uintptr_t>> out;
    for (const auto& [base, c] : chunks_)
      out.emplace_back(base, base + static_cast<uintptr_t>(c.length));
    return out;
  }

  // Asks the kernel to collapse the carved part of chunk `base` (whole 2 MiB pages up to the end
  // of its last piece: the tail past it stays untouched) into huge pages. Under the lock, so a
  // chunk freed meanwhile is not collapsed after its address went to someone else.
  void collapse(uintptr_t base, int advice) {
    std::lock_guard lock(mu_);
    const auto at = chunks_.find(base);
    if (at == chunks_.end() || at->second.live == 0) return;
    const int64_t span = std::min(round_up(at->second.used, kHugePage), at->second.length);
    (void)madvise(reinterpret_cast<void*>(base), static_cast<size_t>(span), advice);
  }

 private:
  int64_t room(uintptr_t base) const {
    const Chunk& c = chunks_.at(base);
    return c.length - c.used;
  }

  // A new chunk that holds at least `size`, 2 MiB aligned (the mapping is cut down to it).
  uintptr_t map(int64_t size) {
    const int64_t length = std::max(kChunkBytes, round_up(size, kHugePage));
    const auto span = static_cast<size_t>(length + kHugePage);
    void* m = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    const auto start = reinterpret_cast<uintptr_t>(m);
    const auto base = static_cast<uintptr_t>(round_up(static_cast<int64_t>(start), kHugePage));
    if (base > start) munmap(m, base - start);
    const uintptr_t end = base + static_cast<uintptr_t>(length);
    if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);
    (void)madvise(reinterpret_cast<void*>(base), static_cast<size_t>(length), MADV_HUGEPAGE);
    chunks_.emplace(base, Chunk{length, 0, 0});
    return base;
  }

  std::mutex mu_;
  std::map<uintptr_t, Chunk> chunks_;  // by base address
  std::unordered_map<uintptr_t, int64_t> pieces_;
  uintptr_t current_ = 0;  // the chunk the next piece is tried in
};

// Never destroyed: a static pack elsewhere may be freed after this file's statics are gone.
Arena& arena() {
  static Arena& a = *new Arena;
  return a;
}

}  // namespace

bool weight_memory_in_arena() { return !kSanitized && huge_pages_wanted(); }

void* alloc_weight_memory(int64_t bytes) {
  const int64_t size = round_up(std::max<int64_t>(bytes, 1), 64);
  if (weight_memory_in_arena()) return arena().take(size);
  void* p = nullptr;
  if (posix_memalign(&p, 64, static_cast<size_t>(size)) != 0) throw std::bad_alloc();
  std::memset(p, 0, static_cast<size_t>(size));
  return p;
}

void free_weight_memory(void* p) noexcept {
  if (p == nullptr) return;
  if (!arena().give(p)) std::free(p);
}

WeightMemoryStats weight_memory_stats() { return arena().stats(); }

namespace {

using Range = std::pair<uintptr_t, uintptr_t>;

int64_t overlap(const Range& a, const Range& b) {
  const uintptr_t lo = std::max(a.first, b.first), hi = std::min(a.second, b.second);
  return hi > lo ? static_cast<int64_t>(hi - lo) : 0;
}

// One smaps mapping: its range and its Rss and AnonHugePages in bytes.
struct Mapping {
  Range range{0, 0};
  int64_t rss = 0, huge = 0;
};

// The hex or decimal number at the start of `text`; false where there is none.
template <class T>
bool number(std::string_view text, int base, T* out) {
  const size_t at = text.find_first_not_of(' ');
  if (at == std::string_view::npos) return false;
  const auto [end, ec] = std::from_chars(text.data() + at, text.data() + text.size(), *out, base);
  return ec == std::errc() && end != text.data() + at;
}

// The mappings of /proc/self/smaps that overlap `chunks`; false where it cannot be read or
// parsed. Never throws: an attach that notes where its packs lie must not fail for it.
bool arena_mappings(const std::vector<Range>& chunks, std::vector<Mapping>* out) noexcept {
  try {
    std::ifstream smaps("/proc/self/smaps");
    if (!smaps) return false;
    std::string line;
    Mapping m;
    bool relevant = false;
    while (std::getline(smaps, line)) {
      const std::string_view v(line);
      const size_t dash = v.find('-'), space = v.find(' ');
      // A mapping's header: "begin-end perms offset dev inode [path]", addresses in hex; its
      // first ':' is the device's, after the first space (a field line's comes before it).
      if (dash != std::string_view::npos && space != std::string_view::npos && dash < space &&
          v.find(':') > space) {
        if (relevant) out->push_back(m);
        m = Mapping{};
        uintptr_t begin = 0, end = 0;
        if (!number(v.substr(0, dash), 16, &begin) ||
            !number(v.substr(dash + 1, space - dash - 1), 16, &end))
          return false;
        m.range = {begin, end};
        relevant = std::any_of(chunks.begin(), chunks.end(),
                               [&](const Range& c) { return overlap(c, m.range) > 0; });
        continue;
      }
      if (!relevant) continue;
      for (const auto& [field, to] : {std::pair{std::string_view("Rss:"), &m.rss},
                                      std::pair{std::string_view("AnonHugePages:"), &m.huge}}) {
        int64_t kib = 0;
        if (v.substr(0, field.size()) == field && number(v.substr(field.size()), 10, &kib))
          *to = kib * 1024;
      }
    }
    if (relevant) out->push_back(m);
    return true;
  } catch (...) {  // std::bad_alloc from the lines or the list
    return false;
  }
}

// Adds the resident and huge bytes of `chunks` among smaps' `maps` to `p`. A mapping that reaches
// past the chunks (the kernel merges neighbouring mappings with the same flags) counts in
// proportion to its overlap.
void count_pages(const std::vector<Range>& chunks, const std::vector<Mapping>& maps,
                 WeightMemoryPages* p) {
  for (const Mapping& m : maps) {
    int64_t inside = 0;
    for (const Range& c : chunks) inside += overlap(c, m.range);
    if (inside == 0) continue;
    const double share =
        static_cast<double>(inside) / static_cast<double>(m.range.second - m.range.first);
    p->resident_bytes += static_cast<int64_t>(static_cast<double>(m.rss) * share);
    p->huge_bytes += static_cast<int64_t>(static_cast<double>(m.huge) * share);
  }
}

// The pages of the arena's chunks now; `known` false in a sanitizer build (no arena) or where
// smaps cannot be read.
WeightMemoryPages read_pages() noexcept {
  WeightMemoryPages p;
  try {
    const std::vector<Range> chunks = arena().ranges();
    for (const Range& c : chunks) p.arena_bytes += static_cast<int64_t>(c.second - c.first);
    std::vector<Mapping> maps;
    if (kSanitized || !arena_mappings(chunks, &maps)) return p;
    count_pages(chunks, maps, &p);
    p.known = true;
  } catch (...) {  // std::bad_alloc
    p.known = false;
  }
  return p;
}

// Whether the system's THP setting is "never": the kernel's collapse would override it, and a
// machine set so has asked for no huge pages.
bool huge_pages_off_here() {
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  return !std::getline(thp, modes) || modes.find("[never]") != std::string::npos;
}

// glibc's headers may predate it; a kernel before 6.1 refuses it (EINVAL), which is harmless.
#if defined(MADV_COLLAPSE)
constexpr int kCollapse = MADV_COLLAPSE;
#else
constexpr int kCollapse = 25;
#endif

}  // namespace

WeightMemoryPages weight_memory_pages() { return read_pages(); }

// Collapsing a range already in huge pages returns at once, so every chunk is asked and smaps
// is read once, after.
WeightMemoryPages settle_weight_memory() {
#if defined(__linux__)
  if (weight_memory_in_arena() && !huge_pages_off_here())
    for (const Range& c : arena().ranges()) arena().collapse(c.first, kCollapse);
#endif
  return read_pages();
}

}  // namespace frt
