// The kernel path: finds kernel packages, picks the best build variant this CPU runs, loads it,
// and keeps every refusal verbatim (DESIGN §5).
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/cpu_features.h>

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace frt {

// One row of unavailable_report(): a package that could not be used, and exactly why.
struct UnavailableEntry {
  std::string repo;     // "flashrt/linear"
  std::string version;  // the metadata's version, or "" when no metadata was readable
  std::string error;    // headline, e.g. "no build variant for this host"
  std::string detail;   // verbatim reasons, e.g. "cpu-x86_64-linux-avx512vnni: variant needs ..."
};

// What the loader decided about one declared variant.
struct VariantDecision {
  std::string name;     // "cpu-x86_64-linux-avx2"
  std::string isa;      // "avx2"
  std::string library;  // absolute path
  // The library's sha256 as metadata.json declares it; the file is hashed and checked against it
  // before a variant is loaded, so for the chosen one it is the digest of what runs.
  std::string sha256;
  bool chosen = false;
  std::string reason;  // why it was refused or not tried; "" for the chosen one
};

struct PackageResolution {
  std::string repo;
  std::string version;
  std::string revision;
  std::string dir;     // the package folder that was used
  std::string source;  // "pin", "LOCAL_KERNELS", "FLASHRT_KERNEL_PATH" or "bundled"
  std::vector<VariantDecision> variants;
  std::string chosen;  // variant name; "" when unavailable
  const frt_kernel_table* table = nullptr;
};

// Where packages are looked for, in DESIGN §5 order.
struct KernelPathConfig {
  std::vector<std::pair<std::string, std::string>> local_kernels;  // LOCAL_KERNELS repo=path
  std::vector<std::string> roots;                                  // FLASHRT_KERNEL_PATH
  std::string bundled_root;                                        // shipped with the install
  std::map<std::string, std::string> pins;                         // repo -> revision
  // FRT_KERNEL_REV_<PACKAGE> -> revision for pins whose repo from_env was not told about; a repo
  // is matched to one at resolve time through pin_variable(repo).
  std::map<std::string, std::string> pin_variables;

  using Getenv = std::function<const char*(const char*)>;
  // Reads LOCAL_KERNELS, FLASHRT_KERNEL_PATH and FRT_KERNEL_REV_<PACKAGE> for `repos`
  // (PACKAGE = repo upper-cased, every non-alphanumeric character replaced by '_'), plus every
  // other FRT_KERNEL_REV_* name in the process environment into pin_variables (values are still
  // read through `getenv`). Empty list elements are ignored; a LOCAL_KERNELS element that is not
  // <repo>=<path> throws InvalidArgument.
  static KernelPathConfig from_env(std::string bundled_root, const std::vector<std::string>& repos,
                                   const Getenv& getenv);
};

// The environment variable that pins `repo`: "flashrt/linear" -> "FRT_KERNEL_REV_FLASHRT_LINEAR".
std::string pin_variable(const std::string& repo);

class KernelHub {
 public:
  explicit KernelHub(KernelPathConfig config, CpuFeatures cpu = detect_cpu());
  KernelHub(const KernelHub&) = delete;
  KernelHub& operator=(const KernelHub&) = delete;

  // Resolves `repo` once and caches the outcome; never throws for a package problem (the
  // outcome is recorded instead). Thread-safe.
  const PackageResolution& resolve(const std::string& repo);
  // The chosen variant's table; throws KernelUnavailable("<repo>: <error>: <detail>") otherwise.
  const frt_kernel_table& table(const std::string& repo);

  std::vector<UnavailableEntry> unavailable_report() const;
  void clear_unavailable_report();
  std::vector<PackageResolution> resolutions() const;
  // Every "<org>/<name>" with a metadata.json somewhere on the path, sorted.
  std::vector<std::string> visible_packages() const;
  const KernelPathConfig& config() const { return config_; }
  const CpuFeatures& cpu() const { return cpu_; }

  // Which package a direct op call runs on, remembered per descriptor key (op_dispatch.cpp):
  // nullptr when not chosen yet. Thread-safe.
  const frt_kernel_table* op_choice(const std::string& key) const;
  void remember_op_choice(const std::string& key, const frt_kernel_table* table);

 private:
  KernelPathConfig config_;
  CpuFeatures cpu_;
  mutable std::mutex mu_;
  std::map<std::string, std::unique_ptr<PackageResolution>> resolved_;
  std::vector<UnavailableEntry> unavailable_;
  // Failed resolutions forgotten by clear_unavailable_report(): kept alive because resolve()
  // handed out references to them.
  std::vector<std::unique_ptr<PackageResolution>> retired_;
  mutable std::mutex choices_mu_;
  std::map<std::string, const frt_kernel_table*> op_choices_;
};

// The process-wide hub. set_bundled_root() must come before the first process_hub() call
// (the Python door does it at import); later calls throw InvalidArgument.
void set_bundled_root(std::string root);
KernelHub& process_hub();

// Opens one variant library directly, with the same ABI checks as the hub, for tests that run
// every variant this CPU supports. Returns nullptr and sets *why on failure.
const frt_kernel_table* open_variant_library(const std::string& path, std::string* why);

}  // namespace frt
