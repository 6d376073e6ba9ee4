#ifndef PSCLUSTER_PS_SERVER_DENSE_SHARD_H_
#define PSCLUSTER_PS_SERVER_DENSE_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "proto/ps_service.pb.h"
#include "ps_server/float_stats.h"
#include "ps_server/optimizer.h"

namespace pscluster {

class ThreadPool;

// Traffic counters of one shard, updated without locks.
struct ShardCounters {
  std::atomic<int64_t> pushes{0};
  std::atomic<int64_t> pulls{0};
  std::atomic<int64_t> bytes_in{0};
  std::atomic<int64_t> bytes_out{0};
  std::atomic<int64_t> last_update_unix_micros{0};
  std::atomic<int64_t> dropped_stale{0};

  void FillStats(v1::ShardStats* stats) const;
};

// "variable/partition": how errors and logs name one dense shard.
inline std::string DenseName(const std::string& variable, int32_t partition) {
  return absl::StrCat(variable, "/", partition);
}

// One partition of a dense float32 variable held by a ps task: its values, the optimizer's
// slots (stored beside the values, same layout) and the number of updates applied.
//
// Thread-safe: one reader/writer lock per shard. A reader sees a whole update or none of it.
class DenseShard {
 public:
  // Creates the shard and fills its values from the variable's initializer: element e of the
  // shard is element (row_begin * row_elements + e) of the whole variable, so the values do not
  // depend on the partitioning. INVALID_ARGUMENT for a bad spec (shape, rows, optimizer,
  // initializer), naming the variable.
  static absl::StatusOr<std::unique_ptr<DenseShard>> Create(const v1::DenseShardSpec& spec);
  // The bytes (values and optimizer slots) Create(spec) would allocate, or Create's error for
  // a bad spec; allocates nothing. INVALID_ARGUMENT also for a size that overflows.
  static absl::StatusOr<int64_t> BytesFor(const v1::DenseShardSpec& spec);

  const v1::DenseShardSpec& spec() const { return spec_; }
  const std::string& name() const { return spec_.variable().name(); }
  int32_t partition() const { return spec_.partition().partition(); }
  // The shard's own shape: [row_end - row_begin, dims[1:]...].
  const v1::TensorShape& shape() const { return shape_; }
  int64_t num_elements() const { return num_elements_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  ShardCounters& counters() const { return counters_; }

  // Values plus slots, in bytes.
  int64_t bytes() const;

  // Copies the current values into out[0..num_elements()).
  void ReadValues(float* out) const;

  // Applies one optimizer step with gradient grad[0..num_elements()). With a pool, a large
  // shard is updated in parallel blocks; the optimizers are element-wise, so the result is the
  // same bits either way.
  // REQUIRES: the caller has validated the gradient (size; finiteness where required).
  void Apply(const float* grad, ThreadPool* pool = nullptr);

  // Apply(grads[i]) for every shards[i], in one parallel loop over all their elements, so that
  // a push of several variables costs one hand-off to the pool, not one per variable. Every
  // shard's lock is taken (in address order, so concurrent calls cannot deadlock) before any
  // is updated and released after all are: a reader sees the whole push or none of it. Same
  // bits as calling Apply one shard at a time.
  // REQUIRES: shards are distinct and non-null; grads[i] is validated for shards[i] (as Apply).
  //
  // With `delta`, grads[i] is a change to add to the values (a worker's local steps): value +=
  // delta, the slots are left as they are (the update count counts it, as any push).
  //
  // `updates_after` (optional) receives each shard's update count right after this update:
  // the update's place in the shard's order (a backup applies it at the same place).
  // `backups` (optional) receives each shard's backup as the update saw it, under its lock:
  // the task it goes to (backup_ps_task) and the generation of that backup (CopyAndSetBackup).
  //
  // `ordered` (optional; needs both outputs) is called with them under the shards' locks, once
  // the update has its place and before any value changes: a primary commits the update's
  // forwards there, so that its backups apply it while it does (ParameterStore::FinishPushDense).
  using OrderedFn = std::function<void(const std::vector<int64_t>& updates_after,
                                       const std::vector<std::pair<int, int64_t>>& backups)>;
  static void ApplyAll(const std::vector<DenseShard*>& shards,
                       const std::vector<const float*>& grads, ThreadPool* pool = nullptr,
                       bool delta = false, std::vector<int64_t>* updates_after = nullptr,
                       std::vector<std::pair<int, int64_t>>* backups = nullptr,
                       const OrderedFn& ordered = nullptr);

  // Calls fn(values, num_elements()) with the current values, under the shard's reader lock:
  // a consistent snapshot without a copy. fn must not keep the pointer or call into the shard.
  template <typename Fn>
  auto WithValues(Fn fn) const {
    absl::ReaderMutexLock lock(&mu_);
    return fn(static_cast<const float*>(data_.data()), num_elements_);
  }

  int64_t updates() const;

  // Replication (issue 37): the ps task that holds this shard's backup, where the store
  // forwards its updates; -1: none (CreateShardsRequest.replication below 2).
  int backup_ps_task() const { return backup_ps_task_.load(std::memory_order_relaxed); }
  // Under the shard's lock, as an update reads the pair (ApplyAll).
  void set_backup_ps_task(int task, int64_t generation = 0);
  // Which backup of that task it is: 0 as created, then CopyAndSetBackup's generation.
  int64_t backup_generation() const { return backup_generation_.load(std::memory_order_relaxed); }

  // Statistics of the values (not the slots).
  void ComputeValueStats(v1::ValueStats* stats) const;

  // For checkpoints: values then each slot (num_elements() floats each), and the update count.
  void Snapshot(std::vector<float>* values_and_slots, int64_t* updates) const;
  // Replaces values and slots; INVALID_ARGUMENT if the size does not match.
  absl::Status Restore(const std::vector<float>& values_and_slots, int64_t updates);

  // Rebuild (issue 37): Snapshot into `bytes` (values then slots, float32 little-endian), and
  // the backup set to `backup` (of `generation`), both under one hold of the lock (as a
  // writer: two copies for two tasks cannot both pass the check): every update after the copy
  // sees the backup (and is forwarded), none before it does. FAILED_PRECONDITION, copying
  // nothing, when the shard's backup is another task. `at_copy` (optional) runs under the same
  // hold, after the copy: what it reads is ordered with the shard's updates.
  absl::Status CopyAndSetBackup(int backup, int64_t generation, std::string* bytes,
                                int64_t* updates, const std::function<void()>& at_copy = nullptr);
  // Sets the backup to none if it is `backup` of `generation` (a task lost: DropBackup, or
  // lost again while a copy was made for it); whether it did.
  bool ClearBackupIf(int backup, int64_t generation);
  // A new backup's side: Restore from such bytes, if the shard has had fewer than `updates`
  // updates (else it has the copy's state already, or more: *installed false, nothing changes).
  // INVALID_ARGUMENT, naming both sizes, if the bytes do not fit values and slots.
  absl::Status InstallCopy(absl::string_view bytes, int64_t updates, bool* installed);
  // The bytes of values and slots (what CopyAndSetBackup writes).
  int64_t state_bytes() const;

 private:
  DenseShard(v1::DenseShardSpec spec, v1::TensorShape shape, int64_t num_elements,
             std::unique_ptr<Optimizer> optimizer);

  // Elements [begin, end) of one optimizer step t with gradient grad (indexed from the shard's
  // element 0).
  void ApplyRangeLocked(const float* grad, int64_t t, int64_t begin, int64_t end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Elements [begin, end) of a delta: values += delta.
  void AddRangeLocked(const float* delta, int64_t begin, int64_t end)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const v1::DenseShardSpec spec_;
  const v1::TensorShape shape_;
  const int64_t num_elements_;
  const std::unique_ptr<Optimizer> optimizer_;
  mutable ShardCounters counters_;
  std::atomic<int> backup_ps_task_{-1};
  std::atomic<int64_t> backup_generation_{0};

  mutable absl::Mutex mu_;
  // Values at [0, n), slot s at [(1 + s) * n, (2 + s) * n).
  std::vector<float> data_ ABSL_GUARDED_BY(mu_);
  int64_t updates_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_DENSE_SHARD_H_
