#include <flashrt/errors.h>
#include <flashrt/thread_pool.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>

namespace frt {
namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

}  // namespace

// Note [Spin then sleep]: a decode step alternates our kernels with torch operators. Workers
// that sleep right after a job pay a futex wake (several microseconds) on every kernel; workers
// that spin forever steal a core from torch's OpenMP threads in between. They spin for spin_us
// after a job, then sleep. bench/kernels.py measures the cost both ways ("threading" rows).
ThreadPool::ThreadPool(int threads, int spin_us) : spin_us_(spin_us) {
  if (threads < 1) throw InvalidArgument("ThreadPool needs at least one thread");
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_main(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::worker_main(int ith) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    if (gen == seen) {
      const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(spin_us_);
      while ((gen = generation_.load(std::memory_order_acquire)) == seen &&
             std::chrono::steady_clock::now() < until)
        for (int i = 0; i < 64; ++i) cpu_relax();
      if (gen == seen) {
        sleepers_.fetch_add(1);
        generation_.wait(seen);
        sleepers_.fetch_sub(1);
        continue;
      }
    }
    if (stop_.load()) return;
    // Note [Whose job is it]: a worker outside a job's team (ith >= its team size) may read the
    // job after its team finished and run() began publishing the next one. It must not take the
    // next job's fields for this generation's: it would run its share of the next job now, and
    // again when it sees the next generation, counting itself out of `pending` twice, so run()
    // would return while a teammate still works (a phase overlapping the next). The fields are
    // read between two reads of job_gen_ (a sequence lock: run() zeroes it while it replaces
    // them); a job is only replaced after its team is done, so a worker that finds them replaced
    // had no share in this generation's.
    const uint64_t before = job_gen_.load(std::memory_order_acquire);
    const std::function<void(int, int)>* job = job_.load(std::memory_order_relaxed);
    const int threads = job_threads_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    const uint64_t after = job_gen_.load(std::memory_order_relaxed);
    seen = gen;
    if (before == gen && after == gen && ith < threads) {
      (*job)(ith, threads);
      pending_.fetch_sub(1, std::memory_order_acq_rel);
    }
  }
}

void ThreadPool::run(int nth, const std::function<void(int, int)>& fn) {
  std::unique_lock lock(run_mu_, std::try_to_lock);
  if (!lock.owns_lock() || nth <= 1 || workers_.empty()) {
    fn(0, 1);
    return;
  }
  nth = nth > size() ? size() : nth;
  // Note [Whose job is it]: job_gen_ is 0 while the fields change, the new generation after.
  const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
  job_gen_.store(0, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  job_.store(&fn, std::memory_order_relaxed);
  job_threads_.store(nth, std::memory_order_relaxed);
  pending_.store(nth - 1, std::memory_order_relaxed);
  job_gen_.store(gen, std::memory_order_release);
  generation_.store(gen, std::memory_order_release);
  if (sleepers_.load() > 0) generation_.notify_all();
  fn(0, nth);
  while (pending_.load(std::memory_order_acquire) > 0) cpu_relax();
}

std::string ThreadPool::describe() const {
  return "flashrt thread pool, " + std::to_string(size()) + " threads";
}

// Note [One team per process]: torch runs its operators on an OpenMP team whose idle threads
// spin for a while after every parallel region. A second team of ours, started right after a
// torch operator, finds the other core taken by that spinning thread and waits for a scheduler
// time slice (milliseconds, measured: 7.7 ms per call instead of 0.13 ms on a 2-core machine).
// Running our phases as parallel regions of torch's own runtime uses exactly the threads that
// are spinning, so there is nothing to fight.
OpenMpTeam::OpenMpTeam(OpenMpRuntime rt) : rt_(std::move(rt)) {
  if (rt_.parallel == nullptr || rt_.thread_num == nullptr || rt_.num_threads == nullptr ||
      rt_.max_threads == nullptr)
    throw InvalidArgument("host OpenMP runtime '" + rt_.library + "' lacks an entry point");
}

int OpenMpTeam::size() const {
  const int n = rt_.max_threads();
  return n < 1 ? 1 : n;
}

// The runtime may give a region fewer threads than asked (a region opened inside another, a
// thread limit): each thread reads the team's real size, so the split covers every share.
void OpenMpTeam::run(int nth, const std::function<void(int, int)>& fn) {
  nth = nth > size() ? size() : nth;
  if (nth <= 1) {
    fn(0, 1);
    return;
  }
  struct Region {
    const std::function<void(int, int)>* fn;
    int (*thread_num)();
    int (*num_threads)();
  } region{&fn, rt_.thread_num, rt_.num_threads};
  rt_.parallel(
      [](void* p) {
        auto* r = static_cast<Region*>(p);
        (*r->fn)(r->thread_num(), r->num_threads());
      },
      &region, static_cast<unsigned>(nth), 0);
}

std::string OpenMpTeam::describe() const {
  return "host OpenMP team (" + rt_.library + "), " + std::to_string(size()) + " threads";
}

namespace {
std::mutex g_parallel_mu;
std::unique_ptr<OpenMpTeam> g_host_team;  // replaced teams are kept: a kernel may still use one
std::vector<std::unique_ptr<OpenMpTeam>> g_retired_teams;
std::atomic<Parallel*> g_parallel{nullptr};
}  // namespace

Parallel& process_parallel() {
  if (Parallel* p = g_parallel.load(std::memory_order_acquire)) return *p;
  return ThreadPool::process();
}

void use_host_openmp(OpenMpRuntime rt) {
  auto team = std::make_unique<OpenMpTeam>(std::move(rt));
  std::lock_guard lock(g_parallel_mu);
  if (g_host_team) g_retired_teams.push_back(std::move(g_host_team));
  g_host_team = std::move(team);
  g_parallel.store(g_host_team.get(), std::memory_order_release);
}

void use_own_threads() { g_parallel.store(nullptr, std::memory_order_release); }

ThreadPool& ThreadPool::process() {
  static ThreadPool pool([] {
    if (const char* env = std::getenv("FRT_NUM_THREADS")) {
      const int n = std::atoi(env);
      if (n >= 1) return n;
    }
    const unsigned hw = std::thread::hardware_concurrency();
    return hw == 0 ? 1 : static_cast<int>(hw);
  }());
  return pool;
}

}  // namespace frt
