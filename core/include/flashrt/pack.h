// Packers: host weights (fp32 or bf16, [n][k] as torch's Linear.weight) into the layouts the
// kernel packages read (frt_kernel_abi.h, "weight formats"). Packing happens once, at bind time.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/calibration.h>
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
  double max_abs_ref = 0;  // max |W|: what max_abs_err is small against
  // A calibrated pack's output-space error (Note [Calibrated rounding]): sqrt(sum e^T H e /
  // sum w^T H w), H the calibration rows' second moments (damped as the rounding's, not shrunk)
  // within each span of inputs the moments keep (InputMoments), estimated on every eighth tile of
  // 16 channels; `_plain` the same for the uncalibrated rounding of this form. -1 for a pack made
  // without calibration.
  double out_rel_err = -1;
  double out_rel_err_plain = -1;
  int64_t calibration_rows = 0;
};

// A weight a checkpoint already holds quantised (GGUF blocks, compressed-tensors packs), unpacked
// to plain row-major arrays by the door; from_quantized() lays it out for the kernels without
// requantising, so the seat computes with exactly the checkpoint's values.
struct QuantizedParts {
  WeightFormat format = WeightFormat::int8_channel;
  int group = 0;  // the group formats
  int64_t n = 0, k = 0;
  const int8_t* q = nullptr;       // [n][k]: int8 values, or nibble values 0..15 for int4
  DType scale_dtype = DType::f32;  // f32 or f16 (group formats)
  const void* scales = nullptr;    // [n] (int8 per-channel) or [n][k / group]
  const void* mins = nullptr;      // int4: [n][k / group], W = q * scale + min
  // int4_super (GGUF Q4_K, group 32): scales and mins are uint8 codes 0..63 [n][k / 32] under
  // f16 super scales d and dmin [n][k / 256]; W = q * (d * sc) - dmin * m. int8_super (GGUF
  // Q6_K, group 16): scales are int8 codes [n][k / 16] under f16 d [n][k / 256], no mins;
  // W = q * (d * sc). int4_gemm, int4_super_gemm and int6_super_gemm take the parts of
  // int4_group (group 32, f16), int4_super and int8_super, laid out for the GEMM. int5_gemm
  // (GGUF Q5_0 / Q5_1, group 32, f16) takes values u in 0..31 (Q5_0's q + 16) with scales, and
  // mins for Q5_1 (W = u * s + min) or none for Q5_0 (W = (u - 16) * s); int5_super_gemm
  // (Q5_K) takes u in 0..31 with int4_super's codes and super scales.
  const uint16_t* super_scales = nullptr;
  const uint16_t* super_mins = nullptr;
};

class PackedLinear {
 public:
  // Throws InvalidArgument for a non-2-D or empty weight, a non-finite element, a group outside
  // {32, 64, 128} or a width k that is not a multiple of it. group 0 is int8 per-channel;
  // scale_dtype f16 stores group scales (and mins) in half precision, rounded before the
  // weights are quantised against them.
  static PackedLinear int8(const TensorView& weight, int group = 0, DType scale_dtype = DType::f32);
  // With `moments` (the input's, block = group, width k, at least one row), each group is
  // rounded against them (Note [Calibrated rounding]): the same layout and kernels, other
  // levels and grids. Throws InvalidArgument for moments of another width or block or no rows.
  static PackedLinear int4(const TensorView& weight, int group, bool symmetric,
                           DType scale_dtype = DType::f32, const InputMoments* moments = nullptr);
  // int4 in super-blocks of 256 (FRT_W_INT4_SUPER, GGUF Q4_K's form): each group of 32 gets a
  // min-max grid, and the eight groups' scales and offsets are coded in 6 bits under f16 d and
  // dmin. Throws InvalidArgument as int4() does, and for a width k not a multiple of 256.
  static PackedLinear int4_super(const TensorView& weight);
  // int8 in super-blocks of 256 (FRT_W_INT8_SUPER, GGUF Q6_K's form): each group of 16 gets a
  // symmetric 6-bit grid (values -32..31, Q6_K's), its scale an int8 code of d = max / 127 in
  // f16. Throws InvalidArgument as int8() does, and for k not a multiple of 256.
  static PackedLinear int8_super(const TensorView& weight);
  // Throws InvalidArgument when the parts do not describe a valid form (values out of range,
  // missing mins, non-finite scales).
  static PackedLinear from_quantized(const QuantizedParts& parts);
  // The round-trip statistics against a host weight (what the pack stands in for).
  PackStats compare(const TensorView& weight) const;

  // A moved-from pack is empty (n() == 0), so a stale handle cannot reach freed buffers.
  PackedLinear(PackedLinear&& other) noexcept;
  PackedLinear& operator=(PackedLinear&& other) noexcept;
  PackedLinear(const PackedLinear&) = delete;
  PackedLinear& operator=(const PackedLinear&) = delete;
  ~PackedLinear() = default;
  // int8 per channel in the w8a8 GEMM's layout, with column sums (core/src/quant/pack_gemm.cpp);
  // act_block 0 quantizes activations per row, 32 per block of 32 inputs (the decode form).
  static PackedLinear int8_gemm(const TensorView& weight, int act_block = 0);
  // int4 g32 (f16 scales; mins only when asymmetric) in the same GEMM's layout, activations per
  // block of 32 (FRT_W_INT4_GEMM): the values PackedLinear::int4(weight, 32, symmetric, f16) holds.
  static PackedLinear int4_gemm(const TensorView& weight, bool symmetric,
                                const InputMoments* moments = nullptr);
  // int4_super's values (GGUF Q4_K's form) in the same layout (FRT_W_INT4_SUPER_GEMM): the
  // values PackedLinear::int4_super(weight) holds, activations per block of 32.
  static PackedLinear int4_super_gemm(const TensorView& weight);
  // int8_super's values (GGUF Q6_K's form, -32..31) in six bits for the same GEMM
  // (FRT_W_INT6_SUPER_GEMM): the values PackedLinear::int8_super(weight) holds, 6.5625 bits a
  // weight.
  static PackedLinear int6_super_gemm(const TensorView& weight);
  // An int4 g32 pack with f16 scales, an int4_super or an int8_super pack, laid out for the GEMM
  // (int4_gemm, int4_super_gemm, int6_super_gemm): the same values. Throws InvalidArgument for
  // any other pack.
  static PackedLinear gemm_layout(const PackedLinear& pack);
  // GGUF Q5 values (u = low | fifth << 4 in [0, 31]) for the GEMM: `low` an int4 g32 f16 pack
  // of the low nibbles with the checkpoint's scales and mins (int5_gemm; symmetric drops the
  // mins, W = (u - 16) * s) or an int4_super pack of them (int5_super_gemm), fifth [n][k] 0/1.
  static PackedLinear int5_layout(const PackedLinear& low, const uint8_t* fifth, bool symmetric);

  const frt_packed_weight& view() const { return view_; }
  const PackStats& stats() const { return stats_; }
  WeightFormat format() const;
  int64_t n() const { return view_.n; }
  int64_t k() const { return view_.k; }
  int group() const { return view_.group; }
  bool symmetric() const { return symmetric_; }
  // Bytes the kernels stream per call: quantised data plus scales (and mins).
  int64_t nbytes() const;
  // "int8 per-channel" / "int4 g32 asymmetric"
  std::string form() const;
  // Bytes relocate() takes: each buffer rounded up to 64 bytes with 64 zeroed bytes of slack.
  int64_t region_bytes() const;
  // Moves the buffers into `region` (region_bytes() zeroed bytes, 64-byte aligned, which the
  // caller keeps alive as long as this pack) and frees its own: packs that are streamed
  // together then lie in one huge-page region (Note [A bank in one region], kernel_ops.cpp).
  void relocate(void* region);
  // A second pack of the same bytes in buffers of its own (the allocator's, huge pages where
  // granted): what a benchmark cycles through to read its weights from DRAM, at a memcpy's cost
  // instead of a packing's (bench/kernels.py's floor).
  PackedLinear copy() const;
  // The weight the kernels compute with, [n][k] in fp32 (for tests and error reports).
  std::vector<float> dequantize() const;
  void dequantize_row(int64_t row, std::vector<float>& out) const;  // one output channel

 private:
  PackedLinear() = default;
  int64_t scale_buffer_bytes() const;  // the scales' buffer (and the mins', as long)
  struct Buffer {
    Buffer() noexcept : owned(true) {}
    explicit Buffer(bool own) noexcept : owned(own) {}
    bool owned;  // false once relocate() put it in the caller's region
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Buffer> qdata_;
  std::unique_ptr<void, Buffer> scales_;
  std::unique_ptr<void, Buffer> mins_;
  int64_t qbytes_ = 0, scale_count_ = 0;
  bool symmetric_ = true;
  frt_packed_weight view_{};
  PackStats stats_{};
  friend struct PackAccess;
  friend struct GemmPackAccess;
};

}  // namespace frt
