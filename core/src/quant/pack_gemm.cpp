// The integer GEMM's weight layouts (frt_kernel_abi.h): FRT_W_INT8_GEMM, the same symmetric int8
// per-channel quantization as PackedLinear::int8 (it is packed by it), laid out four input
// channels deep for vpmaddubsw / vpdpbusd, with each channel's sum of q for the activations'
// zero point; FRT_W_INT4_GEMM, PackedLinear::int4's g32 values laid out the same way, and
// FRT_W_INT4_SUPER_GEMM, PackedLinear::int4_super's; FRT_W_INT6_SUPER_GEMM, int8_super's in
// six bits.
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
          "gemm layout: re-lays int4 g32 packs with f16 scales, int4_super and int8_super "
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

  // Lays out GGUF Q5 values as FRT_W_INT5_GEMM (from an int4 g32 f16 pack of their low nibbles)
  // or FRT_W_INT5_SUPER_GEMM (from an int4_super pack of them): per panel and block of 32 the
  // nibbles as FRT_W_INT4_GEMM's octs, then the plane of fifth bits (fifth [n][k], 0 or 1); the
  // base's scales (and, unless symmetric, mins) or records.
  static PackedLinear from_int5(const PackedLinear& base, const uint8_t* fifth, bool symmetric) {
    const bool super = base.format() == WeightFormat::int4_super;
    PackedLinear p;
    const int64_t n = base.n(), k = base.k(), panels = (n + FRT_PANEL - 1) / FRT_PANEL;
    p.qbytes_ = panels * (k / 32) * FRT_INT5_BLOCK;
    p.scale_count_ = base.scale_count_;
    p.qdata_.reset(zeroed(p.qbytes_));
    p.scales_.reset(zeroed(p.scale_count_ * 2));
    std::memcpy(p.scales_.get(), base.view().scales, static_cast<size_t>(p.scale_count_) * 2);
    if (!super && !symmetric) {
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
          const int64_t t = (i % 32) / 8, l = i % 4, c = pn * FRT_PANEL + j;
          const bool second = i % 8 >= 4;
          uint8_t* block = q + (pn * (k / 32) + i / 32) * FRT_INT5_BLOCK;
          block[64 * t + 4 * j + l] |= static_cast<uint8_t>(nib << (second ? 4 : 0));
          if (c < n && fifth[c * k + i] != 0)
            block[FRT_INT6_PLANES_AT + 4 * j + l] |=
                static_cast<uint8_t>(1u << (t + (second ? 4 : 0)));
        }
    p.symmetric_ = symmetric;
    p.view_ = {super ? FRT_W_INT5_SUPER_GEMM : FRT_W_INT5_GEMM,
               32,
               FRT_F16,
               0,
               n,
               k,
               p.qdata_.get(),
               p.scales_.get(),
               p.mins_.get()};
    p.stats_ = base.stats();
    return p;
  }

  // Re-lays an int8_super pack (Q6_K's values, -32..31) out as FRT_W_INT6_SUPER_GEMM: u = q + 32
  // in six bits, the low nibbles as FRT_W_INT4_GEMM's octs and the top two bits in two planes
  // per block of 32, the same super records.
  static PackedLinear from_int8_super(const PackedLinear& base) {
    PackedLinear p;
    const int64_t n = base.n(), k = base.k(), panels = (n + FRT_PANEL - 1) / FRT_PANEL;
    p.qbytes_ = panels * (k / 32) * FRT_INT6_BLOCK;
    p.scale_count_ = base.scale_count_;  // halves: the super records
    p.qdata_.reset(zeroed(p.qbytes_));
    p.scales_.reset(zeroed(p.scale_count_ * 2));
    std::memcpy(p.scales_.get(), base.view().scales, static_cast<size_t>(p.scale_count_) * 2);
    const auto* src = static_cast<const int8_t*>(base.view().qdata);  // [P][k][16]
    auto* q = static_cast<uint8_t*>(p.qdata_.get());
    for (int64_t pn = 0; pn < panels; ++pn)
      for (int64_t i = 0; i < k; ++i)
        for (int64_t j = 0; j < FRT_PANEL; ++j) {
          const int u = src[(pn * k + i) * FRT_PANEL + j] + 32;
          if (u < 0 || u > 63)
            throw InvalidArgument("int6_super_gemm: value " + std::to_string(u - 32) +
                                  " outside Q6_K's -32..31");
          const int64_t t = (i % 32) / 8, l = i % 4;
          const bool second = i % 8 >= 4;  // inputs 8t + 4..7: high nibble, second plane
          uint8_t* block = q + (pn * (k / 32) + i / 32) * FRT_INT6_BLOCK;
          block[64 * t + 4 * j + l] |= static_cast<uint8_t>((u & 15) << (second ? 4 : 0));
          block[FRT_INT6_PLANES_AT + (second ? 64 : 0) + 4 * j + l] |=
              static_cast<uint8_t>((u >> 4) << (2 * t));
        }
    p.symmetric_ = true;
    p.view_ = {FRT_W_INT6_SUPER_GEMM, 16,     FRT_F16, 0, n, k, p.qdata_.get(),
               p.scales_.get(),       nullptr};
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

PackedLinear PackedLinear::int4_gemm(const TensorView& weight, bool symmetric,
                                     const InputMoments* moments) {
  return GemmPackAccess::from_int4(PackedLinear::int4(weight, 32, symmetric, DType::f16, moments));
}

PackedLinear PackedLinear::int4_super_gemm(const TensorView& weight) {
  return GemmPackAccess::from_int4(PackedLinear::int4_super(weight));
}

PackedLinear PackedLinear::int6_super_gemm(const TensorView& weight) {
  return GemmPackAccess::from_int8_super(PackedLinear::int8_super(weight));
}

PackedLinear PackedLinear::int5_layout(const PackedLinear& low, const uint8_t* fifth,
                                       bool symmetric) {
  if (fifth == nullptr) throw InvalidArgument("int5 layout: no fifth bits");
  if (symmetric && low.format() == WeightFormat::int4_super)
    throw InvalidArgument("int5 layout: a super-block pack keeps its mins in its records");
  if (low.format() != WeightFormat::int4_super &&
      (low.format() != WeightFormat::int4_group || low.group() != 32 ||
       low.view().scale_dtype != FRT_F16))
    throw InvalidArgument(
        "int5 layout: takes the low nibbles as an int4 g32 f16 or int4_super "
        "pack, not " +
        low.form());
  return GemmPackAccess::from_int5(low, fifth, symmetric);
}

PackedLinear PackedLinear::gemm_layout(const PackedLinear& pack) {
  if (pack.format() == WeightFormat::int8_super) return GemmPackAccess::from_int8_super(pack);
  return GemmPackAccess::from_int4(pack);
}

}  // namespace frt
