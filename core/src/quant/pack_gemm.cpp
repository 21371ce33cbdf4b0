// The integer GEMM's weight layouts (frt_kernel_abi.h): FRT_W_INT8_GEMM, the same symmetric int8
// per-channel quantization as PackedLinear::int8 (it is packed by it), laid out four input
// channels deep for vpmaddubsw / vpdpbusd, with each channel's sum of q for the activations'
// zero point; FRT_W_INT4_GEMM, PackedLinear::int4's g32 values laid out the same way, and
// FRT_W_INT4_SUPER_GEMM, PackedLinear::int4_super's.
#include <flashrt/errors.h>
#include <flashrt/pack.h>

#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "quant/weight_memory.h"

namespace frt {

struct GemmPackAccess {
  static PackedLinear from(const PackedLinear& base, int act_block) {
    PackedLinear p;
    const int64_t n = base.n(), k = base.k(), kq = (k + 3) / 4;
    const int64_t panels = (n + FRT_PANEL - 1) / FRT_PANEL;
    p.qbytes_ = panels * kq * 4 * FRT_PANEL;
    p.scale_count_ = panels * FRT_PANEL;
    p.qdata_.reset(zeroed(p.qbytes_));
    p.scales_.reset(zeroed(p.scale_count_ * 4));
    p.mins_.reset(zeroed(p.scale_count_ * 4));
    const auto* src = static_cast<const int8_t*>(base.view().qdata);
    auto* q = static_cast<int8_t*>(p.qdata_.get());
    auto* sums = static_cast<float*>(p.mins_.get());  // the format keeps column sums there
    std::memcpy(p.scales_.get(), base.view().scales, static_cast<size_t>(p.scale_count_) * 4);
    for (int64_t pn = 0; pn < panels; ++pn)
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < FRT_PANEL; ++j) {
          const int8_t v = src[(pn * k + i) * FRT_PANEL + j];  // int8 per-channel layout
          q[((pn * kq + i / 4) * FRT_PANEL + j) * 4 + i % 4] = v;
          sums[pn * FRT_PANEL + j] += static_cast<float>(v);  // exact: |sum| < 2^24 for k < 2^17
        }
    p.view_ = {FRT_W_INT8_GEMM, act_block, FRT_F32, 0, n, k, p.qdata_.get(), p.scales_.get(), sums};
    p.stats_ = base.stats();  // the same quantized values
    return p;
  }

  // Re-lays an int4 g32 pack (FRT_W_INT4_GROUP, f16) out as FRT_W_INT4_GEMM, or an int4_super
  // pack as FRT_W_INT4_SUPER_GEMM: the same nibbles, eight inputs of a column in four bytes,
  // inputs i and i + 4 sharing one, and the same scales and mins (or super records).
  static PackedLinear from_int4(const PackedLinear& base) {
    const bool super = base.format() == WeightFormat::int4_super;
    if (!super && (base.format() != WeightFormat::int4_group || base.group() != 32 ||
                   base.view().scale_dtype != FRT_F16))
      throw InvalidArgument(
          "int4_gemm: re-lays int4 g32 packs with f16 scales or int4_super "
          "packs, not " +
          base.form());
    PackedLinear p;
    const int64_t n = base.n(), k = base.k(), panels = (n + FRT_PANEL - 1) / FRT_PANEL;
    p.qbytes_ = panels * (k / 4) * 32;
    p.scale_count_ = base.scale_count_;  // halves: f16 scales, or the super records
    p.qdata_.reset(zeroed(p.qbytes_));
    p.scales_.reset(zeroed(p.scale_count_ * 2));
    std::memcpy(p.scales_.get(), base.view().scales, static_cast<size_t>(p.scale_count_) * 2);
    if (base.view().mins != nullptr && !base.symmetric()) {
      p.mins_.reset(zeroed(p.scale_count_ * 2));
      std::memcpy(p.mins_.get(), base.view().mins, static_cast<size_t>(p.scale_count_) * 2);
    }
    const auto* src = static_cast<const uint8_t*>(base.view().qdata);  // [P][k/2][16]
    auto* q = static_cast<uint8_t*>(p.qdata_.get());
    for (int64_t pn = 0; pn < panels; ++pn)
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < FRT_PANEL; ++j) {
          const uint8_t byte = src[(pn * (k / 2) + i / 2) * FRT_PANEL + j];
          const uint8_t nib = (i % 2 == 0) ? (byte & 0x0f) : (byte >> 4);
          q[((pn * (k / 8) + i / 8) * FRT_PANEL + j) * 4 + i % 4] |=
              static_cast<uint8_t>(nib << (i % 8 < 4 ? 0 : 4));
        }
    p.symmetric_ = base.symmetric();
    p.view_ = {super ? FRT_W_INT4_SUPER_GEMM : FRT_W_INT4_GEMM,
               32,
               FRT_F16,
               0,
               n,
               k,
               p.qdata_.get(),
               p.scales_.get(),
               p.mins_.get()};
    p.stats_ = base.stats();  // the same quantized values
    return p;
  }

 private:
  // With 64 zeroed bytes of slack past the end, as this layout has always had.
  static void* zeroed(int64_t bytes) { return alloc_weight_memory(bytes + 64); }
};

PackedLinear PackedLinear::int8_gemm(const TensorView& weight, int act_block) {
  if (act_block != 0 && act_block != 32)
    throw InvalidArgument("int8_gemm: activation block " + std::to_string(act_block) +
                          " not in {0 (per row), 32}");
  return GemmPackAccess::from(PackedLinear::int8(weight), act_block);
}

PackedLinear PackedLinear::int4_gemm(const TensorView& weight, bool symmetric) {
  return GemmPackAccess::from_int4(PackedLinear::int4(weight, 32, symmetric, DType::f16));
}

PackedLinear PackedLinear::int4_super_gemm(const TensorView& weight) {
  return GemmPackAccess::from_int4(PackedLinear::int4_super(weight));
}

PackedLinear PackedLinear::gemm_layout(const PackedLinear& int4_pack) {
  return GemmPackAccess::from_int4(int4_pack);
}

}  // namespace frt
