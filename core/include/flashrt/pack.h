// Packers: host weights (fp32 or bf16, [n][k] as torch's Linear.weight) into the layouts the
// kernel packages read (frt_kernel_abi.h, "weight formats"). Packing happens once, at bind time.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/tensor.h>
#include <flashrt/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace frt {

// Round-trip error of a pack against the host's weight, over every element.
struct PackStats {
  double max_abs_err = 0;  // max |W - dequant(pack(W))|
  double rms_err = 0;      // root mean square of the same
  double rel_err = 0;      // ||W - dequant||_F / ||W||_F (0 when W is all zero)
};

class PackedLinear {
 public:
  // Throws InvalidArgument for a non-2-D or empty weight, a non-finite element, an int4 group
  // outside {32, 64, 128} or a width k that is not a multiple of it.
  static PackedLinear int8(const TensorView& weight);
  static PackedLinear int4(const TensorView& weight, int group, bool symmetric);
  // int8 per channel in the w8a8 GEMM's layout, with column sums (core/src/quant/pack_gemm.cpp).
  static PackedLinear int8_gemm(const TensorView& weight);

  const frt_packed_weight& view() const { return view_; }
  const PackStats& stats() const { return stats_; }
  WeightFormat format() const;
  int64_t n() const { return view_.n; }
  int64_t k() const { return view_.k; }
  int group() const { return view_.group; }
  bool symmetric() const { return symmetric_; }
  // Bytes the kernels stream per call: quantised data plus scales (and zeros).
  int64_t nbytes() const;
  // "int8 per-channel" / "int4 g32 asymmetric"
  std::string form() const;
  // The weight the kernels compute with, [n][k] in fp32 (for tests and error reports).
  std::vector<float> dequantize() const;

 private:
  PackedLinear() = default;
  struct Buffer {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Buffer> qdata_;
  std::unique_ptr<void, Buffer> scales_;
  std::unique_ptr<void, Buffer> zeros_;
  int64_t qbytes_ = 0, scale_count_ = 0;
  bool symmetric_ = true;
  frt_packed_weight view_{};
  PackStats stats_{};
  friend struct PackAccess;
  friend struct GemmPackAccess;
};

}  // namespace frt
