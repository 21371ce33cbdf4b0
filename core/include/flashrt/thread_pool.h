// The core's worker threads for kernels. The calling thread is worker 0; the others spin for a
// short while after each job and then sleep on a futex, so between two kernels they do not keep
// both cores busy while torch's own threads run (Note [Spin then sleep] in thread_pool.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace frt {

class ThreadPool {
 public:
  explicit ThreadPool(int threads, int spin_us = 50);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(ith) for ith in [0, nth) (nth clamped to size()) and returns when all have
  // finished. A second thread calling while a job runs gets its job run inline on its own
  // thread instead of waiting, so two callers never deadlock or interleave.
  void run(int nth, const std::function<void(int)>& fn);

  // The process pool: FRT_NUM_THREADS threads, else one per online CPU.
  static ThreadPool& process();

 private:
  void worker_main(int ith);

  std::vector<std::thread> workers_;
  std::mutex run_mu_;
  const std::function<void(int)>* job_ = nullptr;
  int job_threads_ = 0;
  int spin_us_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace frt
