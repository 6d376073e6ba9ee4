#include "common/thread_pool.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

// Every index is visited exactly once, in blocks of at least min_block (but the last), on as
// many threads as the pool has plus the caller.
TEST(ThreadPoolTest, ParallelForCoversTheRangeOnceInBigEnoughBlocks) {
  for (int threads : {0, 1, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 100, 1000}) {
      std::vector<std::atomic<int>> seen(n);
      std::mutex mu;
      std::vector<std::pair<int64_t, int64_t>> blocks;
      pool.ParallelFor(n, 10, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) seen[i].fetch_add(1);
        std::lock_guard<std::mutex> lock(mu);
        blocks.push_back({begin, end});
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i].load(), 1) << "n=" << n << " i=" << i;
      EXPECT_LE(static_cast<int>(blocks.size()), threads + 1);
      for (const auto& [begin, end] : blocks) {
        if (end != n) {
          EXPECT_GE(end - begin, 10) << "n=" << n;
        }
      }
    }
  }
}

TEST(ThreadPoolTest, ForEachIndexVisitsEveryIndexOnce) {
  for (int threads : {0, 1, 3}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 64, 1000}) {
      std::vector<std::atomic<int>> seen(n);
      pool.ForEachIndex(n, [&](int64_t i) { seen[i].fetch_add(1); });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i].load(), 1) << "n=" << n << " i=" << i;
    }
  }
}

// The caller does not wait for a helper that has not started: with the only pool thread busy,
// ForEachIndex finishes every index on the calling thread.
TEST(ThreadPoolTest, ForEachIndexDoesNotWaitForABusyPool) {
  // Declared before the pool, so that it outlives the pool's thread, which reads it until the
  // pool's destructor joins it.
  std::atomic<bool> release{false};
  ThreadPool pool(1);
  pool.Schedule([&release] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.ForEachIndex(16, [&](int64_t) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids, std::set<std::thread::id>{std::this_thread::get_id()});
  release = true;
}

TEST(ThreadPoolTest, ForEachIndexUsesOtherThreads) {
  ThreadPool pool(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.ForEachIndex(30, [&](int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 3u);
}

TEST(ThreadPoolTest, ParallelForUsesOtherThreads) {
  ThreadPool pool(2);
  std::mutex mu;
  std::set<std::thread::id> ids;
  pool.ParallelFor(3, 1, [&](int64_t, int64_t) {
    // Long enough that one thread cannot take every block.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 1u);
}

// A ParallelFor started while the pool's one thread is busy runs every block on the caller,
// and so does one inside a block of another on the same pool (a restore's reading ranges,
// each inserting its rows over the pool): neither waits for a thread that will not come.
// (When ParallelFor handed each block to a thread of its own, the nested loop never returned.)
TEST(ThreadPoolTest, ParallelForDoesNotWaitForABusyPool) {
  std::atomic<bool> release{false};
  ThreadPool pool(1);
  pool.Schedule([&release] {
    while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  std::mutex mu;
  std::set<std::thread::id> ids;
  int64_t covered = 0;
  pool.ParallelFor(100, 1, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mu);
    ids.insert(std::this_thread::get_id());
    covered += end - begin;
  });
  EXPECT_EQ(covered, 100);
  EXPECT_EQ(ids, std::set<std::thread::id>{std::this_thread::get_id()});
  release = true;

  ThreadPool two(2);
  std::atomic<int64_t> inner{0};
  two.ParallelFor(3, 1, [&](int64_t, int64_t) {
    // Every thread of the pool is in the outer loop while the inner ones run.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    two.ParallelFor(1000, 10, [&](int64_t begin, int64_t end) { inner.fetch_add(end - begin); });
  });
  EXPECT_EQ(inner.load(), 3000);
}

TEST(ThreadPoolTest, ScheduleRunsEverythingBeforeTheDestructorReturns) {
  std::atomic<int> ran{0};
  {
    ThreadPool pool(2);
    for (int i = 0; i < 100; ++i) pool.Schedule([&ran] { ran.fetch_add(1); });
  }
  EXPECT_EQ(ran.load(), 100);
  ThreadPool inline_pool(0);
  inline_pool.Schedule([&ran] { ran.fetch_add(1); });
  EXPECT_EQ(ran.load(), 101);
}

}  // namespace
}  // namespace pscluster
