// One M = 1 linear call at a time over copies of one pack that total 960 MiB (so each call reads
// its weights from DRAM, as a decode step does), timed per call and per thread of the team: when
// each thread starts its share and how long it takes. Beside it, the same call repeated on one
// copy (in cache). With no Python between the calls, what is left is the kernel's and the
// memory's; the pages the copies lie in are printed (weight_memory_pages()), since they decide
// it (Note [Weights in huge pages]). A probe, not a benchmark: no JSON.
//
//   cmake --build build/cxx
//   g++ -std=c++20 -O2 -Icore/include bench/probes/cold_call_threads.cpp
//       build/cxx/core/libflashrt_core.a -lyaml-cpp -lpthread -ldl -o /tmp/cold_call_threads
//   (one command line)
//   /tmp/cold_call_threads 768 2             # outputs, threads: int8 g64 f16 at k = 4096
//   /tmp/cold_call_threads 1024 2 w4a8_super 2048   # ... form, k (Qwen3-0.6B's o projection)
//   forms: int8_g64_f16 (flashrt/linear, the host's activations), w4a8_super (Q4_K's
//   int4_super_gemm), w6a8_super (Q6_K's int6_super_gemm), w8a8 (int8_gemm blocks of 32):
//   the last three on flashrt/gemm. FRT_HUGE_PAGES=0 to compare small pages.
#include <flashrt/hub.h>
#include <flashrt/kernel_ops.h>
#include <flashrt/pack.h>
#include <flashrt/thread_pool.h>
#include <flashrt/weight_memory.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

using frt::DType;
using frt::PackedLinear;
using frt::TensorView;

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The core's pool, recording when each thread starts and ends each parallel region of a call.
class TimedTeam : public frt::Parallel {
 public:
  static constexpr int kMaxRegions = 4, kMaxThreads = 16;
  explicit TimedTeam(frt::ThreadPool& pool) : pool_(pool) {}
  int size() const override { return pool_.size(); }
  void run(int nth, const std::function<void(int, int)>& fn) override {
    const int region = std::min(regions++, kMaxRegions - 1);
    pool_.run(nth, [&](int ith, int team) {
      start[region][ith] = now_us();
      fn(ith, team);
      end[region][ith] = now_us();
    });
  }
  std::string describe() const override { return "timed " + pool_.describe(); }

  int regions = 0;
  double start[kMaxRegions][kMaxThreads] = {}, end[kMaxRegions][kMaxThreads] = {};

 private:
  frt::ThreadPool& pool_;
};

// Where the copies lie: the arena's resident bytes and how many are in huge pages
// (weight_memory_pages(), the figures attach notes).
void print_huge_pages() {
  const frt::WeightMemoryPages p = frt::weight_memory_pages();
  if (!p.known) {
    std::printf("weight pages unknown (no arena, or smaps unreadable)\n");
    return;
  }
  std::printf("arena: %.1f MB resident, %.1f MB in huge pages\n", p.resident_bytes / 1e6,
              p.huge_bytes / 1e6);
}

// The pack of `form` (the names above), or none for another name or a shape the form refuses
// (the super forms need k a multiple of 256), the reason printed.
std::optional<PackedLinear> pack_form(const std::string& form, const TensorView& w) try {
  if (form == "int8_g64_f16") return PackedLinear::int8(w, 64, DType::f16);
  if (form == "w4a8_super") return PackedLinear::int4_super_gemm(w);
  if (form == "w6a8_super") return PackedLinear::int6_super_gemm(w);
  if (form == "w8a8") return PackedLinear::int8_gemm(w, 32);
  std::fprintf(stderr, "unknown form %s (int8_g64_f16, w4a8_super, w6a8_super, w8a8)\n",
               form.c_str());
  return std::nullopt;
} catch (const std::exception& e) {
  std::fprintf(stderr, "%s: %s\n", form.c_str(), e.what());
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 768;
  const std::string form = argc > 3 ? argv[3] : "int8_g64_f16";
  const int64_t k = argc > 4 ? std::atoll(argv[4]) : 4096;
  const int threads = std::clamp(argc > 2 ? std::atoi(argv[2]) : 2, 1, TimedTeam::kMaxThreads);
  frt::KernelPathConfig config;
  config.bundled_root = std::getenv("KROOT") ? std::getenv("KROOT") : "build/cxx/kernel_root";
  frt::KernelHub hub(config);

  std::vector<float> w(static_cast<size_t>(n * k));
  std::mt19937 gen(1);
  std::normal_distribution<float> normal(0, 0.05f);
  for (float& v : w) v = normal(gen);
  const std::optional<PackedLinear> packed =
      pack_form(form, TensorView::matrix(w.data(), DType::f32, n, k, k));
  if (!packed) return 2;
  const PackedLinear& first = *packed;
  // The host's-activation form runs on flashrt/linear, the integer forms on flashrt/gemm.
  const frt_kernel_table& table =
      hub.table(form == "int8_g64_f16" ? "flashrt/linear" : "flashrt/gemm");
  const int64_t copies =
      std::max<int64_t>(2, ((int64_t{960} << 20) + first.nbytes() - 1) / first.nbytes());
  std::vector<PackedLinear> packs;
  for (int64_t i = 0; i < copies; ++i) packs.push_back(first.copy());
  print_huge_pages();

  std::vector<float> x(static_cast<size_t>(k), 0.1f), y(static_cast<size_t>(n));
  const TensorView xv = TensorView::matrix(x.data(), DType::f32, 1, k, k);
  const TensorView yv = TensorView::matrix(y.data(), DType::f32, 1, n, n);
  frt::ThreadPool pool(threads);
  TimedTeam team(pool);
  std::vector<double> call, hot;
  std::vector<std::vector<double>> late(threads), took(threads);
  for (int64_t i = 0; i < std::max<int64_t>(3 * copies, 300); ++i) {
    team.regions = 0;
    const double t0 = now_us();
    frt::run_linear(table, team, packs[i % copies], nullptr, xv, yv, threads);
    call.push_back(now_us() - t0);
    const int last = team.regions - 1;  // the panels' phase
    for (int t = 0; t < threads; ++t) {
      late[t].push_back(team.start[last][t] - t0);
      took[t].push_back(team.end[last][t] - team.start[last][t]);
    }
  }
  for (int i = 0; i < 300; ++i) {
    const double t0 = now_us();
    frt::run_linear(table, team, first, nullptr, xv, yv, threads);
    hot.push_back(now_us() - t0);
  }
  std::printf(
      "%lld x %lld %s, %.1f MB, %lld copies, %d threads: from DRAM %.1f us a call "
      "(%.1f GB/s), in cache %.1f us\n",
      static_cast<long long>(k), static_cast<long long>(n), form.c_str(), first.nbytes() / 1e6,
      static_cast<long long>(copies), threads, median(call), first.nbytes() / median(call) / 1e3,
      median(hot));
  for (int t = 0; t < threads; ++t)
    std::printf("  thread %d: starts its panels at %.1f us, takes %.1f us\n", t, median(late[t]),
                median(took[t]));
  return 0;
}
