// The read-bandwidth probe (measure_read_bandwidth, declared in kernel_ops.h): the floor every
// decode kernel is measured against, read from the weights' own allocator on the kernels' team.
#include <flashrt/errors.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/thread_pool.h>

#include "quant/weight_memory.h"

#if defined(__x86_64__)
#include <emmintrin.h>
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>

namespace frt {
namespace {

volatile uint64_t g_bandwidth_sink = 0;

// Note [Read probe]: the probe must read as well as the best kernel does, or "fraction of
// bandwidth" exceeds 1. It keeps four independent 128-bit sums (SSE2: the x86-64 baseline, no
// ISA flags in the core), and reads both with a software prefetch 2 KiB ahead and without one,
// alternating repeats: which is faster depends on the CPU. An earlier machine of this kind
// favoured the prefetch (plain loads ~22-28 GB/s, prefetched ~27-31); an AMD family 25 model 17
// guest (Zen 4) reads 27.1 GB/s plain on one thread where the prefetched loads read 22.7 (32.5
// and 30.4 on two). It runs on the team the kernels run on (process_parallel(): torch's OpenMP team
// inside a torch process), so it reads with the threads the kernels have (Note [One team per
// process]).
uint64_t sum_words(const uint64_t* p, int64_t n, bool prefetch) {
#if defined(__x86_64__)
  __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(p + i) + 2048, _MM_HINT_T0);
    s0 = _mm_add_epi64(s0, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i)));
    s1 = _mm_add_epi64(s1, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + 2)));
    s2 = _mm_add_epi64(s2, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + 4)));
    s3 = _mm_add_epi64(s3, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + 6)));
  }
  alignas(16) uint64_t lanes[2];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes),
                  _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3)));
  uint64_t total = lanes[0] + lanes[1];
#else
  (void)prefetch;
  uint64_t total = 0;
  int64_t i = 0;
#endif
  for (; i < n; ++i) total += p[i];
  return total;
}
}  // namespace

double measure_read_bandwidth(int64_t bytes, int threads, int repeats) {
  if (bytes < (1 << 20) || threads < 1 || repeats < 1)
    throw InvalidArgument("measure_read_bandwidth: need >= 1 MiB, >= 1 thread, >= 1 repeat");
  const int64_t words = bytes / 8;
  // The memory packed weights get (Note [Weights in huge pages]): the probe reads what they read.
  std::unique_ptr<uint64_t[], WeightMemoryFree> buf(
      static_cast<uint64_t*>(alloc_weight_memory(words * 8)));
  for (int64_t i = 0; i < words; ++i) buf[i] = static_cast<uint64_t>(i);
  Parallel& pool = process_parallel();
  threads = std::min(threads, pool.size());
  std::atomic<uint64_t> sink{0};
  double best = 0;
  for (int rep = 0; rep < repeats; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.run(threads, [&](int ith, int team) {
      const int64_t per = words / team, begin = ith * per;
      const int64_t end = ith == team - 1 ? words : begin + per;
      sink.fetch_add(sum_words(buf.get() + begin, end - begin, rep % 2 == 0),
                     std::memory_order_relaxed);
    });
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, static_cast<double>(words * 8) / secs / 1e9);
  }
  g_bandwidth_sink = sink.load();  // keeps the sums observable
  return best;
}

}  // namespace frt
