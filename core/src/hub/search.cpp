// Finding a package on the kernel path (DESIGN §5): LOCAL_KERNELS, then FLASHRT_KERNEL_PATH's
// roots in order, then the bundled root. Without a pin the first location that has the package
// is the package; a pin looks past other revisions for the one the user asked for. What is found
// goes to choose_variant (variants.cpp).
#include <flashrt/hub.h>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <utility>

#include "hub_internal.h"
#include "metadata.h"

namespace frt::detail {
namespace {

namespace fs = std::filesystem;

constexpr const char* kSourcePin = "pin";
constexpr const char* kSourceLocal = "LOCAL_KERNELS";
constexpr const char* kSourcePath = "FLASHRT_KERNEL_PATH";
constexpr const char* kSourceBundled = "bundled";

constexpr const char* kErrNotFound = "not found on the kernel path";
constexpr const char* kErrCorrupt = "corrupt metadata";
constexpr const char* kErrPin = "pinned revision not found";

bool is_repo_name(const std::string& s) {
  const size_t slash = s.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == s.size()) return false;
  if (s.find('/', slash + 1) != std::string::npos) return false;
  const std::string org = s.substr(0, slash), pkg = s.substr(slash + 1);
  return org != "." && org != ".." && pkg != "." && pkg != "..";
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

}  // namespace

bool has_metadata(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "metadata.json", ec);
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
        PackageMetadata m = read_metadata(loc.dir, repo);
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
      md = read_metadata(it->dir, repo);
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

}  // namespace frt::detail
