#include "common/thread_pool.h"

#include <algorithm>

#define EIGEN_USE_THREADS
#include "unsupported/Eigen/CXX11/ThreadPool"

namespace pscluster {

struct ThreadPool::Impl {
  explicit Impl(int n) : pool(n) {}
  Eigen::ThreadPool pool;
};

ThreadPool::ThreadPool(int num_threads) : num_threads_(std::max(0, num_threads)) {
  if (num_threads_ > 0) impl_ = std::make_unique<Impl>(num_threads_);
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
  Eigen::Barrier done(static_cast<unsigned int>(blocks - 1));
  for (int64_t b = 1; b < blocks; ++b) {
    const int64_t begin = b * block;
    const int64_t end = std::min(n, begin + block);
    impl_->pool.Schedule([&fn, &done, begin, end] {
      fn(begin, end);
      done.Notify();
    });
  }
  fn(0, std::min(n, block));
  done.Wait();
}

}  // namespace pscluster
