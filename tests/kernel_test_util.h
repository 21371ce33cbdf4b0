// What the kernel tests share: opening a package's variant (skipping where this CPU cannot run
// it), fresh seeds (printed by each test, so a failure can be replayed), bf16 rounding, strided
// activation rows and poisoned outputs, random weights packed in the decode formats and their
// float64 values by the format's definition.
#pragma once

#include <flashrt/abi/frt_kernel_abi.h>
#include <flashrt/cpu_features.h>
#include <flashrt/hub.h>
#include <flashrt/pack.h>
#include <flashrt/tensor.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace frt::ktest {

// The shipped variants, then "avx512vnni-simde": the avx512vnni sources built on AVX2 through
// SIMDe, test only (Note [Emulated zmm variant], kernels/common/include/frt_kern/zmm_simde.h).
inline const std::vector<std::string> kIsas = {"generic", "avx2", "avx512vnni", "avx512vnni-simde"};
// The packages with an amx build (flashrt/gemm, linear, ffn): the above, that build and its
// emulation ("amx-simde": the zmm paths through SIMDe and the tiles in plain C++, Note [Emulated
// AMX tiles] in kernels/common/include/frt_kern/amx_tiles.h).
inline const std::vector<std::string> kAmxIsas = {"generic",          "avx2", "avx512vnni",
                                                  "avx512vnni-simde", "amx",  "amx-simde"};

inline constexpr const char* kEmulatedSuffix = "-simde";

// The build that stands where the gemm's amx build does in a test that pairs it with another
// package's (its avx512vnni build, so the pairing's bits are the ones that test was written for).
inline std::string without_amx(const std::string& isa) {
  if (isa == "amx") return "avx512vnni";
  if (isa == "amx-simde") return "avx512vnni-simde";
  return isa;
}

inline bool emulated(const std::string& isa) { return isa.ends_with(kEmulatedSuffix); }

inline std::string library(const std::string& pkg, const std::string& isa) {
#if defined(FRT_TEST_EMULATED_KERNEL_ROOT)
  const std::string root = emulated(isa) ? FRT_TEST_EMULATED_KERNEL_ROOT : FRT_TEST_KERNEL_ROOT;
#else
  const std::string root = FRT_TEST_KERNEL_ROOT;
#endif
  return root + "/flashrt/" + pkg + "/build/cpu-x86_64-linux-" + isa + "/libfrt_" + pkg + ".so";
}

// The variant's table, or nullptr (and a skip reason) when this CPU cannot run it or this build
// has no emulated variant. The emulated one needs what its flags target: the avx2 tier.
inline const frt_kernel_table* open_variant(const std::string& pkg, const std::string& isa,
                                            std::string* skip) {
#if !defined(FRT_TEST_EMULATED_KERNEL_ROOT)
  if (emulated(isa)) {
    *skip = "the " + isa + " variant was not built (SIMDe's simde/x86/avx512.h not found)";
    return nullptr;
  }
#endif
  std::set<std::string> needs = tier_features(emulated(isa) ? "avx2" : isa);
  if (isa == "amx") {  // the amx build's bf16 stores and bf16 tiles (CMakeLists.txt)
    needs.insert("avx512_bf16");
    needs.insert("amx_bf16");
  }
  for (const std::string& f : needs)
    if (!detect_cpu().has(f)) {
      const auto withheld = detect_cpu().withheld.find(f);
      *skip = withheld != detect_cpu().withheld.end()
                  ? "this process may not use " + f + " for the " + isa +
                        " variant: " + withheld->second
                  : "this CPU lacks " + f + " for the " + isa + " variant";
      return nullptr;
    }
  std::string why;
  const frt_kernel_table* t = open_variant_library(library(pkg, isa), &why);
  if (t == nullptr) ADD_FAILURE() << "cannot open " << library(pkg, isa) << ": " << why;
  return t;
}

// A new seed per test (printed in its trace), or FRT_TEST_SEED's to replay a failure.
inline uint64_t fresh_seed() {
  if (const char* fixed = std::getenv("FRT_TEST_SEED")) return std::strtoull(fixed, nullptr, 10);
  static std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) | rd();
}

// The value a bf16 tensor holds for f (round to nearest even).
inline float to_bf16_value(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  std::memcpy(&f, &bits, 4);
  return f;
}

// An [m, n] matrix in f32 or bf16 storage whose rows stand ld >= n apart; the gap past each row
// holds NaN (in bf16, the bits `poison`), which a kernel must leave as it is. f32 holds the
// values in either dtype (in bf16, as bf16 holds them), so a reference can read them as floats.
struct Strided {
  DType dtype;
  int64_t m, n, ld;
  uint16_t poison;
  std::vector<float> f32;
  std::vector<uint16_t> bf16;

  Strided(DType dt, int64_t m_, int64_t n_, int64_t ld_, uint16_t poison_)
      : dtype(dt),
        m(m_),
        n(n_),
        ld(ld_),
        poison(poison_),
        f32(m_ * ld_, std::numeric_limits<float>::quiet_NaN()),
        bf16(m_ * ld_, poison_) {}
  // Stores v as the dtype holds it (bf16: rounded to nearest even) and returns that value.
  float set(int64_t r, int64_t c, float v) {
    if (dtype == DType::bf16) {
      v = to_bf16_value(v);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      bf16[r * ld + c] = static_cast<uint16_t>(bits >> 16);
    }
    f32[r * ld + c] = v;
    return v;
  }
  double at(int64_t r, int64_t c) const {
    if (dtype == DType::f32) return f32[r * ld + c];
    const uint32_t bits = static_cast<uint32_t>(bf16[r * ld + c]) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
  const float* row(int64_t r) const { return f32.data() + r * ld; }
  bool gap_untouched(int64_t r, int64_t c) const {
    return dtype == DType::f32 ? std::isnan(f32[r * ld + c]) : bf16[r * ld + c] == poison;
  }
  void* data() { return dtype == DType::f32 ? static_cast<void*>(f32.data()) : bf16.data(); }
  const void* data() const {
    return dtype == DType::f32 ? static_cast<const void*>(f32.data()) : bf16.data();
  }
  TensorView view() { return TensorView::matrix(data(), dtype, m, n, ld); }
  bool same_bits(const Strided& o) const {
    return dtype == DType::f32 ? std::memcmp(f32.data(), o.f32.data(), f32.size() * 4) == 0
                               : bf16 == o.bf16;
  }
};

// Activation rows [m, k] in the dtype under test, drawn from N(shift, 1), rows ld >= k apart
// with poisoned gaps; value[r * k + i]: what the tensor holds, for float64 references.
struct Rows : Strided {
  int64_t k;
  std::vector<double> value;

  Rows(DType dt, int64_t m_, int64_t k_, int64_t ld_, std::mt19937_64& rng, float shift = 0.0f)
      : Strided(dt, m_, k_, ld_, 0x7fc0), k(k_), value(m_ * k_) {
    std::normal_distribution<float> dist(shift, 1.0f);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t i = 0; i < k; ++i) set(r, i, dist(rng));
  }
  void set(int64_t r, int64_t i, float v) { value[r * k + i] = Strided::set(r, i, v); }
};

// Output storage poisoned with NaN, with a poisoned gap after each row that must stay untouched.
struct Out : Strided {
  Out(DType dt, int64_t m_, int64_t n_) : Strided(dt, m_, n_, n_ + 3, 0x7fc1) {}
};

// A decode weight format (frt_kernel_abi.h) as the tests name and pack it.
struct Format {
  const char* name;
  WeightFormat format;
  int group;
  bool symmetric;
  DType scales;
};

// Whether a pack of this format takes input width k (group forms: a multiple of the group;
// the super forms: of their super-block of 256).
inline bool takes(const Format& f, int64_t k) {
  if (is_super_format(f.format)) return k % FRT_SUPER_K == 0;
  return f.group == 0 || k % f.group == 0;
}

inline PackedLinear pack(const Format& f, std::vector<float>& w, int64_t n, int64_t k) {
  const TensorView v = TensorView::matrix(w.data(), DType::f32, n, k, k);
  if (f.format == WeightFormat::int4_super) return PackedLinear::int4_super(v);
  if (f.format == WeightFormat::int8_super) return PackedLinear::int8_super(v);
  if (f.format == WeightFormat::int4_group)
    return PackedLinear::int4(v, f.group, f.symmetric, f.scales);
  return PackedLinear::int8(v, f.group, f.scales);
}

inline std::vector<float> random_weight(int64_t n, int64_t k, std::mt19937_64& rng) {
  std::normal_distribution<float> dist(0.0f, 0.05f);
  std::vector<float> w(n * k);
  for (float& v : w) v = dist(rng);
  return w;
}

inline double scale64(const void* base, int64_t i, int32_t dtype) {
  return dtype == FRT_F16 ? frt_f16_to_f32(static_cast<const uint16_t*>(base)[i])
                          : static_cast<const float*>(base)[i];
}

// float64 dequantisation straight from the packed view, [n][k], by the format's definition.
inline std::vector<double> dequant64(const frt_packed_weight& w) {
  const int64_t n = w.n, k = w.k;
  std::vector<double> out(n * k);
  for (int64_t c = 0; c < n; ++c) {
    const int64_t p = c / FRT_PANEL, j = c % FRT_PANEL;
    for (int64_t i = 0; i < k; ++i) {
      if (w.format == FRT_W_INT8_CHANNEL) {
        const int8_t q = static_cast<const int8_t*>(w.qdata)[(p * k + i) * FRT_PANEL + j];
        out[c * k + i] = static_cast<double>(q) * scale64(w.scales, p * FRT_PANEL + j, FRT_F32);
      } else if (w.format == FRT_W_INT8_GROUP) {
        const int8_t q = static_cast<const int8_t*>(w.qdata)[(p * k + i) * FRT_PANEL + j];
        const int64_t at = (p * (k / w.group) + i / w.group) * FRT_PANEL + j;
        out[c * k + i] = static_cast<double>(q) * scale64(w.scales, at, w.scale_dtype);
      } else if (w.format == FRT_W_INT8_SUPER) {
        const int8_t q = static_cast<const int8_t*>(w.qdata)[(p * k + i) * FRT_PANEL + j];
        const auto* rec = static_cast<const uint8_t*>(w.scales) +
                          (p * (k / FRT_SUPER_K) + i / FRT_SUPER_K) * FRT_SUPER8_RECORD;
        const auto sc =
            static_cast<int8_t>(rec[FRT_SUPER8_SC_AT + ((i % FRT_SUPER_K) / 16) * FRT_PANEL + j]);
        out[c * k + i] = static_cast<double>(q) * scale64(rec, j, FRT_F16) * sc;
      } else if (w.format == FRT_W_INT4_SUPER) {
        const uint8_t b =
            static_cast<const uint8_t*>(w.qdata)[(p * (k / 2) + i / 2) * FRT_PANEL + j];
        const int q = i % 2 == 0 ? (b & 15) : (b >> 4);
        const auto* rec = static_cast<const uint8_t*>(w.scales) +
                          (p * (k / FRT_SUPER_K) + i / FRT_SUPER_K) * FRT_SUPER4_RECORD;
        const int64_t g = (i % FRT_SUPER_K) / 32;
        const double d = scale64(rec, j, FRT_F16),
                     dmin = scale64(rec + FRT_SUPER4_DMIN_AT, j, FRT_F16);
        out[c * k + i] = q * d * rec[FRT_SUPER4_SC_AT + g * FRT_PANEL + j] -
                         dmin * rec[FRT_SUPER4_M_AT + g * FRT_PANEL + j];
      } else {
        const uint8_t b =
            static_cast<const uint8_t*>(w.qdata)[(p * (k / 2) + i / 2) * FRT_PANEL + j];
        const int q = i % 2 == 0 ? (b & 15) : (b >> 4);
        const int64_t at = (p * (k / w.group) + i / w.group) * FRT_PANEL + j;
        out[c * k + i] =
            q * scale64(w.scales, at, w.scale_dtype) + scale64(w.mins, at, w.scale_dtype);
      }
    }
  }
  return out;
}

}  // namespace frt::ktest
