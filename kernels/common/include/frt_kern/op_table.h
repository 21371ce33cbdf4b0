// How a package lists the ops it owns: typed op functions adapted to the ABI's frt_op (whose
// args cross as const void*), and the plan-time answer for a kind the package does not own.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <frt_kern/util.h>

#include <cstddef>
#include <cstdint>

namespace frt::kern {

// A phased op over `Args`: supports(args), workspace(args), run(args, phase, ith, nth).
template <typename Args, auto Supports, auto Workspace, auto Run>
constexpr frt_op phased_op(int32_t kind, int32_t phases) {
  return frt_op{
      kind,
      phases,
      [](const void* a, frt_error* err) -> int32_t {
        return Supports(static_cast<const Args*>(a), err);
      },
      [](const void* a) -> int64_t { return Workspace(static_cast<const Args*>(a)); },
      [](const void* a, int32_t phase, int32_t ith, int32_t nth, frt_error* err) -> int32_t {
        return Run(static_cast<const Args*>(a), phase, ith, nth, err);
      },
  };
}

// A single-phase primitive run(args, ith, nth) with no workspace; its own argument checks are
// the per-call supports().
template <typename Args, auto Run>
constexpr frt_op primitive_op(int32_t kind) {
  return frt_op{
      kind,
      1,
      [](const void* a, frt_error* err) -> int32_t {
        return a == nullptr ? fail(err, FRT_REASON_LAYOUT, "no arguments") : ok(err);
      },
      nullptr,
      [](const void* a, int32_t phase, int32_t ith, int32_t nth, frt_error* err) -> int32_t {
        if (phase != 0) return fail(err, FRT_E_INVALID, "a primitive has one phase, got %d", phase);
        return Run(static_cast<const Args*>(a), ith, nth, err);
      },
  };
}

// The table a package exports as frt_kpkg_table: this build's ABI version and table size, the
// package's name, the variant's ISA (FRT_VARIANT_ISA, set by kernels/CMakeLists.txt), its
// plan-time supports_op and its ops.
template <size_t N>
constexpr frt_kernel_table package_table(const char* package,
                                         int32_t (*supports_op)(const frt_op_desc*, frt_error*),
                                         const frt_op (&ops)[N]) {
  return frt_kernel_table{
      .abi_major = FRT_KERNEL_ABI_MAJOR,
      .abi_minor = FRT_KERNEL_ABI_MINOR,
      .struct_size = static_cast<int32_t>(sizeof(frt_kernel_table)),
      .package = package,
      .isa = FRT_VARIANT_ISA,
      .supports_op = supports_op,
      .n_ops = static_cast<int32_t>(N),
      .ops = ops,
  };
}

inline int32_t not_provided(const frt_op_desc* d, const char* package, frt_error* err) {
  return fail(err, FRT_REASON_NOT_PROVIDED, "package '%s' provides no op of kind %d", package,
              d == nullptr ? -1 : d->op);
}

}  // namespace frt::kern
