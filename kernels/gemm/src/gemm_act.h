// The gemm feed-forward's activation, one definition written three times with the same IEEE
// operations in the same order (Note [GEMM feed-forward] in gemm_ffn.cpp): its constants, shared by
// the scalar mirror (ref/activate_ref.cpp), the AVX2 path (x86/avx2/activate_avx2.cpp) and the zmm
// path (x86/avx512/activate_zmm.cpp).
#pragma once

namespace frt::kern::gemm_act {

// exp's constants: clamps that keep 2^n normal and finite, ln 2 in two parts, the polynomial.
inline constexpr float kExpHi = 88.0f, kExpLo = -87.0f, kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kP[6] = {1.9875691500E-4f, 1.3981999507E-3f, 8.3334519073E-3f,
                                4.1665795894E-2f, 1.6666665459E-1f, 5.0000001201E-1f};
inline constexpr float kInvSqrt2 = 0.7071067811865476f, kTwoSqrt2OverPi = 1.5957691216057308f;
inline constexpr float kCubic = 0.044715f, kAsP = 0.3275911f;
inline constexpr float kAs[5] = {1.061405429f, -1.453152027f, 1.421413741f, -0.284496736f,
                                 0.254829592f};

}  // namespace frt::kern::gemm_act
