// The kernel path (DESIGN §5): find a package, refuse the variants this host cannot run using
// metadata and the core's CPU detector alone, then dlopen the survivors best ISA first and keep
// the first whose library agrees with its metadata. Every decision is kept as text.
#include <dlfcn.h>
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/utf8.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>

#include "metadata.h"
#include "sha256.h"

extern char** environ;

namespace frt {
namespace {

namespace fs = std::filesystem;
using detail::MetadataError;
using detail::PackageMetadata;
using detail::VariantMetadata;

constexpr const char* kSourcePin = "pin";
constexpr const char* kSourceLocal = "LOCAL_KERNELS";
constexpr const char* kSourcePath = "FLASHRT_KERNEL_PATH";
constexpr const char* kSourceBundled = "bundled";
constexpr const char* kPinPrefix = "FRT_KERNEL_REV_";

constexpr const char* kErrNotFound = "not found on the kernel path";
constexpr const char* kErrCorrupt = "corrupt metadata";
constexpr const char* kErrPin = "pinned revision not found";
constexpr const char* kErrNoVariant = "no build variant for this host";

// The loader hands the whole ABI 2.0 table to the runtime, so every member up to the last one
// must lie inside what the package says it filled.
constexpr size_t kTableBytesRead = offsetof(frt_kernel_table, ops) + sizeof(frt_kernel_table::ops);

// "" when the op list is usable: every op names a kind once and can be asked and run.
std::string op_list_refusal(const frt_kernel_table& t) {
  if (t.supports_op == nullptr) return "table has no supports_op";
  if (t.n_ops < 0 || (t.n_ops > 0 && t.ops == nullptr))
    return "table lists " + std::to_string(t.n_ops) + " ops without an op array";
  std::set<int32_t> kinds;
  for (int32_t i = 0; i < t.n_ops; ++i) {
    const frt_op& op = t.ops[i];
    if (op.supports == nullptr || op.run == nullptr || op.phases < 1)
      return "op " + std::to_string(i) + " (kind " + std::to_string(op.kind) +
             ") lacks supports, run or phases";
    if (!kinds.insert(op.kind).second)
      return "op kind " + std::to_string(op.kind) + " listed twice";
  }
  return "";
}

// Every feature name the detector can report; anything else in a variant's "requires" is a
// feature this loader cannot vouch for.
const std::set<std::string>& known_features() {
  static const std::set<std::string> kKnown = {
      "sse2", "sse4_1",  "sse4_2",   "avx",      "avx2",     "fma",         "f16c",
      "bmi2", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16"};
  return kKnown;
}

// Higher is better; 0 = an ISA this loader does not know.
int isa_rank(const std::string& isa) {
  if (isa == "avx512vnni") return 3;
  if (isa == "avx2") return 2;
  if (isa == "generic") return 1;
  return 0;
}

std::string abi_refusal(int32_t theirs) {
  return "ABI version " + std::to_string(theirs) + ", loader speaks " +
         std::to_string(FRT_KERNEL_ABI_MAJOR);
}

bool is_repo_name(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == s.size()) return false;
  if (s.find('/', slash + 1) != std::string::npos) return false;
  const std::string org = s.substr(0, slash), pkg = s.substr(slash + 1);
  return org != "." && org != ".." && pkg != "." && pkg != "..";
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));  // empty elements ignored
    start = end + 1;
  }
  return out;
}

bool has_metadata(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "metadata.json", ec);
}

struct Location {
  const char* source;
  fs::path dir;  // the package folder: holds metadata.json
};

// DESIGN §5 order: LOCAL_KERNELS, FLASHRT_KERNEL_PATH roots in order, the bundled root.
std::vector<Location> locations_for(const KernelPathConfig& c, const std::string& repo) {
  std::vector<Location> out;
  for (const auto& [r, path] : c.local_kernels) {
    if (r == repo) out.push_back({kSourceLocal, fs::path(path)});
  }
  for (const std::string& root : c.roots) out.push_back({kSourcePath, fs::path(root) / repo});
  if (!c.bundled_root.empty()) out.push_back({kSourceBundled, fs::path(c.bundled_root) / repo});
  return out;
}

std::string describe(const std::vector<Location>& locs) {
  if (locs.empty())
    return "searched: nothing (no LOCAL_KERNELS, FLASHRT_KERNEL_PATH or bundled root)";
  std::string out = "searched: ";
  for (size_t i = 0; i < locs.size(); ++i) {
    if (i) out += ", ";
    out += std::string(locs[i].source) + " " + locs[i].dir.string();
  }
  return out;
}

std::optional<std::pair<std::string, std::string>> pin_for(const KernelPathConfig& c,
                                                           const std::string& repo) {
  const std::string var = pin_variable(repo);
  auto it = c.pins.find(repo);
  if (it != c.pins.end() && !it->second.empty()) return std::make_pair(var, it->second);
  auto vit = c.pin_variables.find(var);
  if (vit != c.pin_variables.end() && !vit->second.empty()) return std::make_pair(var, vit->second);
  return std::nullopt;
}

// dlopen + the ABI handshake. On success the library stays loaded for the life of the process
// (tables point into it); on failure it is closed and *why says what went wrong.
const frt_kernel_table* load_library(const fs::path& path, const VariantMetadata* meta,
                                     std::string* why) {
  dlerror();  // clear a stale message so the one we report belongs to this call
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* msg = dlerror();
    *why = std::string("dlopen failed: ") + (msg ? msg : "unknown error");
    return nullptr;
  }
  const auto refuse = [&](std::string reason) -> const frt_kernel_table* {
    dlclose(handle);
    *why = std::move(reason);
    return nullptr;
  };
  void* query_sym = dlsym(handle, "frt_kpkg_query");
  if (query_sym == nullptr) return refuse("not a kernel package: missing symbol frt_kpkg_query");
  void* open_sym = dlsym(handle, "frt_kpkg_open");
  if (open_sym == nullptr) return refuse("not a kernel package: missing symbol frt_kpkg_open");
  const auto query = reinterpret_cast<frt_kpkg_query_fn>(query_sym);
  const auto open = reinterpret_cast<frt_kpkg_open_fn>(open_sym);

  // query lives in an object built without ISA flags, so it is safe before any CPU check.
  frt_kpkg_info info{};
  const int32_t status = query(&info);
  if (status != FRT_OK)
    return refuse("frt_kpkg_query failed with status " + std::to_string(status));
  if (info.abi_major != FRT_KERNEL_ABI_MAJOR) return refuse(abi_refusal(info.abi_major));
  if (meta != nullptr) {
    const std::string isa = info.isa ? info.isa : "";
    if (isa != meta->isa) {
      return refuse("query reports isa '" + isa + "', metadata declares '" + meta->isa + "'");
    }
    const std::string arch = info.arch ? info.arch : "";
    if (arch != meta->arch) {
      return refuse("query reports arch '" + arch + "', metadata declares '" + meta->arch + "'");
    }
  }

  const frt_kernel_table* table = open(FRT_KERNEL_ABI_MAJOR);
  if (table == nullptr) {
    return refuse("frt_kpkg_open refused ABI " + std::to_string(FRT_KERNEL_ABI_MAJOR));
  }
  if (table->abi_major != FRT_KERNEL_ABI_MAJOR) {
    return refuse("table " + abi_refusal(table->abi_major));
  }
  if (table->struct_size < 0 || static_cast<size_t>(table->struct_size) < kTableBytesRead) {
    return refuse("table struct_size " + std::to_string(table->struct_size) +
                  " is smaller than the " + std::to_string(kTableBytesRead) + " bytes loader ABI " +
                  std::to_string(FRT_KERNEL_ABI_MAJOR) + "." +
                  std::to_string(FRT_KERNEL_ABI_MINOR) + " reads");
  }
  if (std::string why = op_list_refusal(*table); !why.empty()) return refuse(why);
  return table;
}

// Metadata-only refusals (no dlopen): arch, OS, CPU features, ABI, ISA. "" = may be tried.
std::string static_refusal(const VariantMetadata& v, const PackageMetadata& md,
                           const CpuFeatures& cpu) {
  if (v.arch != cpu.arch) {
    return "CPU (" + v.arch + ") does not match system CPU (" + cpu.arch + ")";
  }
  if (v.os != cpu.os) return "OS (" + v.os + ") does not match system OS (" + cpu.os + ")";
  // The ISA's own features count even when metadata forgot to list them: running an avx2
  // library on a CPU without avx2 is a SIGILL, not a refusal.
  std::vector<std::string> needs = v.requires_features;
  if (isa_rank(v.isa) > 0) {
    for (const std::string& f : tier_features(v.isa)) needs.push_back(f);
  }
  for (const std::string& f : needs) {
    if (!known_features().count(f)) return "variant needs unknown CPU feature '" + f + "'";
    if (!cpu.has(f)) return "variant needs " + f + ", this CPU has " + cpu.tier();
  }
  if (md.abi_major != FRT_KERNEL_ABI_MAJOR) return abi_refusal(md.abi_major);
  if (isa_rank(v.isa) == 0) return "unknown isa '" + v.isa + "'";
  return "";
}

// Refusals that need the file: presence, digest, then the ABI handshake.
const frt_kernel_table* try_variant(const VariantMetadata& v, std::string* why) {
  std::error_code ec;
  if (!fs::is_regular_file(v.library_path, ec)) {
    *why = "library file missing: " + v.library_path.string();
    return nullptr;
  }
  const std::optional<std::string> digest = detail::sha256_file_hex(v.library_path);
  if (!digest) {
    *why = "library file unreadable: " + v.library_path.string();
    return nullptr;
  }
  if (*digest != v.sha256) {
    *why = "library digest mismatch: metadata sha256 " + v.sha256 + ", file " + *digest;
    return nullptr;
  }
  return load_library(v.library_path, &v, why);
}

struct Outcome {
  PackageResolution resolution;
  std::optional<UnavailableEntry> unavailable;
};

// Everything the hub records is handed out as text and reaches Python as str. Paths and values
// read from metadata are bytes, not necessarily UTF-8, so they are escaped once, here, where an
// outcome is recorded: a refusal must stay printable, never become a UnicodeDecodeError.
void make_printable(std::string& s) {
  if (!is_valid_utf8(s)) s = escape_invalid_utf8(s);
}

void make_printable(Outcome& out) {
  PackageResolution& r = out.resolution;
  for (std::string* s : {&r.repo, &r.version, &r.revision, &r.dir, &r.source, &r.chosen}) {
    make_printable(*s);
  }
  for (VariantDecision& d : r.variants) {
    for (std::string* s : {&d.name, &d.isa, &d.library, &d.reason}) make_printable(*s);
  }
  if (out.unavailable) {
    UnavailableEntry& u = *out.unavailable;
    for (std::string* s : {&u.repo, &u.version, &u.error, &u.detail}) make_printable(*s);
  }
}

void choose_variant(const PackageMetadata& md, const CpuFeatures& cpu, Outcome* out) {
  PackageResolution& res = out->resolution;
  std::vector<size_t> candidates;
  for (size_t i = 0; i < md.variants.size(); ++i) {
    const VariantMetadata& v = md.variants[i];
    VariantDecision d;
    d.name = v.name;
    d.isa = v.isa;
    d.library = v.library_path.string();
    d.reason = static_refusal(v, md, cpu);
    if (d.reason.empty()) candidates.push_back(i);
    res.variants.push_back(std::move(d));
  }
  std::stable_sort(candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
    return isa_rank(md.variants[a].isa) > isa_rank(md.variants[b].isa);
  });
  for (size_t i : candidates) {
    VariantDecision& d = res.variants[i];
    if (!res.chosen.empty()) {
      d.reason = "not tried: " + res.chosen + " chosen";
      continue;
    }
    const frt_kernel_table* table = try_variant(md.variants[i], &d.reason);
    if (table != nullptr) {
      d.chosen = true;
      d.reason.clear();
      res.chosen = d.name;
      res.table = table;
    }
  }
  if (res.table != nullptr) return;

  std::string detail;
  for (const VariantDecision& d : res.variants) {
    if (!detail.empty()) detail += "; ";
    detail += d.name + ": " + d.reason;
  }
  if (detail.empty()) detail = "metadata declares no variants";
  out->unavailable = UnavailableEntry{res.repo, res.version, kErrNoVariant, detail};
}

Outcome resolve_package(const KernelPathConfig& config, const CpuFeatures& cpu,
                        const std::string& repo) {
  Outcome out;
  PackageResolution& res = out.resolution;
  res.repo = repo;
  const auto fail = [&](std::string version, std::string error, std::string detail) {
    out.unavailable =
        UnavailableEntry{repo, std::move(version), std::move(error), std::move(detail)};
  };
  if (!is_repo_name(repo)) {
    fail("", "invalid package name '" + repo + "'", "expected '<org>/<package>'");
    return out;
  }

  const std::vector<Location> locs = locations_for(config, repo);
  std::optional<PackageMetadata> md;
  if (const auto pin = pin_for(config, repo)) {
    // A pin looks past broken or other-revision packages: the user asked for one exact build.
    std::string found;
    for (const Location& loc : locs) {
      if (!has_metadata(loc.dir)) continue;
      if (!found.empty()) found += ", ";
      try {
        PackageMetadata m = detail::read_metadata(loc.dir, repo);
        if (m.revision == pin->second) {
          md = std::move(m);
          res.source = kSourcePin;
          break;
        }
        found += m.revision + " (" + m.dir.string() + ")";
      } catch (const MetadataError& e) {
        found += std::string("unreadable (") + e.what() + ")";
      }
    }
    if (!md) {
      fail("", kErrPin,
           pin->first + "=" + pin->second +
               "; found revisions: " + (found.empty() ? "none (" + describe(locs) + ")" : found));
      return out;
    }
  } else {
    // The first location that has the package is the package: a broken one is reported, never
    // silently replaced by an older copy further down the path.
    auto it = std::find_if(locs.begin(), locs.end(),
                           [](const Location& l) { return has_metadata(l.dir); });
    if (it == locs.end()) {
      fail("", "package '" + repo + "' " + kErrNotFound, describe(locs));
      return out;
    }
    res.source = it->source;
    try {
      md = detail::read_metadata(it->dir, repo);
    } catch (const MetadataError& e) {
      res.dir = fs::absolute(it->dir).lexically_normal().string();
      fail("", kErrCorrupt, e.what());
      return out;
    }
  }

  res.version = md->version;
  res.revision = md->revision;
  res.dir = md->dir.string();
  choose_variant(*md, cpu, &out);
  return out;
}

}  // namespace

std::string pin_variable(const std::string& repo) {
  std::string out = kPinPrefix;
  for (unsigned char c : repo) out.push_back(std::isalnum(c) ? std::toupper(c) : '_');
  return out;
}

KernelPathConfig KernelPathConfig::from_env(std::string bundled_root,
                                            const std::vector<std::string>& repos,
                                            const Getenv& getenv) {
  KernelPathConfig c;
  c.bundled_root = std::move(bundled_root);
  if (const char* lk = getenv("LOCAL_KERNELS")) {
    for (const std::string& item : split(lk, ':')) {
      const size_t eq = item.find('=');
      if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
        throw InvalidArgument("LOCAL_KERNELS: element '" + escape_invalid_utf8(item) +
                              "' is not <org>/<package>=<path>");
      }
      c.local_kernels.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
  }
  if (const char* kp = getenv("FLASHRT_KERNEL_PATH")) c.roots = split(kp, ':');

  std::set<std::string> named;
  for (const std::string& repo : repos) {
    const std::string var = pin_variable(repo);
    named.insert(var);
    const char* rev = getenv(var.c_str());
    if (rev != nullptr && *rev != '\0') c.pins[repo] = rev;
  }
  // Pins for repos nobody listed: names come from the real environment, values through `getenv`
  // so a test's fake environment stays the only source of values.
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq == nullptr) continue;
    const std::string name(*e, static_cast<size_t>(eq - *e));
    if (name.rfind(kPinPrefix, 0) != 0 || named.count(name)) continue;
    const char* rev = getenv(name.c_str());
    if (rev != nullptr && *rev != '\0') c.pin_variables[name] = rev;
  }
  return c;
}

KernelHub::KernelHub(KernelPathConfig config, CpuFeatures cpu)
    : config_(std::move(config)), cpu_(std::move(cpu)) {}

const PackageResolution& KernelHub::resolve(const std::string& repo) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = resolved_.find(repo);
  if (it != resolved_.end()) return *it->second;

  Outcome out;
  try {
    out = resolve_package(config_, cpu_, repo);
  } catch (const std::exception& e) {
    // Filesystem or allocation trouble: still an outcome, never an exception for the caller.
    out = Outcome{};
    out.resolution.repo = repo;
    out.unavailable = UnavailableEntry{repo, "", "loader error", e.what()};
  }
  make_printable(out);
  if (out.unavailable) {
    const UnavailableEntry& u = *out.unavailable;
    const bool dup = std::any_of(unavailable_.begin(), unavailable_.end(), [&](const auto& e) {
      return e.repo == u.repo && e.error == u.error;
    });
    if (!dup) unavailable_.push_back(u);
  }
  auto& slot = resolved_[repo];
  slot = std::make_unique<PackageResolution>(std::move(out.resolution));
  return *slot;
}

const frt_kernel_table& KernelHub::table(const std::string& repo) {
  const PackageResolution& r = resolve(repo);
  if (r.table != nullptr) return *r.table;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = unavailable_.rbegin(); it != unavailable_.rend(); ++it) {
    if (it->repo == repo) {
      throw KernelUnavailable(escape_invalid_utf8(repo + ": " + it->error + ": " + it->detail));
    }
  }
  // Only reachable when clear_unavailable_report() ran between the two locks.
  throw KernelUnavailable(escape_invalid_utf8(repo) +
                          ": unavailable (report was cleared; resolve again)");
}

std::vector<UnavailableEntry> KernelHub::unavailable_report() const {
  std::lock_guard<std::mutex> lock(mu_);
  return unavailable_;
}

void KernelHub::clear_unavailable_report() {
  std::lock_guard<std::mutex> lock(mu_);
  unavailable_.clear();
  // Chosen libraries stay: they are never unloaded and their tables may be in use.
  for (auto it = resolved_.begin(); it != resolved_.end();) {
    if (it->second->table == nullptr) {
      retired_.push_back(std::move(it->second));
      it = resolved_.erase(it);
    } else {
      ++it;
    }
  }
}

std::vector<PackageResolution> KernelHub::resolutions() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<PackageResolution> out;
  for (const auto& [repo, res] : resolved_) out.push_back(*res);
  return out;
}

std::vector<std::string> KernelHub::visible_packages() const {
  std::set<std::string> found;
  for (const auto& [repo, path] : config_.local_kernels) {
    if (has_metadata(path)) found.insert(escape_invalid_utf8(repo));
  }
  std::vector<std::string> roots = config_.roots;
  if (!config_.bundled_root.empty()) roots.push_back(config_.bundled_root);
  for (const std::string& root : roots) {
    std::error_code ec;
    for (fs::directory_iterator org(root, ec), end; !ec && org != end; org.increment(ec)) {
      std::error_code ec2;
      if (!org->is_directory(ec2)) continue;
      for (fs::directory_iterator pkg(org->path(), ec2); !ec2 && pkg != end; pkg.increment(ec2)) {
        // Folder names are bytes; a name that is not UTF-8 is listed escaped (it then resolves
        // as not found, legibly) rather than breaking the whole listing in Python.
        if (has_metadata(pkg->path())) {
          found.insert(escape_invalid_utf8(org->path().filename().string() + "/" +
                                           pkg->path().filename().string()));
        }
      }
    }
  }
  return {found.begin(), found.end()};
}

namespace {

std::mutex g_process_mu;
std::string g_bundled_root;
// Never destroyed: tables it handed out point into libraries that stay loaded until exit, and
// threads may still ask it during shutdown.
KernelHub* g_process_hub = nullptr;

}  // namespace

void set_bundled_root(std::string root) {
  std::lock_guard<std::mutex> lock(g_process_mu);
  if (g_process_hub != nullptr) {
    if (root == g_bundled_root) return;  // a repeated import saying the same thing is harmless
    throw InvalidArgument(escape_invalid_utf8("set_bundled_root('" + root +
                                              "') after the process kernel hub was created with " +
                                              "bundled root '" + g_bundled_root + "'"));
  }
  g_bundled_root = std::move(root);
}

KernelHub& process_hub() {
  std::lock_guard<std::mutex> lock(g_process_mu);
  if (g_process_hub == nullptr) {
    KernelPathConfig config = KernelPathConfig::from_env(
        g_bundled_root, {"flashrt/linear", "flashrt/ffn"},
        [](const char* name) -> const char* { return std::getenv(name); });
    g_process_hub = new KernelHub(std::move(config));
  }
  return *g_process_hub;
}

const frt_kernel_table* open_variant_library(const std::string& path, std::string* why) {
  std::string reason;
  const frt_kernel_table* table = nullptr;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    reason = "library file missing: " + path;
  } else {
    table = load_library(fs::path(path), nullptr, &reason);
  }
  if (table == nullptr && why != nullptr) *why = escape_invalid_utf8(reason);
  return table;
}

}  // namespace frt
