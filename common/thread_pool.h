#ifndef PSCLUSTER_COMMON_THREAD_POOL_H_
#define PSCLUSTER_COMMON_THREAD_POOL_H_

#include <cstdint>
#include <functional>
#include <memory>

namespace pscluster {

// A fixed set of worker threads (Eigen's non-blocking pool, the one TensorFlow's runtime uses)
// with the things this project asks of one: run a closure later, and split a loop over [0, n)
// into parts that run in parallel, the calling thread taking some of them.
//
// By default the threads do not spin when idle: Eigen's default has an idle thread try thousands of
// steals before it sleeps, which on a machine whose cores are all busy (a ps and its clients on
// two cores) burns the CPU the other processes need. Without it a 1 MiB dense push cost the ps
// 13-15 % less CPU per GB (1 ps + 1 client; docs/benchmarks_history.md, session 13). Waking a
// sleeping thread costs microseconds, far less than the work handed to the pool.
//
// Thread-safe. The destructor waits for scheduled closures to finish.
class ThreadPool {
 public:
  // `num_threads` >= 0; with 0, Schedule runs the closure at once on the calling thread and
  // ParallelFor runs the whole loop there. With `spin`, a thread that runs out of work tries
  // to steal more for a while (Eigen's spinning, some microseconds) before it sleeps: for work
  // that comes in bursts microseconds apart, on machines with cores to spare.
  explicit ThreadPool(int num_threads, bool spin = false);
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Runs `fn` on a pool thread.
  void Schedule(std::function<void()> fn);

  // Calls fn(begin, end) for consecutive blocks covering [0, n), each at least `min_block`
  // long (but the last), at most num_threads() + 1 of them, and returns when every call has
  // returned. The blocks run concurrently: fn must be safe to call from several threads on
  // disjoint ranges. Block boundaries depend only on n, min_block and num_threads(); which
  // thread runs a block does not (as ForEachIndex: the caller takes what no pool thread has,
  // so a loop inside a loop on the same pool, or one started while the pool is busy, does not
  // wait for a pool thread to come free).
  void ParallelFor(int64_t n, int64_t min_block, const std::function<void(int64_t, int64_t)>& fn);

  // Calls fn(i) once for every i in [0, n), on the calling thread and on up to
  // min(num_threads(), n - 1) pool threads, each taking the next index nobody has taken yet, and
  // returns when every call has returned. Unlike ParallelFor's fixed blocks, a pool thread that
  // the machine does not schedule in time (every core busy) holds nobody up: the caller takes
  // its share, and the helper, when it runs, finds nothing left. Which thread runs an index is
  // not fixed, so fn's result must not depend on it.
  void ForEachIndex(int64_t n, const std::function<void(int64_t)>& fn);

 private:
  struct Impl;  // Eigen's pool, kept out of this header
  const int num_threads_;
  std::unique_ptr<Impl> impl_;  // null when num_threads_ is 0
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_THREAD_POOL_H_
