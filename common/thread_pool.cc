#include "common/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>

#include "absl/synchronization/mutex.h"

#define EIGEN_USE_THREADS
#include "unsupported/Eigen/CXX11/ThreadPool"

namespace pscluster {

struct ThreadPool::Impl {
  Impl(int n, bool spin) : pool(n, /*allow_spinning=*/spin) {}
  Eigen::ThreadPool pool;
};

ThreadPool::ThreadPool(int num_threads, bool spin) : num_threads_(std::max(0, num_threads)) {
  if (num_threads_ > 0) impl_ = std::make_unique<Impl>(num_threads_, spin);
}

ThreadPool::~ThreadPool() = default;

void ThreadPool::Schedule(std::function<void()> fn) {
  if (impl_ == nullptr) {
    fn();
    return;
  }
  impl_->pool.Schedule(std::move(fn));
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_block,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_block = std::max<int64_t>(1, min_block);
  const int64_t max_blocks = std::min<int64_t>(num_threads_ + 1, (n + min_block - 1) / min_block);
  if (max_blocks <= 1) {
    fn(0, n);
    return;
  }
  const int64_t block = (n + max_blocks - 1) / max_blocks;
  const int64_t blocks = (n + block - 1) / block;
  // The blocks taken by whichever thread is free, the caller included: a loop started from
  // one of the pool's own threads, or while they are all busy, never waits for one of them.
  ForEachIndex(blocks, [&fn, n, block](int64_t b) { fn(b * block, std::min(n, (b + 1) * block)); });
}

void ThreadPool::ForEachIndex(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (impl_ == nullptr || n == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  // Shared with the helpers, which may start after the caller has returned. A helper touches
  // fn only for an index it took, and the caller waits for every index to be done, so a late
  // one, finding every index taken, never reaches fn.
  struct State {
    State(int64_t n, const std::function<void(int64_t)>* fn) : n(n), fn(fn) {}
    const int64_t n;
    const std::function<void(int64_t)>* const fn;
    std::atomic<int64_t> next{0};
    absl::Mutex mu;
    int64_t done ABSL_GUARDED_BY(mu) = 0;

    void Work() {
      int64_t finished = 0;
      for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
        (*fn)(i);
        ++finished;
      }
      if (finished > 0) {
        absl::MutexLock lock(&mu);
        done += finished;
      }
    }
    bool AllDone() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return done == n; }
  };
  auto state = std::make_shared<State>(n, &fn);
  const int64_t helpers = std::min<int64_t>(num_threads_, n - 1);
  for (int64_t h = 0; h < helpers; ++h) {
    impl_->pool.Schedule([state] { state->Work(); });
  }
  state->Work();
  absl::MutexLock lock(&state->mu);
  state->mu.Await(absl::Condition(state.get(), &State::AllDone));
}

}  // namespace pscluster
