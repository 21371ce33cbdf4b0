// Who runs a kernel's threads. Inside a PyTorch host the door hands the core torch's own OpenMP
// runtime, so kernels run on the threads torch already keeps hot instead of a second team that
// would fight them for the cores (Note [One team per process] in thread_pool.cpp). Elsewhere (the
// C++ tests, a host without OpenMP) the core's own ThreadPool serves.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace frt {

class Parallel {
 public:
  virtual ~Parallel() = default;
  virtual int size() const = 0;
  // Calls fn(ith, team) for ith in [0, team), the caller's thread included, and returns when
  // all have finished. team is the number of threads that actually run: at most nth (clamped to
  // size()), fewer when the threads are busy (a concurrent caller of a ThreadPool runs inline,
  // team 1; an OpenMP runtime may give a smaller team). Work must be split by team, never by
  // the nth asked for, or a share goes uncomputed. All team threads run concurrently. fn must
  // not throw.
  virtual void run(int nth, const std::function<void(int ith, int team)>& fn) = 0;
  virtual std::string describe() const = 0;
};

// The entry points of a host's OpenMP runtime (libgomp's ABI), found by the door.
struct OpenMpRuntime {
  void (*parallel)(void (*fn)(void*), void* data, unsigned num_threads, unsigned flags) = nullptr;
  int (*thread_num)() = nullptr;
  int (*num_threads)() = nullptr;  // the team's size, inside a region
  int (*max_threads)() = nullptr;
  std::string library;  // where they came from, for reports
};

class OpenMpTeam : public Parallel {
 public:
  explicit OpenMpTeam(OpenMpRuntime rt);
  int size() const override;  // the host's current thread count (torch.set_num_threads)
  void run(int nth, const std::function<void(int, int)>& fn) override;
  std::string describe() const override;

 private:
  OpenMpRuntime rt_;
};

// The process's kernel threads: the host's OpenMP team once use_host_openmp() was called, the
// core's ThreadPool::process() before that.
Parallel& process_parallel();
// Throws InvalidArgument if an entry point is missing.
void use_host_openmp(OpenMpRuntime rt);
void use_own_threads();

class ThreadPool : public Parallel {
 public:
  explicit ThreadPool(int threads, int spin_us = 50);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const override { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(ith, team) for ith in [0, team) and returns when all have finished. A second
  // thread calling while a job runs gets its job run inline on its own thread (team 1) instead
  // of waiting, so two callers never deadlock or interleave.
  void run(int nth, const std::function<void(int, int)>& fn) override;
  std::string describe() const override;

  // The process pool: FRT_NUM_THREADS threads, else one per online CPU.
  static ThreadPool& process();

 private:
  void worker_main(int ith);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  // The job and its team size, and the generation they were published with (0 while run()
  // replaces them): Note [Whose job is it] in thread_pool.cpp.
  std::atomic<const std::function<void(int, int)>*> job_{nullptr};
  std::atomic<int> job_threads_{0};
  std::atomic<uint64_t> job_gen_{0};
  int spin_us_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace frt
