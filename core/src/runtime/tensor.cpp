#include <flashrt/tensor.h>

#include <cstring>
#include <sstream>

namespace frt {

TensorView TensorView::matrix(void* data, DType dt, int64_t rows, int64_t cols,
                              int64_t row_stride) {
  TensorView v;
  v.data = data;
  v.dtype = dt;
  v.rank = 2;
  v.shape = {rows, cols, 0, 0};
  v.strides = {row_stride, 1, 0, 0};
  return v;
}

float TensorView::element(int64_t offset) const {
  if (dtype == DType::f32) return static_cast<const float*>(data)[offset];
  const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(data)[offset]) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::string TensorView::describe() const {
  std::ostringstream s;
  s << dtype_name(dtype) << '[';
  for (int i = 0; i < rank; ++i) s << (i ? ", " : "") << shape[i];
  s << "] strides (";
  for (int i = 0; i < rank; ++i) s << (i ? ", " : "") << strides[i];
  s << ')';
  return s.str();
}

}  // namespace frt
