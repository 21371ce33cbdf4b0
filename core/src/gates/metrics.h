// What the gates' metrics share inside core/src/gates (gates.cpp defines them).
#pragma once

#include <flashrt/tensor.h>

#include <cstdint>

namespace frt::detail {

// Throws InvalidArgument unless both are the same shape and contiguous.
void check_pair(const TensorView& got, const TensorView& want);
// Cosine over elements [begin, end) of two tensors (float64 accumulation); 1 when both are zero.
double cosine(const TensorView& a, const TensorView& b, int64_t begin, int64_t end);

}  // namespace frt::detail
