// Loading and validating one variant library: the file must be there and match its metadata's
// sha256, then dlopen (RTLD_NOW | RTLD_LOCAL) and the ABI handshake (query, open, the table's
// ABI major, struct_size and op list). Also the hub-less open_variant_library for tests.
#include <dlfcn.h>
#include <flashrt/hub.h>
#include <flashrt/utf8.h>

#include <cstddef>
#include <filesystem>
#include <optional>
#include <set>

#include "hub_internal.h"
#include "metadata.h"
#include "sha256.h"

namespace frt {
namespace detail {
namespace {

namespace fs = std::filesystem;

// The loader hands the whole table to the runtime, so every member up to the last one
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

}  // namespace

std::string abi_refusal(int32_t theirs) {
  return "ABI version " + std::to_string(theirs) + ", loader speaks " +
         std::to_string(FRT_KERNEL_ABI_MAJOR);
}

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

const frt_kernel_table* try_variant(const VariantMetadata& v, std::string* why) {
  std::error_code ec;
  if (!fs::is_regular_file(v.library_path, ec)) {
    *why = "library file missing: " + v.library_path.string();
    return nullptr;
  }
  const std::optional<std::string> digest = sha256_file_hex(v.library_path);
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

}  // namespace detail

const frt_kernel_table* open_variant_library(const std::string& path, std::string* why) {
  std::string reason;
  const frt_kernel_table* table = nullptr;
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    reason = "library file missing: " + path;
  } else {
    table = detail::load_library(std::filesystem::path(path), nullptr, &reason);
  }
  if (table == nullptr && why != nullptr) *why = escape_invalid_utf8(reason);
  return table;
}

}  // namespace frt
