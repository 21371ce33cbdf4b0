#include <flashrt/errors.h>
#include <flashrt/thread_pool.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace frt {
namespace {

TEST(ThreadPool, RunsEveryIndexOnceAndReturnsAfterAll) {
  ThreadPool pool(2, 0);  // no spinning: every job goes through the futex wake path
  for (int round = 0; round < 200; ++round) {
    std::vector<std::atomic<int>> hits(2);
    pool.run(2, [&](int ith, int team) {
      EXPECT_EQ(team, 2);
      hits[ith].fetch_add(1);
    });
    ASSERT_EQ(hits[0].load(), 1);
    ASSERT_EQ(hits[1].load(), 1);
  }
}

TEST(ThreadPool, ClampsToItsSizeAndRunsInlineForOneThread) {
  ThreadPool pool(2);
  std::atomic<int> calls{0};
  pool.run(8, [&](int ith, int team) {
    EXPECT_EQ(team, 2);
    EXPECT_LT(ith, 2);
    calls.fetch_add(1);
  });
  EXPECT_EQ(calls.load(), 2);
  const auto caller = std::this_thread::get_id();
  pool.run(1, [&](int, int team) {
    EXPECT_EQ(team, 1);
    EXPECT_EQ(std::this_thread::get_id(), caller);
  });
  EXPECT_THROW(ThreadPool(0), InvalidArgument);
}

TEST(ThreadPool, ConcurrentCallersBothFinishWithoutDeadlock) {
  ThreadPool pool(2);
  std::atomic<long> total{0};
  auto caller = [&] {
    for (int i = 0; i < 500; ++i) pool.run(2, [&](int, int) { total.fetch_add(1); });
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  // Each job runs either on both pool threads (2 calls) or inline on its caller (1 call).
  EXPECT_GE(total.load(), 1000);
  EXPECT_LE(total.load(), 2000);
}

// A job split by the team it is told covers all its work whoever runs it: a concurrent caller
// that is run inline is told team 1. (Before, the inline caller ran fn(0) of a split made for
// two threads, and half of its work went uncomputed.)
TEST(ThreadPool, ConcurrentCallersCoverTheirWholeJob) {
  ThreadPool pool(2);
  constexpr int kItems = 64;
  std::atomic<int> short_jobs{0}, inline_jobs{0};
  auto caller = [&] {
    for (int i = 0; i < 300; ++i) {
      std::vector<std::atomic<int>> done(kItems);
      pool.run(2, [&](int ith, int team) {
        if (team == 1) inline_jobs.fetch_add(1);
        for (int item = ith; item < kItems; item += team) {
          // long enough for the two callers' jobs to overlap
          const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(2);
          while (std::chrono::steady_clock::now() < until) {
          }
          done[item].fetch_add(1);
        }
      });
      for (const auto& d : done)
        if (d.load() != 1) {
          short_jobs.fetch_add(1);
          break;
        }
    }
  };
  std::thread a(caller), b(caller);
  a.join();
  b.join();
  EXPECT_GT(inline_jobs.load(), 0);  // the case under test happened
  EXPECT_EQ(short_jobs.load(), 0);
}

}  // namespace
}  // namespace frt
