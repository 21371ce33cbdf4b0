// The AVX-512 intrinsics for the zmm paths (FRT_ZMM, set by kernels/CMakeLists.txt for the
// avx512vnni variant). The real build takes them from the compiler; the test-only emulated build
// (FRT_ZMM_SIMDE, never shipped: see Note [Emulated zmm variant] in zmm_simde.h) takes the same
// names from SIMDe, on AVX2, so the zmm sources are verified on CPUs without AVX-512.
#pragma once

#if defined(FRT_ZMM_SIMDE)
#include <frt_kern/zmm_simde.h>
#else
#include <immintrin.h>
#endif
