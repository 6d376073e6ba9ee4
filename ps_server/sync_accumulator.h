#ifndef PSCLUSTER_PS_SERVER_SYNC_ACCUMULATOR_H_
#define PSCLUSTER_PS_SERVER_SYNC_ACCUMULATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace pscluster {

// What became of a gradient offered to an accumulator.
enum class AccumulateOutcome {
  kAccumulated,  // kept for its step; the step needs more gradients
  kComplete,     // the step's last needed gradient: the step's mean is now pending
  kStale,        // for a step already complete: dropped
  kDuplicate,    // this worker already gave a gradient for this step: dropped
  kAhead,        // for a step after the current one (computed before the global step went
                 // back to a checkpoint's): dropped
};

// SyncReplicas' conditional accumulator for one dense shard: takes gradients tagged with the
// step they were computed from, drops those of older steps, and once `replicas` distinct
// workers have given a gradient of the current step, their mean becomes the step's *pending*
// update and the accumulator moves on to the next step. A gradient of a newer step than the
// current one is dropped too: in sync mode every ps task completes step s before any worker gets
// the token of s + 1, so such a gradient can only come from before a recovery set the step back
// (SetStep).
//
// The pending update is applied lazily, by Settle() or by the first gradient of the next step:
// a pull for step s itself still reads the values from before step s. So a worker that died
// after pushing step s to some ps tasks and is started again computes step s from the same
// values as the first time, even where the step is already complete, and sync training stays
// a function of its configuration.
//
// Thread-safe: `apply` runs under the accumulator's lock, so a caller of Settle returns only
// once the pending update is in the shard.
class DenseAccumulator {
 public:
  using ApplyFn = std::function<void(const float* mean)>;

  DenseAccumulator(int64_t num_elements, int replicas);

  // Applies a pending update first if `step` is past it. A gradient taken (kAccumulated,
  // kComplete) gets the next number of the accumulator's order in *order when given (1, 2, ...:
  // adds() right after it): a backup takes the same gradients in the same order, so that it
  // sums them as its primary did (replication, docs/replication.md).
  AccumulateOutcome Add(int64_t step, int worker, const float* grad, const ApplyFn& apply,
                        int64_t* order = nullptr);
  // Applies the pending update if it belongs to a step before `before_step` (any step when
  // before_step < 0). Returns whether it applied one.
  bool Settle(int64_t before_step, const ApplyFn& apply);
  // Steps completed so far (applied or pending).
  int64_t step() const;
  // Gradients taken so far (since creation or the last SetStep).
  int64_t adds() const;
  // Starts over at `step`, dropping any partial or pending step; adds() starts again at 0.
  void SetStep(int64_t step);

 private:
  void SettleLocked(int64_t before_step, const ApplyFn& apply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t n_;
  const int replicas_;
  mutable absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t adds_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<double> sum_ ABSL_GUARDED_BY(mu_);
  bool pending_ ABSL_GUARDED_BY(mu_) = false;  // the mean of step step_ - 1, not yet applied
  std::vector<float> mean_ ABSL_GUARDED_BY(mu_);
};

// The same for a sparse table shard, with TensorFlow's SparseConditionalAccumulator average:
// each key's gradient is the mean over the gradients that contain the key (duplicates within
// one gradient are summed first). Thread-safe.
class SparseAccumulator {
 public:
  // `step` is the step whose mean it is.
  using ApplyFn =
      std::function<void(int64_t step, const int64_t* keys, int64_t n, const float* mean)>;

  SparseAccumulator(int64_t dim, int replicas);

  AccumulateOutcome Add(int64_t step, int worker, const int64_t* keys, int64_t n,
                        const float* grads, const ApplyFn& apply);
  // One part of a worker's gradient split over several pushes (disjoint keys): the worker
  // counts towards the step once all num_parts parts arrived; a part given twice (or a part
  // number outside [0, num_parts)) is kDuplicate.
  AccumulateOutcome Add(int64_t step, int worker, int part, int num_parts, const int64_t* keys,
                        int64_t n, const float* grads, const ApplyFn& apply);
  bool Settle(int64_t before_step, const ApplyFn& apply);
  int64_t step() const;
  void SetStep(int64_t step);

 private:
  struct KeySum {
    std::vector<float> sum;
    int count = 0;
  };
  void ResetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SettleLocked(int64_t before_step, const ApplyFn& apply) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t dim_;
  const int replicas_;
  mutable absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  // The parts each worker gave for the current step, and how many workers gave all of theirs.
  std::map<int, std::set<int>> parts_ ABSL_GUARDED_BY(mu_);
  int complete_workers_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int64_t, KeySum> sums_ ABSL_GUARDED_BY(mu_);
  bool pending_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int64_t> pending_keys_ ABSL_GUARDED_BY(mu_);
  std::vector<float> pending_mean_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_SYNC_ACCUMULATOR_H_
