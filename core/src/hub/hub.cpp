// The kernel path (DESIGN §5): find a package, refuse the variants this host cannot run using
// metadata and the core's CPU detector alone, then dlopen the survivors best ISA first and keep
// the first whose library agrees with its metadata. Every decision is kept as text. This file is
// the hub itself: the cache of outcomes, the unavailable report and the process hub; the steps
// live beside it (hub_internal.h lists them): hub_config.cpp, search.cpp, variants.cpp, load.cpp.
#include <flashrt/errors.h>
#include <flashrt/hub.h>
#include <flashrt/utf8.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "hub_internal.h"

namespace frt {
namespace {

namespace fs = std::filesystem;
using detail::has_metadata;
using detail::Outcome;

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
  auto printable_entry = [](UnavailableEntry& u) {
    for (std::string* s : {&u.repo, &u.version, &u.error, &u.detail}) make_printable(*s);
  };
  if (out.unavailable) printable_entry(*out.unavailable);
  for (UnavailableEntry& u : out.withheld) printable_entry(u);
}

}  // namespace

KernelHub::KernelHub(KernelPathConfig config, CpuFeatures cpu)
    : config_(std::move(config)), cpu_(std::move(cpu)) {}

const PackageResolution& KernelHub::resolve(const std::string& repo) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = resolved_.find(repo);
  if (it != resolved_.end()) return *it->second;

  Outcome out;
  try {
    out = detail::resolve_package(config_, cpu_, repo);
  } catch (const std::exception& e) {
    // Filesystem or allocation trouble: still an outcome, never an exception for the caller.
    out = Outcome{};
    out.resolution.repo = repo;
    out.unavailable = UnavailableEntry{repo, "", "loader error", e.what()};
  }
  make_printable(out);
  if (out.unavailable) out.withheld.push_back(*out.unavailable);
  for (const UnavailableEntry& u : out.withheld) {
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

const frt_kernel_table* KernelHub::op_choice(const std::string& key) const {
  std::lock_guard<std::mutex> lock(choices_mu_);
  const auto it = op_choices_.find(key);
  return it == op_choices_.end() ? nullptr : it->second;
}

void KernelHub::remember_op_choice(const std::string& key, const frt_kernel_table* table) {
  std::lock_guard<std::mutex> lock(choices_mu_);
  op_choices_[key] = table;
}

}  // namespace frt
