// Plain reads of 960 MiB in calls of 1-16 MiB, two threads, one parallel region a call (each
// thread reading half of it), against one region reading it all: what a call of a decode step's
// size can read at best on this machine, with no kernel in it. The weights' allocator (huge
// pages) holds the buffer. A probe, not a benchmark: no JSON.
//
//   cmake --build build/cxx
//   g++ -std=c++20 -O2 -Icore/include -Icore/src bench/probes/chunked_reads.cpp
//       build/cxx/core/libflashrt_core.a -lyaml-cpp -lpthread -ldl -o /tmp/chunked_reads
//   (one command line)
//   /tmp/chunked_reads [1]   # 1: with a software prefetch 2 KiB ahead
#include <emmintrin.h>
#include <flashrt/thread_pool.h>
#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <vector>

// The weights' allocator is internal to the core; the probe reads the memory packs get.
#include "quant/weight_memory.h"

namespace {

using Clock = std::chrono::steady_clock;

volatile uint64_t g_sink = 0;  // the sums, so no read is optimised away

double us_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// Four independent 128-bit sums, as the read probe keeps (Note [Read probe]).
uint64_t sum_words(const uint64_t* p, int64_t n, bool prefetch) {
  __m128i s0 = _mm_setzero_si128(), s1 = s0, s2 = s0, s3 = s0;
  for (int64_t i = 0; i + 8 <= n; i += 8) {
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(p + i) + 2048, _MM_HINT_T0);
    s0 = _mm_add_epi64(s0, _mm_load_si128(reinterpret_cast<const __m128i*>(p + i)));
    s1 = _mm_add_epi64(s1, _mm_load_si128(reinterpret_cast<const __m128i*>(p + i + 2)));
    s2 = _mm_add_epi64(s2, _mm_load_si128(reinterpret_cast<const __m128i*>(p + i + 4)));
    s3 = _mm_add_epi64(s3, _mm_load_si128(reinterpret_cast<const __m128i*>(p + i + 6)));
  }
  s0 = _mm_add_epi64(_mm_add_epi64(s0, s1), _mm_add_epi64(s2, s3));
  alignas(16) uint64_t lanes[2];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), s0);
  return lanes[0] + lanes[1];
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t total = int64_t{960} << 20, words = total / 8;
  const bool prefetch = argc > 1 && argv[1][0] == '1';
  auto* buf = static_cast<uint64_t*>(frt::alloc_weight_memory(total));
  for (int64_t i = 0; i < words; ++i) buf[i] = static_cast<uint64_t>(i);
  frt::ThreadPool pool(2);
  std::atomic<uint64_t> sink{0};
  const auto read = [&](const uint64_t* at, int64_t n) {
    pool.run(2, [&](int ith, int team) {
      const int64_t per = n / team;
      sink += sum_words(at + ith * per, per, prefetch);
    });
  };
  for (int round = 0; round < 3; ++round) {
    const auto t0 = Clock::now();
    read(buf, words);
    std::printf("all 960 MiB in one region: %.1f GB/s\n",
                total / us_between(t0, Clock::now()) / 1e3);
    for (const int64_t call : {int64_t{1} << 20, int64_t{3} << 19, int64_t{5} << 19,
                               int64_t{4} << 20, int64_t{16} << 20}) {
      std::vector<double> took;
      for (int64_t c = 0; c < total / call; ++c) {
        const auto c0 = Clock::now();
        read(buf + c * (call / 8), call / 8);
        took.push_back(us_between(c0, Clock::now()));
      }
      std::sort(took.begin(), took.end());
      const double median = took[took.size() / 2];
      std::printf("  calls of %5.2f MiB: median %.1f us, %.1f GB/s\n", call / 1048576.0, median,
                  call / median / 1e3);
    }
  }
  frt::free_weight_memory(buf);
  g_sink = sink.load();
  return 0;
}
