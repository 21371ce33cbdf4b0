#include <flashrt/errors.h>
#include <flashrt/thread_pool.h>
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace frt {
namespace {

TEST(ThreadPool, RunsEveryIndexOnceAndReturnsAfterAll) {
  ThreadPool pool(2, 0);  // no spinning: every job goes through the futex wake path
  for (int round = 0; round < 200; ++round) {
    std::vector<std::atomic<int>> hits(2);
    pool.run(2, [&](int ith) { hits[ith].fetch_add(1); });
    ASSERT_EQ(hits[0].load(), 1);
    ASSERT_EQ(hits[1].load(), 1);
  }
}

TEST(ThreadPool, ClampsToItsSizeAndRunsInlineForOneThread) {
  ThreadPool pool(2);
  std::atomic<int> calls{0};
  pool.run(8, [&](int ith) {
    EXPECT_LT(ith, 2);
    calls.fetch_add(1);
  });
  EXPECT_EQ(calls.load(), 2);
  const auto caller = std::this_thread::get_id();
  pool.run(1, [&](int) { EXPECT_EQ(std::this_thread::get_id(), caller); });
  EXPECT_THROW(ThreadPool(0), InvalidArgument);
}

TEST(ThreadPool, ConcurrentCallersBothFinishWithoutDeadlock) {
  ThreadPool pool(2);
  std::atomic<long> total{0};
  auto caller = [&] {
    for (int i = 0; i < 500; ++i) pool.run(2, [&](int) { total.fetch_add(1); });
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  // Each job runs either on both pool threads (2 calls) or inline on its caller (1 call).
  EXPECT_GE(total.load(), 1000);
  EXPECT_LE(total.load(), 2000);
}

}  // namespace
}  // namespace frt
