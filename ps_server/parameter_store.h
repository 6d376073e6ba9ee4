#ifndef PSCLUSTER_PS_SERVER_PARAMETER_STORE_H_
#define PSCLUSTER_PS_SERVER_PARAMETER_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "proto/ps_service.pb.h"
#include "ps_server/dense_shard.h"
#include "ps_server/embedding_table.h"
#include "ps_server/sync_accumulator.h"
#include "storage/crash_points.h"

namespace pscluster {

struct ParameterStoreOptions {
  // Accept gradients that contain NaN or Inf (--nan_policy=allow). By default they are refused.
  bool allow_non_finite = false;
  // Fault injection for tests (ps_server --crash_at). Not owned; null in real use.
  CrashPoints* crash_points = nullptr;
};

// A ps task's shards of every dense variable and sparse table, and the rules for touching
// them: the transport-free core of ps_server. Every request is validated whole before any of
// it is applied, so a refused request changes nothing.
//
// Thread-safe. The shard maps have their own lock, held only to look shards up; each shard and
// table then has its own lock(s), so pushes to different shards run in parallel.
class ParameterStore {
 public:
  explicit ParameterStore(const ParameterStoreOptions& options);

  // Creates the listed shards. A shard that already exists with the same spec is counted in
  // already_present; with a different spec the whole request is refused (ALREADY_EXISTS,
  // naming the variable and both shapes). INVALID_ARGUMENT for a bad spec.
  absl::Status CreateShards(const v1::CreateShardsRequest& request,
                            v1::CreateShardsResponse* response);

  // The dense shards named by `refs`, in order. NOT_FOUND naming the first unknown one;
  // UNAVAILABLE while shards created with hold_until_restored wait for their restore.
  absl::StatusOr<std::vector<std::shared_ptr<DenseShard>>> FindDense(
      const google::protobuf::RepeatedPtrField<v1::ShardRef>& refs) const;

  struct Table {
    std::shared_ptr<EmbeddingTable> table;
    std::shared_ptr<ShardCounters> counters;
    std::shared_ptr<SparseAccumulator> accumulator;  // SYNC mode only
  };
  // NOT_FOUND naming the table; UNAVAILABLE as FindDense.
  absl::StatusOr<Table> FindTable(const std::string& name) const;

  // Checks the gradients of `shards` (grads[i] must have shards[i]'s element count and, unless
  // allowed, only finite values), then applies each: at once (ASYNC, SSP), or through the
  // shard's accumulator for `step` (SYNC: the mean of replicas_to_aggregate workers' gradients
  // is applied once, when the next step needs it; gradients of older steps are dropped and
  // counted per worker).
  // `wire_bytes` is what travelled, for stats.
  absl::Status PushDense(const std::vector<std::shared_ptr<DenseShard>>& shards,
                         const std::vector<std::vector<float>>& grads, int64_t wire_bytes,
                         int64_t step, int32_t worker, v1::PushDenseResponse* response);

  // SYNC: a complete step's update is pending until a later step needs it (see
  // DenseAccumulator). Applies the pending updates of `shards` that belong to steps before
  // `before_step` (every one when negative): a pull for step s calls it with s, anything else
  // (evaluation, inspection) with -1. No-op in ASYNC and SSP.
  void SettleDense(const std::vector<std::shared_ptr<DenseShard>>& shards, int64_t before_step);
  // Every shard and table.
  void SettleAll();

  // Rows of `keys` (created on first touch) into out[0..n*dim), for step `step` (-1: any; see
  // SettleDense).
  absl::Status PullSparse(const std::string& table, const int64_t* keys, int64_t n, float* out,
                          int64_t wire_bytes, int64_t step = -1);
  // Gradients grads[0..n*dim) for `keys`; duplicate keys are summed.
  absl::Status PushSparse(const std::string& table, const int64_t* keys, int64_t n,
                          const float* grads, int64_t wire_bytes, int64_t step, int32_t worker,
                          v1::PushSparseResponse* response);

  // Writes every shard and table part into <checkpoint_path>/ps-<ps_index>. Pushes are held
  // while the values are copied, so every shard reflects the same moment; the copy is then
  // written without holding anything.
  absl::Status Save(const v1::SaveShardsRequest& request, v1::SaveShardsResponse* response);

  // Replaces the values of the shards this task holds with a checkpoint's (see
  // RestoreShardsRequest): dense rows from the overlapping saved partitions, table rows whose
  // keys this task owns. Nothing is changed unless everything needed reads and verifies.
  absl::Status Restore(const v1::RestoreShardsRequest& request,
                       v1::RestoreShardsResponse* response);

  // Every shard and table with its counters.
  v1::ListShardsResponse ListShards() const;

  // Statistics and a slice of one shard (partition -1, or a table's name, selects a table).
  absl::StatusOr<v1::InspectShardResponse> Inspect(const v1::InspectShardRequest& request) const;

  // Sum of updates applied over all shards, and the last step pushed (for status).
  int64_t total_pushes() const;
  int64_t total_pulls() const;

  const ParameterStoreOptions& options() const { return options_; }

 private:
  using DenseKey = std::pair<std::string, int32_t>;
  void CountDropped(int32_t worker, ShardCounters& counters);
  void SettleTable(const Table& t, int64_t before_step);
  // The sync accumulator of each shard (null where there is none: ASYNC and SSP).
  std::vector<std::shared_ptr<DenseAccumulator>> AccumulatorsOf(
      const std::vector<std::shared_ptr<DenseShard>>& shards) const;
  // UNAVAILABLE while shards created for a restore wait for it.
  absl::Status CheckNotHeldLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const ParameterStoreOptions options_;
  // Pushes hold it shared; Save holds it exclusively while copying: a consistent cut.
  absl::Mutex apply_barrier_;
  mutable absl::Mutex mu_;
  std::map<DenseKey, std::shared_ptr<DenseShard>> dense_ ABSL_GUARDED_BY(mu_);
  std::map<DenseKey, std::shared_ptr<DenseAccumulator>> accumulators_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Table> tables_ ABSL_GUARDED_BY(mu_);
  // Set by the first CreateShards; later ones must agree.
  v1::SyncOptions sync_ ABSL_GUARDED_BY(mu_);
  bool sync_set_ ABSL_GUARDED_BY(mu_) = false;
  // See CreateShardsRequest.hold_until_restored.
  bool holding_for_restore_ ABSL_GUARDED_BY(mu_) = false;
  mutable absl::Mutex dropped_mu_;
  std::map<int32_t, int64_t> dropped_by_worker_ ABSL_GUARDED_BY(dropped_mu_);
};

// "[3, 4]".
std::string ShapeString(const v1::TensorShape& shape);

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_PARAMETER_STORE_H_
