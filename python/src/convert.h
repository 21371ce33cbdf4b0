// Tensor conversion for the door: a torch tensor (or any DLPack array) becomes a frt::TensorView
// with no copy. Anything the core cannot view as-is (device, dtype, rank) is refused by name.
#pragma once

#include <flashrt/tensor.h>
#include <nanobind/nanobind.h>

namespace frt::py {

namespace nb = nanobind;

// Throws frt::Refused naming `what` and the device or dtype when the object is not a CPU f32 or
// bf16 tensor of rank <= 4.
TensorView view_of(nb::handle obj, const char* what);
// The same for indices: an int64 tensor (a router's choice of experts), anything else refused.
TensorView index_view_of(nb::handle obj, const char* what);
// The same for an attention mask: bool (true: attended) or f32 (added to the scores).
TensorView mask_view_of(nb::handle obj, const char* what);

// Registers the fast path for tensors of `tensor_type` (torch.Tensor) from its
// __dlpack_c_exchange_api__ capsule; returns false (and keeps the generic path) when the capsule
// is missing or speaks another DLPack major version.
bool use_dlpack_exchange(nb::handle tensor_type);

void bind_convert(nb::module_& m);

}  // namespace frt::py
