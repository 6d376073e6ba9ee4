#ifndef PSCLUSTER_PS_SERVER_SYNC_ACCUMULATOR_H_
#define PSCLUSTER_PS_SERVER_SYNC_ACCUMULATOR_H_

#include <cstdint>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace pscluster {

// What became of a gradient offered to an accumulator.
enum class AccumulateOutcome {
  kAccumulated,  // kept for its step; the step needs more gradients
  kComplete,     // the step's last needed gradient: the mean is ready to apply, exactly once
  kStale,        // for a step already applied: dropped
  kDuplicate,    // this worker already gave a gradient for this step: dropped
  kAhead,        // for a step after the current one (computed before the global step went
                 // back to a checkpoint's): dropped
};

// SyncReplicas' conditional accumulator for one dense shard: takes gradients tagged with the
// step they were computed from, drops those of older steps, and once `replicas` distinct
// workers have given a gradient of the current step hands out their mean (and moves on to the
// next step). A gradient of a newer step than the current one is dropped too: in sync mode
// every ps task finishes step s before any worker gets the token of s + 1, so such a gradient
// can only come from before a recovery set the step back (SetStep). Thread-safe.
class DenseAccumulator {
 public:
  DenseAccumulator(int64_t num_elements, int replicas);

  // On kComplete, *mean holds the mean gradient of the step.
  AccumulateOutcome Add(int64_t step, int worker, const float* grad, std::vector<float>* mean);
  // The step being accumulated (the number of steps applied so far).
  int64_t step() const;
  void SetStep(int64_t step);

 private:
  const int64_t n_;
  const int replicas_;
  mutable absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int> workers_ ABSL_GUARDED_BY(mu_);
  std::vector<double> sum_ ABSL_GUARDED_BY(mu_);
};

// The same for a sparse table shard, with TensorFlow's SparseConditionalAccumulator average:
// each key's gradient is the mean over the gradients that contain the key (duplicates within
// one gradient are summed first). Thread-safe.
class SparseAccumulator {
 public:
  SparseAccumulator(int64_t dim, int replicas);

  // On kComplete, *keys and *mean hold each distinct key of the step and its mean gradient.
  AccumulateOutcome Add(int64_t step, int worker, const int64_t* keys, int64_t n,
                        const float* grads, std::vector<int64_t>* out_keys,
                        std::vector<float>* mean);
  int64_t step() const;
  void SetStep(int64_t step);

 private:
  struct KeySum {
    std::vector<float> sum;
    int count = 0;
  };
  void ResetLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t dim_;
  const int replicas_;
  mutable absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int> workers_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, KeySum> sums_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_SYNC_ACCUMULATOR_H_
