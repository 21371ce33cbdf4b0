/* The two exports of every kernel package. This object is compiled without ISA flags (and
 * without LTO) so the loader can call frt_kpkg_query on any CPU without risking SIGILL. */
#include <flashrt/abi/frt_kernel_abi.h>
#include <stddef.h>

extern const frt_kernel_table frt_kpkg_table; /* the package's table.cpp */

FRT_KPKG_EXPORT int32_t frt_kpkg_query(frt_kpkg_info* out) {
  if (out == NULL) return FRT_E_INVALID;
  out->abi_major = FRT_KERNEL_ABI_MAJOR;
  out->abi_minor = FRT_KERNEL_ABI_MINOR;
  out->arch = FRT_VARIANT_ARCH;
  out->isa = FRT_VARIANT_ISA;
  out->features = FRT_VARIANT_FEATURES;
  return FRT_OK;
}

FRT_KPKG_EXPORT const frt_kernel_table* frt_kpkg_open(int32_t abi_major) {
  return abi_major == FRT_KERNEL_ABI_MAJOR ? &frt_kpkg_table : NULL;
}
