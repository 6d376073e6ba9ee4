#ifndef PSCLUSTER_PS_SERVER_BACKUP_STORES_H_
#define PSCLUSTER_PS_SERVER_BACKUP_STORES_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ps_service.pb.h"
#include "ps_server/parameter_store.h"

namespace pscluster {

// The shards a ps task holds as the backup of other tasks' shards (issue 37,
// docs/replication.md): one ParameterStore per primary task, apart from the task's own store.
// Apart, because a table part is more than its rows: its sync accumulator, admission sketch,
// eviction order and push ledger belong to the primary's part as a whole, and a task backs up
// pieces of several primaries' parts (sharding/placement.h's BackupOf spreads them). Saves
// never see them: the task's own store is what SaveShards writes.
//
// Thread-safe. A store, once created, lives as long as this object.
class BackupStores {
 public:
  // Each primary's store is made with `options`, less the crash points (faults are injected
  // into the task's own store).
  explicit BackupStores(const ParameterStoreOptions& options);

  // `self`: this task's index (-1 while unknown: no entry is refused for naming it).
  // INVALID_ARGUMENT, before anything is created, for an entry whose primary_ps_task is
  // negative, is `self`, or appears twice. Then each primary's shards are created in its store
  // as ParameterStore::CreateShards creates a task's own (with the request's sync, start_step
  // and chief_epoch; never held for a restore), counted into backups_created and
  // backups_already_present. A spec that conflicts with a backup already held is refused
  // (ALREADY_EXISTS) as for the task's own shards; the entries before it stay created, as a
  // retry of the same request finds them (already present).
  absl::Status Create(int self, const v1::CreateShardsRequest& request,
                      v1::CreateShardsResponse* response);
  // The same checks alone (nothing created), for callers that create the task's own shards
  // between them and Create.
  static absl::Status Check(int self, const v1::CreateShardsRequest& request);

  // Appends every backup shard's statistics, ShardStats.backup set and primary_ps_task naming
  // its primary, by primary task.
  void AppendShards(v1::ListShardsResponse* response) const;

  // ParameterStore::Inspect on the backup of request.primary_ps_task(); NOT_FOUND when this
  // task backs up nothing of that task.
  absl::StatusOr<v1::InspectShardResponse> Inspect(const v1::InspectShardRequest& request);

  // The store of `primary`'s backups, or null.
  ParameterStore* Find(int primary) const;

  // ParameterStore::Restore on every store, promoted or not: after a restore a backup holds
  // what its primary was restored to, so the forwards that follow land on the same values
  // (and a store promoted since a failover is restored with the task's own shards). The first
  // error, naming the primary.
  absl::Status Restore(const v1::RestoreShardsRequest& request);
  // The stores this task serves as their primary since a failover (Promote): what its saves
  // cover beside its own shards.
  std::vector<AdoptedStore> Promoted() const;

  // One memory budget (ParameterStoreOptions::memory_budget_bytes) for the task: `own` (the
  // task's own store, which must outlive this object) and every backup store count what the
  // others hold against it (ParameterStore::SetBytesElsewhere), so backups cannot take a task
  // past its budget. Call once, before anything is created.
  void ShareBudget(ParameterStore* own);
  // Bytes every store holds (ParameterStore::held_bytes), but `except_primary`'s.
  int64_t HeldBytes(int except_primary = -1) const;

  // Failover (issue 37): from now on this task serves the backups it holds of `primary` as
  // their primary (ServingDense finds them), if any, and refuses that task's forwards
  // (ForForward). `*dense_shards`: how many dense shards that is; `*already`: promoted before
  // (a retry).
  void Promote(int primary, int* dense_shards, bool* already);
  // The dense shards this task backs up of `primary` (promoted or not).
  int DenseShardsOf(int primary) const;
  // The store a forward from `primary` is applied to. FAILED_PRECONDITION when this task backs
  // up nothing of it, or took its shards over (the primary is fenced: it cannot have a push
  // acknowledged any more).
  absl::StatusOr<ParameterStore*> ForForward(int primary) const;
  // The promoted store that holds dense shard `ref`, or null. One atomic load while nothing
  // is promoted.
  ParameterStore* ServingDense(const v1::ShardRef& ref) const;
  // Where a worker's dense pull or push of `shards` goes: the promoted store holding the first
  // of them, else `own` (the task's own store). Clients send one request per store (per
  // DensePartition.ps_task), so the rest are in the same one.
  ParameterStore* DenseStore(ParameterStore* own,
                             const google::protobuf::RepeatedPtrField<v1::ShardRef>& shards) const {
    ParameterStore* promoted = shards.empty() ? nullptr : ServingDense(shards[0]);
    return promoted != nullptr ? promoted : own;
  }

  // The promoted store whose part of `table` owns `key`, or null. One atomic load while nothing
  // is promoted.
  ParameterStore* ServingSparse(const std::string& table, int64_t key) const;
  // Where a worker's sparse pull or push of `keys` goes: the promoted store owning the first
  // key, else `own`. Clients send the keys of a failed-over primary's virtual shards in
  // requests of their own, one per task that took them over.
  ParameterStore* SparseStore(ParameterStore* own, const std::string& table, const int64_t* keys,
                              int64_t n) const {
    ParameterStore* promoted = n == 0 ? nullptr : ServingSparse(table, keys[0]);
    return promoted != nullptr ? promoted : own;
  }

  // Fencing (docs/replication.md). Once a CreateShards asked for replication 2 (SetReplicated),
  // the task serves pulls and pushes (dense and sparse) only while its lease from the chief runs:
  // until three quarters of the chief's heartbeat timeout after the last answered heartbeat was
  // sent (RenewLease), so that it has stopped before the chief can count it lost and fail it over;
  // and its own shards never again once the chief said it was failed over (Fence). CheckLease:
  // OK, or UNAVAILABLE naming why (the caller retries, and looks up where the shards are now).
  // The fence is the task's own shards': a task failed over and back (a new incarnation,
  // which holds none of them) serves as a backup again once the chief rebuilt backups onto it,
  // and serves those as their primary if their primary fails over to it in turn. CheckServes:
  // OK, or UNAVAILABLE for the task's own store (`own`, ShareBudget's) once fenced.
  void SetReplicated() { replicated_.store(true); }
  void RenewLease(absl::Time until);
  void Fence();
  absl::Status CheckLease() const;
  absl::Status CheckServes(const ParameterStore* store) const;
  // What the lease's and the fence's log lines report: the pushes applied to the task's own
  // shards so far (set once, before serving).
  void SetPushCounter(std::function<int64_t()> pushes_applied) {
    pushes_applied_ = std::move(pushes_applied);
  }

 private:
  // Publishes the stores of promoted_ as serving_.
  void PublishServingLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterStoreOptions options_;
  mutable absl::Mutex mu_;
  std::map<int, std::unique_ptr<ParameterStore>> stores_ ABSL_GUARDED_BY(mu_);
  std::set<int> promoted_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> any_promoted_{false};
  // The stores of promoted_ (in its order), replaced whole by Promote (and by Create, for a
  // store made after its primary's promotion) and read without mu_ by every pull and push
  // that looks for them: each list published is kept, unchanged, as long as this object (as
  // the stores are), so a reader never sees one freed; promotions are few.
  std::atomic<const std::vector<ParameterStore*>*> serving_{nullptr};
  std::vector<std::unique_ptr<const std::vector<ParameterStore*>>> published_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> replicated_{false};
  std::atomic<bool> fenced_{false};
  std::atomic<int64_t> lease_until_nanos_{0};      // 0: no answer from the chief yet
  mutable std::atomic<bool> lapse_logged_{false};  // since the lease last ran out
  std::function<int64_t()> pushes_applied_;
  ParameterStore* own_ = nullptr;  // ShareBudget's
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_BACKUP_STORES_H_
