#ifndef PSCLUSTER_CLIENT_PARAMETER_CLIENT_H_
#define PSCLUSTER_CLIENT_PARAMETER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/ps_transport.h"
#include "common/thread_pool.h"
#include "proto/model.pb.h"
#include "proto/ps_service.pb.h"

namespace pscluster {

struct ParameterClientOptions {
  // Encoding of pushed gradients and pulled values on the wire (--wire_dtype).
  v1::DataType wire_dtype = v1::DT_FLOAT32;
  // Calls that fail with UNAVAILABLE are tried this many times in all, with exponential
  // backoff from initial_backoff up to max_backoff.
  int max_attempts = 5;
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(2);
  // This client's worker index, sent with pushes (-1 for the chief and tools).
  int32_t worker = -1;
  // Sparse requests of more keys than this are sent in parts (each at most this many keys
  // and max_sparse_request_bytes of rows).
  int64_t max_sparse_keys_per_request = 1 << 20;
  int64_t max_sparse_request_bytes = 32 << 20;
  // Threads that send to several ps tasks at once (0: one per ps task beyond the first).
  int fan_out_threads = 0;
  // The chief's epoch, sent with CreateShards, SaveShards and RestoreShards (see
  // CreateShardsRequest.chief_epoch); 0 for other clients.
  int64_t chief_epoch = 0;
  // Called before a call to ps task `ps` is tried again (after the backoff), on the calling
  // thread: for example to look up where the task is now and SetPsAddress there. May be null.
  std::function<void(int ps)> before_retry;
  // Called after before_retry: true when task `ps` is known to be lost (the chief's view: its
  // heartbeats stopped), so that the call is given up (UNAVAILABLE) instead of tried again
  // until max_attempts. Not asked for pulls and pushes, which a failover plans again
  // (ABORTED). May be null.
  std::function<bool(int ps)> lost;
};

// How ParameterClient::CreateAll creates shards, and what it found.
struct CreateShardsOptions {
  // SYNC: the step the accumulators of newly created shards start at.
  int64_t start_step = 0;
  // Newly created shards refuse pulls and pushes until RestoreShards (or CreateAll without
  // this) succeeds; see CreateShardsRequest.hold_until_restored.
  bool hold_until_restored = false;
  // With a placement of replication 2: the ps tasks' addresses, by index, where each primary
  // forwards its updates to its backups (CreateShardsRequest.ps_addresses).
  std::vector<std::string> ps_addresses;
};

// The identity of one push across its attempts: the request ids it carries, per ps task (and
// per part of a split sparse push). Empty at first and filled by the first attempt; a push
// sent again with the same ticket carries the same ids, so the ps tasks apply it at most once.
struct PushTicket {
  std::map<int, std::vector<v1::RequestId>> ids;
  // ps tasks that answered (the push applied or dropped there): not sent again.
  std::set<int> done;
};

// The typed client of the ps tasks, used by workers, the chief and psctl: routes each dense
// partition and each sparse key to the ps task that holds it (per the placement), sends to all
// tasks in parallel, and gathers the answers in the caller's order. Variables are seen whole:
// partitions are split and joined here.
//
// Retries UNAVAILABLE (a task restarting) and, for pushes, DEADLINE_EXCEEDED and CANCELLED, with
// backoff; other errors return at once, naming the ps task. Every push carries a request id
// (a random client id chosen at Create, and a sequence number), and a retry sends the same id:
// the ps applies a push once, and answers a retry of one it applied with `duplicate`.
// Sparse requests larger than the options allow are split into parts.
//
// Thread-safe: concurrent calls are allowed.
class ParameterClient {
 public:
  // INVALID_ARGUMENT if the placement does not fit the model or the transport's task count.
  static absl::StatusOr<std::unique_ptr<ParameterClient>> Create(
      const v1::ModelSpec& model, const v1::Placement& placement,
      std::unique_ptr<PsTransport> transport, const ParameterClientOptions& options);

  const v1::ModelSpec& model() const { return model_; }
  const v1::Placement& placement() const { return placement_; }
  int num_ps() const { return transport_->num_ps(); }
  // Ends the calls under way to task `ps` at once (PsTransport::AbortCalls): it stopped
  // answering (its heartbeats stopped), and is about to be failed over.
  void AbortCalls(int ps) { transport_->AbortCalls(ps); }
  // The id this client's pushes carry (RequestId.client).
  uint64_t client_id() const { return client_id_; }

  // Creates every variable partition and table shard on its ps task. Harmless when repeated.
  // `*created` (optional) receives how many shards were new (0: the ps tasks already held
  // everything, e.g. after a chief restart); `*awaiting_restore` (optional) the ps tasks that
  // still wait for a restore of shards created with hold_until_restored. With a placement of
  // replication 2, each task is also sent the backups it holds (CreateShardsRequest.backups;
  // not counted in `*created`). After SetFailedOver, a failed-over task is sent nothing, and
  // nor are the backups of its partitions: the tasks that took them over hold them, promoted.
  // (The primaries are sent their shards with the placement's backups, a failed-over task
  // included: one told of the failover, FailOverPs, forwards nothing to it whatever the spec
  // says.)
  absl::Status CreateAll(const v1::SyncOptions& sync, int64_t* created = nullptr,
                         const CreateShardsOptions& create = CreateShardsOptions(),
                         std::vector<int>* awaiting_restore = nullptr);

  // Number of elements of a dense variable; NOT_FOUND for an unknown one.
  absl::StatusOr<int64_t> NumElements(const std::string& variable) const;

  // Pulls whole variables: (*out)[i] gets variables[i]'s values, row-major. `step`: the sync
  // step the values are for (see PullDenseRequest.step); -1 for the newest values.
  absl::Status Pull(const std::vector<std::string>& variables, std::vector<std::vector<float>>* out,
                    int64_t step = -1);
  // Pushes gradients of whole variables: grads[i] has NumElements(variables[i]) floats.
  // `ticket` (optional) names the push across attempts (see PushTicket).
  absl::Status Push(const std::vector<std::string>& variables,
                    const std::vector<const float*>& grads, int64_t step,
                    PushTicket* ticket = nullptr) {
    return PushDense(variables, grads, step, /*delta=*/false, ticket);
  }
  // As Push, for changes to add to the values (a worker's local steps; PushDenseHeader.delta).
  absl::Status PushDelta(const std::vector<std::string>& variables,
                         const std::vector<const float*>& deltas, int64_t step,
                         PushTicket* ticket = nullptr) {
    return PushDense(variables, deltas, step, /*delta=*/true, ticket);
  }

  // Rows of `keys` of a table (created on first touch) into out[0..n*dim).
  absl::Status PullRows(const std::string& table, const int64_t* keys, int64_t n, float* out,
                        int64_t step = -1);
  // Every ps task writes its shards under `checkpoint_path` (in parallel); returns what was
  // saved, for the manifest. A failed-over task (SetFailedOver) is not asked: the tasks that
  // took its shards over save them with their own. The caller commits the manifest. `phase` as
  // SaveShardsRequest.phase: SAVE_CUT returns nothing (each task writes in the background),
  // a later SAVE_AWAIT what was written. `delta_base` and `track_changes` as in
  // SaveShardsRequest (an incremental checkpoint, and changes recorded for the next).
  absl::StatusOr<std::vector<v1::SavedShard>> SaveShards(const std::string& checkpoint_path,
                                                         int64_t step, int64_t* bytes,
                                                         v1::SavePhase phase = v1::SAVE_WHOLE,
                                                         const std::string& delta_base = "",
                                                         bool track_changes = false);
  // Every ps task (or those of `tasks`, when given) replaces its shards' values with those of
  // a checkpoint (which may have been written by another number of ps tasks). An incremental
  // checkpoint comes with `chain`, the checkpoints it builds on (RestoreShardsRequest.chain).
  absl::Status RestoreShards(const std::string& checkpoint_path,
                             const std::vector<v1::SavedShard>& saved, int64_t step,
                             const std::vector<int>* tasks = nullptr,
                             const std::vector<v1::CheckpointLink>& chain = {});

  // Makes every retry loop give up at once (CANCELLED), now and for every later call, and ends
  // the attempts under way (PsTransport::AbortCalls): for a daemon that is stopping.
  // Thread-safe.
  void Cancel();

  // Sends later calls for ps task `ps` to `address` (it was restarted elsewhere; see
  // PsTransport::SetAddress). Thread-safe.
  absl::Status SetPsAddress(int ps, const std::string& address) {
    return transport_->SetAddress(ps, address);
  }

  // Failover (issue 37, docs/replication.md). The ps tasks whose dense partitions their
  // backups serve now (Placement.failed_over_ps, as the chief publishes it): later pulls and
  // pushes of those partitions go to each one's backup_ps_task, one request per store (a
  // partition's ps_task), a push with the request id its first attempt had, so that the backup
  // recognises a push its primary forwarded before it died. Calls under way give up waiting on
  // a dead task and are planned again. INVALID_ARGUMENT, changing nothing, for a task index out
  // of range or a placement without backups. Thread-safe.
  absl::Status SetFailedOver(const std::vector<int>& failed_over);
  std::vector<int> failed_over() const;
  // How many parts of each table a whole checkpoint has (SaveShards): one per ps task, but a
  // failed-over task's is written by the tasks that took its virtual shards over, one each.
  int64_t TablePartsPerTable() const;
  // Tells task `ps` that task `failed` died (the chief's part of a failover: see
  // ParameterServer.FailOverPs), with the same retries.
  // `min_dense_shards`: FailOverPsRequest.min_dense_shards. `once`: one attempt, no retries.
  absl::Status FailOverPs(int ps, int failed, v1::FailOverPsResponse* response,
                          int min_dense_shards = 0, bool once = false);
  // Rebuild (issue 37, docs/replication.md), the chief's part for the dense partitions and
  // table virtual shards of task `primary` whose placement backup is task `backup`: creates
  // their backups on `backup` (as CreateAll does with replication 2, the table parts waiting
  // for their copies; nothing of the task's own), then asks the primary to copy them there
  // (ParameterServer.RebuildBackup), with the same retries. `*shards_copied`, `*bytes_copied`,
  // `*rows_copied` (optional): what the primary sent. The first error, naming the task.
  absl::Status RebuildBackupOnto(int backup, int primary, const v1::SyncOptions& sync,
                                 const CreateShardsOptions& create, int64_t* shards_copied,
                                 int64_t* bytes_copied, int64_t* rows_copied = nullptr);

  // Gradients grads[0..n*dim) for rows of `keys`; duplicates are summed by the ps.
  absl::Status PushRows(const std::string& table, const int64_t* keys, int64_t n,
                        const float* grads, int64_t step, PushTicket* ticket = nullptr);

  // One ps task's shard list, a shard's statistics, and task status (for the chief and
  // psctl), with the same retries. With include_backups, the task's backup shards too
  // (ShardStats.backup).
  absl::StatusOr<v1::ListShardsResponse> ListShards(int ps, bool include_backups = false);
  absl::StatusOr<v1::InspectShardResponse> InspectShard(int ps,
                                                        const v1::InspectShardRequest& request);
  absl::StatusOr<v1::TaskStatus> GetStatus(int ps);

  // Pushes answered as duplicates of a push the ps had applied (retries that found their
  // first attempt applied), for tests and statistics.
  int64_t duplicate_pushes() const { return duplicate_pushes_.load(); }

 private:
  // Adds to requests[t] the backups task t holds (placement_.options().replication() >= 2):
  // one CreateShardsRequest.backups entry per primary task, with its dense partitions and the
  // virtual shards of each table that t backs up.
  // Not the backups of the primaries `failed` marks (empty: none).
  void AddBackups(const std::vector<char>& failed,
                  std::vector<v1::CreateShardsRequest>* requests) const;
  struct Part {
    v1::ShardRef ref;
    int ps = 0;          // its primary: the task whose store (and push ledger) holds it
    int backup = -1;     // the task holding its backup (replication 2), which serves it once
                         // `ps` failed over
    int64_t offset = 0;  // first element of the partition in the whole variable
    int64_t num_elements = 0;
  };
  struct DenseVar {
    int64_t num_elements = 0;
    std::vector<Part> parts;
  };

  ParameterClient(v1::ModelSpec model, v1::Placement placement,
                  std::unique_ptr<PsTransport> transport, const ParameterClientOptions& options);

  absl::StatusOr<const DenseVar*> FindVar(const std::string& name) const;
  absl::Status PushDense(const std::vector<std::string>& variables,
                         const std::vector<const float*>& values, int64_t step, bool delta,
                         PushTicket* ticket);
  absl::StatusOr<const v1::TableSpec*> FindTable(const std::string& table) const;
  // Runs fn(ps) for each listed task in parallel, each with retries; returns the first error.
  // With `routes`, the listed values are route keys (RouteKey) and their retries give up
  // (ABORTED) once the failed-over tasks change from those of generation `routes`.
  absl::Status ForEachPs(const std::vector<int>& tasks, const std::function<absl::Status(int)>& fn,
                         bool push = false, int64_t routes = -1);
  // Where a dense partition's requests go: its own store's task, or its backup's once its
  // primary failed over (`failed`: a snapshot of failed_over_, empty when none).
  int RouteKey(const Part& part, const std::vector<char>& failed) const {
    if (failed.empty() || !failed[part.ps] || part.backup < 0) return part.ps;
    return num_ps() * (1 + part.ps) + part.backup;
  }
  // The task a route key's requests go to.
  int TaskOf(int key) const { return key < num_ps() ? key : key % num_ps(); }
  // The failed-over tasks (empty: none) and their generation, read together.
  int64_t RoutesSnapshot(std::vector<char>* failed) const;
  // Whether the failed-over tasks changed since generation `routes`.
  bool RoutesChanged(int64_t routes) const { return routes_generation_.load() != routes; }
  // Keys of one sparse request of rows of `dim` floats.
  int64_t KeysPerPart(int64_t dim) const;
  // Retries UNAVAILABLE; with `push`, also DEADLINE_EXCEEDED and CANCELLED (the push's id
  // makes a retry safe).
  absl::Status WithRetries(int ps, const std::function<absl::Status()>& fn, bool push = false,
                           int64_t routes = -1);
  v1::RequestId NextRequestId();
  // A request's keys by owning ps task (PsOfKey): task ps has begin[ps + 1] - begin[ps] of
  // them; with GroupPositions, their positions in increasing order are
  // positions[begin[ps], begin[ps + 1]).
  struct KeyRoutes {
    std::unique_ptr<int32_t[]> ps_of;      // each key's task; null with one task
    std::unique_ptr<int64_t[]> positions;  // not zero-filled: every element is written
    std::vector<int64_t> begin;
    const int64_t* of(int ps) const { return positions.get() + begin[ps]; }
    int64_t size(int ps) const { return begin[ps + 1] - begin[ps]; }
  };
  KeyRoutes RouteKeys(const v1::TableSpec& table, const int64_t* keys, int64_t n) const;
  static void GroupPositions(int64_t n, KeyRoutes* routes);
  // The sparse calls while no task is failed over (`routes`: RoutesSnapshot's generation; a
  // call waiting on a task gives up with ABORTED once that changes).
  absl::Status PullRowsOwned(const v1::TableSpec& table, const int64_t* keys, int64_t n, float* out,
                             int64_t step, int64_t routes);
  absl::Status PushRowsOwned(const v1::TableSpec& table, const int64_t* keys, int64_t n,
                             const float* grads, int64_t step, PushTicket* ticket, int64_t routes);
  // A sparse call planned around failed-over tasks: a key of a failed-over primary goes to the
  // task backing up its virtual shard. `parts[route key]`: the requests of that route (a
  // RouteKey as for dense partitions: the primary's index, or the pair primary and backup),
  // each the positions of its keys in the caller's order and the part of the primary's
  // request those keys belong to (the parts as PushRowsOwned cuts them: the primary's keys in
  // order, KeysPerPart at a time), so that each carries its part's request id.
  struct SparsePart {
    int part = 0;
    std::vector<int64_t> positions;
  };
  struct SparsePlan {
    std::map<int, std::vector<SparsePart>> parts;
    std::map<int, int> num_parts;  // by primary
  };
  SparsePlan PlanSparse(const v1::TableSpec& table, const int64_t* keys, int64_t n,
                        const std::vector<char>& failed) const;
  absl::Status PullRowsRouted(const v1::TableSpec& table, const int64_t* keys, int64_t n,
                              float* out, int64_t step, const std::vector<char>& failed,
                              int64_t routes);
  absl::Status PushRowsRouted(const v1::TableSpec& table, const int64_t* keys, int64_t n,
                              const float* grads, int64_t step, PushTicket* ticket,
                              const std::vector<char>& failed, int64_t routes);
  // The primary whose store a route key's requests reach.
  int PrimaryOf(int key) const { return key < num_ps() ? key : key / num_ps() - 1; }

  const v1::ModelSpec model_;
  const v1::Placement placement_;
  const std::unique_ptr<PsTransport> transport_;
  const ParameterClientOptions options_;
  const uint64_t client_id_;
  std::atomic<uint64_t> next_seq_{1};
  // Cancel(): notified once; retry loops check it and wait on it instead of sleeping.
  absl::Notification cancelled_;
  std::once_flag cancel_once_;
  std::atomic<int64_t> duplicate_pushes_{0};
  std::map<std::string, DenseVar> dense_;
  std::unique_ptr<ThreadPool> fan_out_;
  mutable absl::Mutex routes_mu_;
  std::vector<char> failed_over_ ABSL_GUARDED_BY(routes_mu_);  // by task; empty: none
  std::atomic<int64_t> routes_generation_{0};                  // raised by each change
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_PARAMETER_CLIENT_H_
