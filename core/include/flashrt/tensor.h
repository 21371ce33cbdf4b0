// A non-owning view of a CPU tensor as the door hands it over: no copy, strides in elements.
#pragma once

#include <flashrt/types.h>

#include <array>
#include <cstdint>
#include <string>

namespace frt {

inline const char* dtype_name(DType dt) { return name_of(dt); }

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::f32;  // f32 or bf16: the door refuses anything else
  int rank = 0;
  std::array<int64_t, 4> shape{};
  std::array<int64_t, 4> strides{};  // in elements

  static TensorView matrix(void* data, DType dt, int64_t rows, int64_t cols, int64_t row_stride);
  // "bf16[4, 1024] strides (1024, 1)": what refusals quote.
  std::string describe() const;
  // The element `offset` elements from data, as fp32 (a bf16 value widened exactly). For bind-
  // and gate-time reads; hot paths hand the whole view to a kernel instead.
  float element(int64_t offset) const;
};

}  // namespace frt
