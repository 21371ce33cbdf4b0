// The machine's vector multiply-add ceilings, the compute floor a batch step of decode is held
// against where no tile unit takes it: each thread keeps twelve independent accumulators busy
// with operands already in registers (no memory traffic), and the figure is multiply-adds over
// the wall time of all threads together (the best of five rounds).
//   int8: vpdpbusd zmm (AVX512-VNNI; 64 multiply-adds each), or on AVX2 the vpmaddubsw,
//         vpmaddwd, vpaddd triple the AVX2 tiles spend per 32;
//   fp32: vfmadd231ps zmm (16) or ymm (8).
// Built and run by bench/decode.py --family before and after its arms (g++ -O2 -march=native
// -pthread); prints one JSON line.
#include <immintrin.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

#define FRT_TWELVE(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)

#if defined(__AVX512VNNI__)
constexpr double kInt8Macs = 64, kFp32Macs = 16;
const char* const kUnits = "vpdpbusd zmm, vfmadd231ps zmm";

int64_t spin_int8(int64_t iters) {
#define FRT_DECL(i) __m512i a##i = _mm512_set1_epi32(i);
  FRT_TWELVE(FRT_DECL)
#undef FRT_DECL
  const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-2);
  for (int64_t n = 0; n < iters; ++n) {
#define FRT_STEP(i) a##i = _mm512_dpbusd_epi32(a##i, u, s);
    FRT_TWELVE(FRT_STEP)
#undef FRT_STEP
  }
  __m512i t = _mm512_setzero_si512();
#define FRT_SUM(i) t = _mm512_add_epi32(t, a##i);
  FRT_TWELVE(FRT_SUM)
#undef FRT_SUM
  alignas(64) int32_t out[16];
  _mm512_store_si512(out, t);
  return out[0];
}

int64_t spin_fp32(int64_t iters) {
#define FRT_DECL(i) __m512 a##i = _mm512_set1_ps(static_cast<float>(i));
  FRT_TWELVE(FRT_DECL)
#undef FRT_DECL
  const __m512 u = _mm512_set1_ps(0.999f), s = _mm512_set1_ps(1e-3f);
  for (int64_t n = 0; n < iters; ++n) {
#define FRT_STEP(i) a##i = _mm512_fmadd_ps(a##i, u, s);
    FRT_TWELVE(FRT_STEP)
#undef FRT_STEP
  }
  __m512 t = _mm512_setzero_ps();
#define FRT_SUM(i) t = _mm512_add_ps(t, a##i);
  FRT_TWELVE(FRT_SUM)
#undef FRT_SUM
  alignas(64) float out[16];
  _mm512_store_ps(out, t);
  return static_cast<int64_t>(out[0]);
}
#else
constexpr double kInt8Macs = 32, kFp32Macs = 8;
const char* const kUnits = "vpmaddubsw + vpmaddwd + vpaddd ymm, vfmadd231ps ymm";

int64_t spin_int8(int64_t iters) {
#define FRT_DECL(i) __m256i a##i = _mm256_set1_epi32(i);
  FRT_TWELVE(FRT_DECL)
#undef FRT_DECL
  const __m256i u = _mm256_set1_epi8(3), s = _mm256_set1_epi8(-2), one = _mm256_set1_epi16(1);
  __m256i v = u;
  for (int64_t n = 0; n < iters; ++n) {
    asm volatile("" : "+x"(v));  // v is "new" each pass: the products cannot leave the loop
#define FRT_STEP(i) \
  a##i = _mm256_add_epi32(a##i, _mm256_madd_epi16(_mm256_maddubs_epi16(v, s), one));
    FRT_TWELVE(FRT_STEP)
#undef FRT_STEP
  }
  __m256i t = _mm256_setzero_si256();
#define FRT_SUM(i) t = _mm256_add_epi32(t, a##i);
  FRT_TWELVE(FRT_SUM)
#undef FRT_SUM
  alignas(32) int32_t out[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(out), t);
  return out[0];
}

int64_t spin_fp32(int64_t iters) {
#define FRT_DECL(i) __m256 a##i = _mm256_set1_ps(static_cast<float>(i));
  FRT_TWELVE(FRT_DECL)
#undef FRT_DECL
  const __m256 u = _mm256_set1_ps(0.999f), s = _mm256_set1_ps(1e-3f);
  for (int64_t n = 0; n < iters; ++n) {
#define FRT_STEP(i) a##i = _mm256_fmadd_ps(a##i, u, s);
    FRT_TWELVE(FRT_STEP)
#undef FRT_STEP
  }
  __m256 t = _mm256_setzero_ps();
#define FRT_SUM(i) t = _mm256_add_ps(t, a##i);
  FRT_TWELVE(FRT_SUM)
#undef FRT_SUM
  alignas(32) float out[8];
  _mm256_store_ps(out, t);
  return static_cast<int64_t>(out[0]);
}
#endif

std::atomic<int64_t> sink{0};

template <int64_t (*Spin)(int64_t)>
double best_gmacs(int threads, int64_t iters, double macs_per_op) {
  double best = 0;
  for (int round = 0; round < 5; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back([iters] { sink += Spin(iters); });
    for (std::thread& t : pool) t.join();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double macs = 12.0 * macs_per_op * static_cast<double>(iters) * threads;
    best = macs / s > best ? macs / s : best;
  }
  return best / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : 2;
  const int64_t iters = argc > 2 ? std::atoll(argv[2]) : 20000000;
  const double int8 = best_gmacs<spin_int8>(threads, iters, kInt8Macs);
  const double fp32 = best_gmacs<spin_fp32>(threads, iters, kFp32Macs);
  std::printf(
      "{\"threads\": %d, \"units\": \"%s\", \"int8_gmacs\": %.1f, \"fp32_gmacs\": %.1f, "
      "\"sink\": %lld}\n",
      threads, kUnits, int8, fp32, static_cast<long long>(sink.load() & 1));
  return 0;
}
