// Private to the kernel path (core/src/hub): what its files share. Each file has one job:
// hub_config.cpp reads the environment into a KernelPathConfig; search.cpp finds a package's
// metadata on the path (pins included); variants.cpp refuses variants from metadata alone and
// ranks the rest; load.cpp checks a library file and opens it (the ABI handshake); hub.cpp keeps
// the cache, the unavailable report and the process hub.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/cpu_features.h>
#include <flashrt/hub.h>

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "metadata.h"

namespace frt::detail {

// What resolving one package came to: the resolution, and why it is unavailable when it is.
struct Outcome {
  PackageResolution resolution;
  std::optional<UnavailableEntry> unavailable;
  // Better builds refused because the process may not use a feature the CPU has (reported even
  // when a lesser build serves).
  std::vector<UnavailableEntry> withheld;
};

// search.cpp: true when `dir` holds a metadata.json.
bool has_metadata(const std::filesystem::path& dir);
// search.cpp: finds `repo` on the path (a pin looks past other revisions), then lets
// choose_variant pick its build. Never throws for a package problem; the outcome says it.
Outcome resolve_package(const KernelPathConfig& config, const CpuFeatures& cpu,
                        const std::string& repo);

// variants.cpp: refuses the variants this host cannot run from metadata alone, then tries the
// rest best ISA first; records every decision in out->resolution and, when none loads,
// out->unavailable.
void choose_variant(const PackageMetadata& md, const CpuFeatures& cpu, Outcome* out);

// load.cpp: "ABI version <theirs>, loader speaks <ours>".
std::string abi_refusal(int32_t theirs);
// load.cpp: dlopen + the ABI handshake (query checked against `meta` when given). On success the
// library stays loaded for the life of the process (tables point into it); on failure it is
// closed and *why says what went wrong.
const frt_kernel_table* load_library(const std::filesystem::path& path, const VariantMetadata* meta,
                                     std::string* why);
// load.cpp: the refusals that need the file (presence, digest), then load_library.
const frt_kernel_table* try_variant(const VariantMetadata& v, std::string* why);

}  // namespace frt::detail
