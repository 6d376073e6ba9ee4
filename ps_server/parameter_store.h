#ifndef PSCLUSTER_PS_SERVER_PARAMETER_STORE_H_
#define PSCLUSTER_PS_SERVER_PARAMETER_STORE_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "proto/ps_service.pb.h"
#include "ps_server/dense_push.h"
#include "ps_server/dense_shard.h"
#include "ps_server/embedding_table.h"
#include "ps_server/push_forwarder.h"
#include "ps_server/push_ledger.h"
#include "ps_server/shard_checkpointer.h"
#include "ps_server/sync_accumulator.h"
#include "storage/crash_points.h"

namespace pscluster {

class ParameterStore;

// A store of another task's shards that this task serves as their primary since that task
// failed over (replication 2): what its saves cover beside its own.
struct AdoptedStore {
  int primary = -1;  // the failed-over task
  ParameterStore* store = nullptr;
};

// A push's pipelined forwards, one stream per backup task (ParameterStore::OpenForwardStreams).
class PushStreams {
 public:
  // Elements [.., + n) of shard `index` of the push arrived (as float32 at `values`): sent on
  // to the shard's backup. A failure marks every stream failed (the forwards go after the apply).
  void Piece(int index, const float* values, int64_t n);
  bool failed() const { return failed_; }
  // Whether every stream's Commit() only queues (ForwardStream::CommitQueues).
  bool commits_queue() const;

 private:
  friend class ParameterStore;
  std::vector<int> stream_of_;  // per shard of the push: its stream, or -1
  std::vector<std::unique_ptr<ForwardStream>> streams_;
  std::vector<v1::ReplicateHeader> headers_;      // as opened
  std::vector<std::vector<int>> shards_;          // per stream: the push's shards it carries
  std::vector<std::pair<int, int64_t>> backups_;  // per stream: its backup (task, generation)
  bool failed_ = false;
};

struct ParameterStoreOptions {
  // Accept gradients that contain NaN or Inf (--nan_policy=allow). By default they are refused.
  bool allow_non_finite = false;
  // Fault injection for tests (ps_server --crash_at). Not owned; null in real use.
  CrashPoints* crash_points = nullptr;
  // Where checkpoints live (--checkpoint_dir, the same shared directory as the chief's): Save
  // and Restore resolve the request's checkpoint name under it (storage/checkpoint_path.h).
  // Empty: the request's checkpoint_path is used as given, unless require_checkpoint_dir.
  std::string checkpoint_dir;
  // Refuse Save and Restore without a checkpoint_dir (set when serving TLS: a peer's path is
  // never trusted there).
  bool require_checkpoint_dir = false;
  // Bytes of values and optimizer slots this ps task may hold in dense shards and tables; a
  // CreateShards that would pass it is refused (RESOURCE_EXHAUSTED), and so is a pull or push
  // whose new table rows would (tables that evict are bounded by their own capacity). 0: no
  // limit (ps_server sets it from --memory_budget_mb, by default 90% of the machine's memory).
  int64_t memory_budget_bytes = 0;
  // Threads that apply large dense updates in parallel blocks, beside the calling thread
  // (0: the calling thread does all), and large sparse requests while few run at once.
  int apply_threads = 0;
  // The cores the store may keep busy (0: std::thread::hardware_concurrency()): sparse
  // requests use the apply threads only while those and the requests under way fit in them.
  int cores = 0;
  // Largest sparse request: keys per pull or push, and bytes of rows pulled or gradients pushed.
  // Larger requests are refused before anything changes; clients split theirs.
  int64_t max_sparse_keys = 8 << 20;
  // Most rows one table may hold on this ps task (--max_table_rows), a backstop for tables
  // without a capacity of their own (EvictionSpec.max_rows / max_bytes, which evict instead):
  // a pull or push that could create rows beyond it is refused (RESOURCE_EXHAUSTED) before
  // anything is created. Pulls of tables with admission or eviction create no rows and are
  // not checked. Checked per request, so concurrent requests may pass it by their own size.
  // 0: no limit.
  int64_t max_table_rows = 0;
  int64_t max_sparse_bytes = 256 << 20;
  // Push ids remembered per client, and clients remembered (see PushLedger).
  int push_ids_per_client = 4096;
  int max_push_clients = 4096;
  // Replication (issue 37): where the dense updates applied to shards with a backup
  // (DenseShard::backup_ps_task) are forwarded before the push is answered. Not owned; null:
  // none are (a store that serves no primary with backups, or one holding backups itself).
  PushForwarder* forwarder = nullptr;
  // How long a backup waits for the updates a forward comes after (ApplyReplicatedDense).
  absl::Duration replica_wait = absl::Seconds(30);
};

// A ps task's shards of every dense variable and sparse table, and every operation on them:
// the transport-free core of ps_server. The gRPC service, the tensor data plane and the
// in-process transport only marshal; validation, settling of sync steps, wire decoding,
// idempotency and the statistics all happen here, once. Every request is validated whole
// before any of it is applied, so a refused request changes nothing.
//
// Thread-safe. The shard maps have their own lock, held only to look shards up; each shard and
// table then has its own lock(s), so pushes to different shards run in parallel.
class ParameterStore {
 public:
  explicit ParameterStore(const ParameterStoreOptions& options);
  // Waits for a save being written in the background.
  ~ParameterStore();

  // Creates the listed shards. A shard that already exists with the same spec is counted in
  // already_present; with a different spec the whole request is refused (ALREADY_EXISTS,
  // naming the variable and both shapes). INVALID_ARGUMENT for a bad spec or a size that
  // overflows; RESOURCE_EXHAUSTED when the new shards do not fit the memory budget.
  absl::Status CreateShards(const v1::CreateShardsRequest& request,
                            v1::CreateShardsResponse* response);

  // Streams the values of the requested shards into `sink` (see DensePullSink). SYNC: the
  // complete steps before request.step() (every one when unset) are applied first.
  // NOT_FOUND naming the first unknown shard; UNAVAILABLE while shards created with
  // hold_until_restored wait for their restore; INVALID_ARGUMENT for a bad wire dtype.
  absl::Status PullDense(const v1::PullDenseRequest& request, DensePullSink* sink);
  // INVALID_ARGUMENT unless the request's element ranges (a striped pull) are none or one of
  // each per shard; whether each lies inside its shard PullDense checks.
  static absl::Status CheckRangeCounts(const v1::PullDenseRequest& request);

  // A dense push in three parts: StartPushDense validates the header (shards exist, counts
  // match, no shard twice, wire dtype) and prepares `push`; the transport feeds the chunks
  // into it; FinishPushDense checks that every element arrived and applies the gradients:
  // at once (ASYNC, SSP), or through the shard's accumulator for header.step (SYNC: the mean
  // of replicas_to_aggregate workers' gradients is applied once, when the next step needs it;
  // gradients of other steps are dropped and counted per worker). A request id seen before is
  // answered with the first outcome (`duplicate`), applying nothing. `forwarded`: a primary's
  // forward to this backup store (ApplyReplicatedDense), whose gradients are taken as they
  // are: the primary checked them against its own --nan_policy, and a backup that refused what
  // its primary applied would leave the two copies apart (so its NaN and Inf scan is skipped).
  absl::Status StartPushDense(const v1::PushDenseHeader& header, DensePush* push,
                              bool forwarded = false);
  absl::Status FinishPushDense(DensePush* push, v1::PushDenseResponse* response,
                               PushStreams* streams = nullptr);

  // Pipelined forwards (replication 2, docs/replication.md): after StartPushDense, a stream to
  // each backup task of the push's shards (null when none, or when a backup cannot take one:
  // then FinishPushDense forwards after the apply). The transport hands it each piece of a
  // gradient as it arrives (PushStreams::Piece); FinishPushDense commits the versions once
  // the push is applied, and forwards after the apply instead when a stream failed.
  std::unique_ptr<PushStreams> OpenForwardStreams(const DensePush& push) const;

  // A backup's side of replication (issue 37): `push` was started (StartPushDense with
  // header.push()) and filled as a worker's push is; its updates are applied to this store's
  // shards at the places header.versions() give, each after the updates before it (waiting up
  // to options.replica_wait for them: DEADLINE_EXCEEDED), never twice. Async shards are
  // applied all at once, as on the primary; shards that accumulate sync steps take the
  // gradient each at its place in its accumulator's order, one by one (the primary took them
  // one by one too), so that each sums its gradients as the primary did. INVALID_ARGUMENT for
  // a header whose versions do not match its shards, or a push already applied to some of its
  // async shards and not to the others (the copies have diverged). The request id is
  // remembered with the primary's outcome, as for a push applied here.
  absl::Status ApplyReplicatedDense(const v1::ReplicateHeader& header, DensePush* push,
                                    v1::ReplicateResponse* response);

  // The same for a table's async push (ReplicateSparse): each stripe group applied once the
  // group before it in that stripe was (waiting up to options.replica_wait: DEADLINE_EXCEEDED),
  // never twice; the keys checked as a push's are (this task must back them up).
  // INVALID_ARGUMENT for groups that do not add up to the keys, or gradients that do not fit.
  absl::Status ApplyReplicatedSparse(const v1::ReplicateSparseRequest& request,
                                     v1::ReplicateSparseResponse* response);

  // The dim of a table's rows. NOT_FOUND / UNAVAILABLE as PullDense.
  absl::StatusOr<int64_t> TableDim(const std::string& table) const;

  // Rows of `keys` (created on first touch) into *rows (resized to n * dim), for
  // request.step() as PullDense. The request's own keys are ignored: `keys` is what the
  // transport decoded. INVALID_ARGUMENT for more keys or bytes than the limits, before any row
  // is created; FAILED_PRECONDITION for a key this task does not own.
  absl::Status PullSparse(const v1::PullSparseRequest& request, const int64_t* keys, int64_t n,
                          std::vector<float>* rows);
  // Gradients for the rows of `keys`: n * dim elements of request.wire_dtype() in
  // `gradient_bytes`. Duplicate keys are summed. Applied at once (ASYNC, SSP) or accumulated
  // for request.step() (SYNC: the per-key mean). Idempotent by request id, as dense pushes.
  absl::Status PushSparse(const v1::PushSparseRequest& request, const int64_t* keys, int64_t n,
                          absl::string_view gradient_bytes, v1::PushSparseResponse* response);

  // Writes every shard and table part into <checkpoint>/ps-<ps_index>, where <checkpoint> is
  // the request's name under options.checkpoint_dir (or its checkpoint_path without one); a
  // committed checkpoint is refused (FAILED_PRECONDITION). Pushes are held while the values
  // are copied, so every shard reflects the same moment; the copy is then written without
  // holding anything: before answering (SAVE_WHOLE), or in the background after answering
  // (SAVE_CUT), its result answered by SAVE_AWAIT (see SaveShardsRequest.phase). One save is
  // written at a time. SAVE_PREPARE makes the memory the next cut copies the tables into.
  // `adopted`: other stores whose shards this task serves as their primary since a failover
  // (replication 2, BackupStores::Promoted). Their dense shards join the cut and the part,
  // their pushes held with this store's; their table parts are cut each on its own (before
  // this store's) and written as parts of their own (SaveShardsRequest.num_ps).
  absl::Status Save(const v1::SaveShardsRequest& request, v1::SaveShardsResponse* response,
                    const std::vector<AdoptedStore>& adopted = {});

  // Replaces the values of the shards this task holds with a checkpoint's (see
  // RestoreShardsRequest): dense rows from the overlapping saved partitions, table rows whose
  // keys this task owns. Nothing is changed unless everything needed reads and verifies.
  absl::Status Restore(const v1::RestoreShardsRequest& request,
                       v1::RestoreShardsResponse* response);

  // Every shard and table with its counters.
  v1::ListShardsResponse ListShards() const;
  // Whether this store holds dense shard `ref` (held for a restore or not).
  bool HoldsDense(const v1::ShardRef& ref) const;
  // Whether this store's part of `table` owns `key` (EmbeddingTable::OwnsKey); false for a
  // table it does not hold.
  bool HoldsTableKey(const std::string& table, int64_t key) const;
  // Rebuild (issue 37, docs/replication.md): a copy of dense shard `ref` as it is now, for a
  // new backup on task `backup`, which from the copy on gets every update forwarded: the copy
  // and the backup are taken under one hold of the shard's lock (DenseShard::CopyAndSetBackup),
  // so the copy and the forwards meet at replica->updates(), and a forward that comes to the
  // backup before the copy waits for it (ApplyReplicatedDense). The copy carries the ledger's
  // done pushes too, and those applied before it whose answers are still on their way, but no
  // dense push applied after it (NoteApplied's numbers). A push it holds that went to `backup`
  // as a forward (applied after the copy of another shard for the same backup, in one
  // rebuild) is carried only once that forward is answered: the copy waits for it (until
  // options.replica_wait), and gives up when it failed (the push would be in this shard's
  // copy and its id done there, without its update of the other shard).
  // Forwards to `backup` go again if DropBackup had stopped them (those it still owed from
  // before are forgotten: the copy holds what they carried). NOT_FOUND for a shard not held
  // here; FAILED_PRECONDITION for a shard whose backup is another live task, for one that
  // accumulates sync steps (its accumulator is not copied yet), and on a store not created
  // with replication 2 (whose pushes are not numbered); UNAVAILABLE when the task was lost
  // again meanwhile, when a push applied before the copy did not finish its apply within
  // options.replica_wait, or when one of its forwards to `backup` failed or was not answered
  // within it (no backup set).
  absl::Status CopyForNewBackup(const v1::ShardRef& ref, int backup, v1::DenseReplica* replica);
  // The new backup's side, on the backup store (its shard created as for any backup): takes
  // the copy's values, slots and update count unless the shard has had that many updates
  // already (*installed false), records the copy's done pushes in the ledger, and wakes the
  // forwards waiting for it. NOT_FOUND for a shard not held; INVALID_ARGUMENT, changing
  // nothing, for a copy whose size does not fit the shard's values and slots.
  absl::Status InstallReplica(const v1::DenseReplica& replica, bool* installed);
  // Both halves for the chief's RebuildBackup: each of request.shards() copied for task
  // request.backup_ps_task() (CopyForNewBackup) and sent there (PushForwarder::SendReplica),
  // one after the other. On the first failure every shard of this rebuild is given up
  // (DropBackup: the task is counted lost again, its next rebuild a new generation) and the
  // error names the shard. INVALID_ARGUMENT, changing nothing, for no shard, a shard named
  // twice or a backup that is this task (`self`). One rebuild at a time (a caller's retry
  // waits for the attempt it gave up on, whose failure would otherwise drop what the retry
  // copied); `cancelled`, checked between shards, gives the rest up as a failure does
  // (CANCELLED).
  absl::Status RebuildBackup(const v1::RebuildBackupRequest& request, int self,
                             v1::RebuildBackupResponse* response,
                             const std::function<bool()>& cancelled = nullptr);
  // The bytes of a dense shard's values and slots (a DenseReplica's values_and_slots), or
  // NOT_FOUND.
  absl::StatusOr<int64_t> ReplicaBytes(const v1::ShardRef& ref) const;
  // The new backup's side of a table stripe's copy (RebuildBackup's tables), on the backup
  // store: under the stripe's order lock, unless it applied replica.sequence() groups already,
  // takes the rows (keys[i], update count counts[i], values and slots at rows + i * stride)
  // over its own and counts the stripe's groups applied up to that number (the copy's own:
  // CopyTablesForNewBackup), so that the stripe's later groups, which wait for it, go on from
  // there. A replica of
  // stripe -1 carries only the ledger (recorded as InstallReplica's). NOT_FOUND for a table not
  // held; INVALID_ARGUMENT, changing nothing, for a stripe out of range, a negative number or
  // count, or a key of another stripe; FAILED_PRECONDITION for a key not held here.
  absl::Status InstallTableReplica(const v1::TableReplica& replica, const int64_t* keys,
                                   const int64_t* counts, const float* rows, bool* installed);
  // The floats per row of a table's copy ((1 + slots) * dim), or NOT_FOUND.
  absl::StatusOr<int64_t> TableReplicaStride(const std::string& table) const;

  // Failover (issue 37): ps task `backup` died. The dense shards backed up there (of the
  // task's current generation: CopyForNewBackup) are forwarded no more, nor are forwards to it
  // that earlier pushes still owe (their retries are answered without them), nor table
  // forwards. Returns how many shards had their backup there.
  int DropBackup(int backup);
  // OK, and the highest chief epoch seen raised to `epoch`, unless a newer chief has been seen
  // (FAILED_PRECONDITION naming both); epoch 0 (not a chief) always passes. For a chief's
  // request that the store does not take itself (FailOverPs).
  absl::Status CheckChiefEpoch(int64_t epoch, const char* what) { return Fence(epoch, what); }

  // Statistics and a slice of one shard (partition -1, or a table's name, selects a table),
  // with every complete sync step applied first: an operator sees the newest values.
  absl::StatusOr<v1::InspectShardResponse> Inspect(const v1::InspectShardRequest& request);

  // Applies every pending sync update (for evaluation and checkpoints).
  void SettleAll();

  // Sum of updates applied over all shards, and of pulls served (for status).
  int64_t total_pushes() const;
  int64_t total_pulls() const;

  // Optimizer updates applied (dense: one per shard, sparse: one per push or sync step) and
  // the time spent in them, since the task started (for metrics).
  struct ApplyTotals {
    int64_t dense_applies = 0;
    int64_t dense_nanos = 0;
    int64_t sparse_applies = 0;
    int64_t sparse_nanos = 0;
  };
  ApplyTotals apply_totals() const;

  // Replication 2's forwards from this store to its shards' backups (docs/replication.md), by
  // what became of them: acknowledged by the backup; failed (the push answered UNAVAILABLE and
  // its forwards owed); sent while the push arrived but sent again after the apply (a stream
  // that failed). `owed`: pushes applied here whose forwards have not gone through yet, the
  // updates the backups lag behind by.
  struct ForwardTotals {
    int64_t acknowledged = 0;
    int64_t failed = 0;
    int64_t streams_fell_back = 0;
    int64_t owed = 0;
    // Of the acknowledged: pushes whose streams were committed before the apply (under the
    // shards' locks), so that the backups applied them while this task did.
    int64_t committed_early = 0;
  };
  ForwardTotals forward_totals() const;
  // Rebuilds (RebuildBackup) on this task as a primary: the bytes of the copies taken, sent so
  // far (a copy on its way counts as its messages go out), and not gone out when their copy
  // failed (a copy refused at its end counts as sent); copied - sent - abandoned is on its way
  // now. And the copies the backup took (also those a later failure of the same rebuild gave
  // up) and those that failed.
  struct RebuildTotals {
    int64_t bytes_copied = 0;
    int64_t bytes_sent = 0;
    int64_t bytes_abandoned = 0;
    int64_t copies_sent = 0;
    int64_t copies_failed = 0;
  };
  RebuildTotals rebuild_totals() const;

  const ParameterStoreOptions& options() const { return options_; }

  // What this store holds against the memory budget: dense shards and vocabulary tables as
  // created, hashed tables' rows as they are.
  int64_t held_bytes() const ABSL_LOCKS_EXCLUDED(mu_);
  // Bytes the task holds in other stores (replication's backups: BackupStores::ShareBudget),
  // counted against options.memory_budget_bytes with this store's own. Call before serving.
  void SetBytesElsewhere(std::function<int64_t()> bytes) { bytes_elsewhere_ = std::move(bytes); }

 private:
  using DenseKey = std::pair<std::string, int32_t>;
  // The order of a table's replicated async pushes (docs/replication.md, "Tables"): on a
  // primary, the task backing up each virtual shard and, per stripe, the number of the last
  // group sent to each backup task; on a backup, per primary stripe, the number of the last
  // group applied. A stripe's lock orders its groups: the primary applies and numbers a stripe's
  // part of a push under it, the backup waits under it for the group before.
  struct TableOrder {
    int32_t num_virtual_shards = 0;
    int64_t vocabulary_size = 0;
    // The backup task of each virtual shard (-1: none); null: no backups. Replaced whole by a
    // CreateShards that adds or moves backups, while pushes read it.
    std::shared_ptr<const std::vector<int32_t>> Backups() const {
      // (One relaxed load on the path of a table without backups.)
      if (!has_backups.load(std::memory_order_acquire)) return nullptr;
      return std::atomic_load(&backup_of_vshard);
    }
    void SetBackups(std::shared_ptr<const std::vector<int32_t>> backups) {
      const bool any = backups != nullptr;
      std::atomic_store(&backup_of_vshard, std::move(backups));
      has_backups.store(any, std::memory_order_release);
    }
    std::atomic<bool> has_backups{false};
    std::shared_ptr<const std::vector<int32_t>> backup_of_vshard;
    struct Stripe {
      absl::Mutex mu;
      std::map<int, int64_t> sent ABSL_GUARDED_BY(mu);
      int64_t applied ABSL_GUARDED_BY(mu) = 0;
      // On a primary: backup tasks this stripe's groups are neither numbered for nor sent to
      // (lost: DropBackup; until a rebuild copies the stripe for the task again).
      std::set<int> off ABSL_GUARDED_BY(mu);
    };
    Stripe stripes[EmbeddingTable::kNumStripes];
  };
  struct Table {
    std::shared_ptr<EmbeddingTable> table;
    std::shared_ptr<ShardCounters> counters;
    std::shared_ptr<SparseAccumulator> accumulator;  // SYNC mode only
    std::shared_ptr<TableOrder> order;
  };
  // Sparse forwards of one push, by backup task.
  using SparseForwards = std::map<int, v1::ReplicateSparseRequest>;
  // An async push to a table with backups: applied stripe by stripe (on `pool`'s threads when
  // given), each stripe's part under its order lock, numbered for each backup task that holds
  // some of its keys; *forwards gets those parts, in increasing stripe order. The keys and
  // gradients are sorted once, straight into the forwards' buffers, and applied from there.
  // Errors as EmbeddingTable::ApplyPush (*forwards is then not to be sent).
  absl::Status ApplyPushInStripeOrder(const Table& t, const std::vector<int32_t>& backups,
                                      const v1::PushSparseRequest& request, const int64_t* keys,
                                      int64_t n, const float* grads, ThreadPool* pool,
                                      SparseForwards* forwards);
  // Sends sparse forwards (the backups lost left out), to every backup task at once; the
  // first error.
  absl::Status SendSparseNow(const SparseForwards& forwards);
  // Whether the store still owes forwards of the push `id` (OweForwards).
  bool Owes(const v1::RequestId& id) const;

  // CreateShards' steps: the request's shards against the memory budget; the shards built
  // (outside the lock); those of them already held (ALREADY_EXISTS when held with another
  // spec); the others inserted, with their sync accumulators and budget (how many).
  struct NewShards {
    std::vector<std::unique_ptr<DenseShard>> dense;
    std::vector<std::unique_ptr<EmbeddingTable>> tables;
    std::vector<std::shared_ptr<TableOrder>> table_orders;
    std::vector<bool> present_dense, present_table;
  };
  absl::Status CheckMemoryBudget(const v1::CreateShardsRequest& request) const
      ABSL_LOCKS_EXCLUDED(mu_);
  static absl::StatusOr<NewShards> BuildShards(const v1::CreateShardsRequest& request);
  absl::Status FindPresentLocked(NewShards& shards) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int InsertLocked(NewShards& shards, int64_t start_step) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The dense shards named by `refs`, in order. NOT_FOUND naming the first unknown one;
  // UNAVAILABLE while shards created with hold_until_restored wait for their restore.
  absl::StatusOr<std::vector<std::shared_ptr<DenseShard>>> FindDense(
      const google::protobuf::RepeatedPtrField<v1::ShardRef>& refs) const;
  absl::StatusOr<Table> FindTable(const std::string& name) const;
  // SYNC: applies the pending updates of `shards` that belong to steps before `before_step`
  // (every one when negative). No-op in ASYNC and SSP.
  void SettleDense(const std::vector<std::shared_ptr<DenseShard>>& shards, int64_t before_step);
  void SettleTable(const Table& t, int64_t before_step);
  // The sync accumulator of each shard (null where there is none: ASYNC and SSP).
  std::vector<std::shared_ptr<DenseAccumulator>> AccumulatorsOf(
      const std::vector<std::shared_ptr<DenseShard>>& shards) const;
  void CountDropped(int32_t worker, ShardCounters& counters);
  // FinishPushDense's steps: a delta push (local steps) allowed here and to no sync shard
  // (FAILED_PRECONDITION); the gradients applied (async: every shard at once over the pool)
  // or accumulated into their sync step, counted into `outcome`.
  absl::Status CheckDeltaPush(const DensePush& push,
                              const std::vector<std::shared_ptr<DenseAccumulator>>& accumulators)
      const ABSL_LOCKS_EXCLUDED(mu_);
  // versions[i]: shard i's update count right after this push's update, or its place in the
  // shard's accumulator's order (a sync step's gradient); 0 where it was dropped.
  // backups[i]: shard i's backup (task, generation) as its update saw it (async: under the
  // shard's lock, DenseShard::ApplyAll), where its forward goes.
  // *applied_as (optional): the number the push's async update took (NoteApplied), -1 where
  // it updated no shard at once; the caller calls NoteAnswered with it once the push is
  // recorded in the ledger or has failed.
  void ApplyDensePush(const DensePush& push,
                      const std::vector<std::shared_ptr<DenseAccumulator>>& accumulators,
                      PushOutcome* outcome, std::vector<int64_t>* versions,
                      std::vector<std::pair<int, int64_t>>* backups,
                      const DenseShard::OrderedFn& ordered = nullptr,
                      int64_t* applied_as = nullptr);
  // Async dense pushes applied but not answered yet (issue 37's rebuild), numbered only on a
  // store with backups (CreateShards with replication 2): each takes the next number under its
  // shards' locks as it updates them (NoteApplied), tells its id and outcome once its apply is
  // over (NoteOutcome, before its forwards), and gives the number back once recorded in the
  // ledger (with the number) or failed (NoteAnswered). A copy for a new backup reads
  // AppliedSoFar() under its shard's lock: every push applied to the shard before the copy has
  // a lower number, every one after it a higher one.
  // `backups`: where the push's forwards go (DenseShard::ApplyAll's, under the same locks), for
  // ForwardsSettled.
  int64_t NoteApplied(const std::vector<std::pair<int, int64_t>>& backups)
      ABSL_LOCKS_EXCLUDED(applied_mu_);
  void NoteOutcome(int64_t number, const v1::RequestId& id, const PushOutcome& outcome,
                   std::vector<int> table_backups = {}) ABSL_LOCKS_EXCLUDED(applied_mu_);
  void NoteAnswered(int64_t number) ABSL_LOCKS_EXCLUDED(applied_mu_);
  int64_t AppliedSoFar() const ABSL_LOCKS_EXCLUDED(applied_mu_);
  // The pushes numbered below `below` not answered yet, as ledger entries, once each has told
  // its outcome (waiting for that, which never waits on a backup, until `deadline`: false).
  bool AppliedUnanswered(int64_t below, absl::Time deadline,
                         google::protobuf::RepeatedPtrField<v1::LedgerEntry>* out)
      ABSL_LOCKS_EXCLUDED(applied_mu_);
  // Whether every push numbered below `below` that forwards to `backup` of `generation` has been
  // answered by `deadline`, and none of those forwards is owed (OwesTo): what a copy for that
  // task carries as done then holds on the task (CopyForNewBackup).
  bool ForwardsSettled(int backup, int64_t generation, int64_t below, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(applied_mu_, owed_mu_);
  // Whether a forward to `backup` of `generation` of a push numbered below `below` (or not
  // numbered) is owed, or being sent again (ResendOwed). Conservative: a forward list owed
  // because another of its backups failed counts too.
  bool OwesTo(int backup, int64_t generation, int64_t below) const ABSL_LOCKS_EXCLUDED(owed_mu_);
  // Tables (RebuildBackup): whether every push numbered below `below` has told its outcome and,
  // where its table forwards go to `backup`, been answered by `deadline`, and no table forward
  // to `backup` of `generation` is owed or being sent again: what the copies' ledger carries as
  // done then holds on the task.
  bool TableForwardsSettled(int backup, int64_t generation, int64_t below, absl::Time deadline)
      ABSL_LOCKS_EXCLUDED(applied_mu_, owed_mu_);
  // RebuildBackup's tables: each stripe of each of `tables` copied for `backup` (the rows of
  // the virtual shards backed up there, under the stripe's order lock, where its forwards to
  // the task are numbered and from where they go again) and sent there, then the ledger.
  // Adds to *response. An error gives nothing up itself (the caller drops the backup).
  // `dense_copied`: the same rebuild copied dense shards first (which took the task's new
  // generation).
  absl::Status CopyTablesForNewBackup(const std::vector<std::string>& tables, int backup,
                                      bool dense_copied, v1::RebuildBackupResponse* response,
                                      const std::function<bool()>& cancelled);
  // The forwards a push applied with `versions` owes its shards' `backups`; null when it owes
  // none (no forwarder, no shard with a backup, nothing taken).
  std::shared_ptr<const ForwardList> ForwardsOf(
      const DensePush& push, const std::vector<int64_t>& versions, const PushOutcome& outcome,
      const std::vector<std::pair<int, int64_t>>& backups) const;
  // Sends `forwards` (options_.forwarder); UNAVAILABLE naming the failure, for the worker to
  // retry (the ledger keeps them for the retry).
  // Owed forwards (OweForwards) go first, in the order they were owed.
  // `applied_as`: the push's number (NoteApplied), or -1; owed forwards of later pushes are
  // not sent first (ResendOwed).
  absl::Status SendForwards(const ForwardList& forwards, int64_t applied_as);
  // SendForwards' send, without the owed ones: to the backups not lost, as they are.
  absl::Status SendForwardsNow(const ForwardList& forwards);
  // A push applied here whose forwards failed owes them (its ledger entry too, for the worker's
  // retry): the next forward of any push sends them first, so that a backup is not left
  // waiting for an update whose pusher never retries (it died, or gave up). Each one that goes
  // through is marked replicated in the ledger.
  void OweForwards(const v1::RequestId& id, std::shared_ptr<const ForwardList> forwards,
                   std::shared_ptr<const SparseForwards> sparse = nullptr, int64_t applied_as = -1);
  // Sends the owed forwards again: the dense ones in their pushes' order (the order each
  // backup applies them in), the table forwards after them, all at once (no order of two table
  // pushes is right for every stripe: each waits at the backup for the other's groups); with
  // `below` >= 0 only those of pushes numbered below it (and the table forwards, which are not
  // numbered). A dense forward that fails again holds back the later ones to the same backup
  // (they stay owed, unsent): sent, each would wait replica_wait there for the one that failed.
  void ResendOwed(int64_t below = -1);
  // Whether a dense forward of a push numbered below `below` to any backup `backups` names
  // (task, generation) is owed or being sent again: a forward of push `below` itself, sent to
  // that backup now, would wait there for it.
  bool OwesAnyBelow(const std::vector<std::pair<int, int64_t>>& backups, int64_t below) const;
  // Complete a push's pipelined forwards with what its apply gave; an error when any did not
  // go through (the caller then forwards after the apply, which a backup that applied one
  // answers as already applied).
  // SendCommits writes the commits (never waiting on a backup: it may run under the shards'
  // locks), AwaitCommits waits for every backup's answer.
  absl::Status SendCommits(PushStreams* streams, const std::vector<int64_t>& versions,
                           const PushOutcome& outcome);
  absl::Status AwaitCommits(PushStreams* streams);
  // Whether a push applied with `versions` and `backups` (ApplyDensePush's) goes entirely where
  // `streams` go: every shard updated with a backup in the stream to that backup (task and
  // generation), and no other in any.
  static bool StreamsFit(const PushStreams& streams, const std::vector<int64_t>& versions,
                         const std::vector<std::pair<int, int64_t>>& backups);
  // UNAVAILABLE while shards created for a restore wait for it.
  absl::Status CheckNotHeldLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The keys and byte limits of a sparse request of n keys of `dim`.
  // RESOURCE_EXHAUSTED when the keys' new rows would pass options_.max_table_rows, or need more
  // memory than the budget has left beside the dense shards and every table's rows.
  absl::Status CheckTableRows(const std::string& table, const EmbeddingTable& t,
                              const int64_t* keys, int64_t n) const;
  absl::Status CheckSparseSize(const std::string& table, const char* what, int64_t n,
                               int64_t dim) const;

  // Counts a sparse pull or push for as long as it lives, and chooses the threads that carry it
  // out: the apply pool beside the calling thread, unless the sparse requests under way and
  // the pool's threads together would outnumber the cores (options_.cores), or did so within
  // the last kCrowdedNanos; then the calling thread alone. Requests that overlap (several
  // clients) keep the cores busy already: splitting each over the pool as well only adds
  // hand-offs between threads and moves its keys, gradients and rows from one core's cache to
  // another's. The window covers the time a request spends arriving, which the count does not
  // see. Either way the result is the same (EmbeddingTable: the pool does not change it).
  class SparseWork {
   public:
    explicit SparseWork(ParameterStore* store);
    ~SparseWork();
    SparseWork(const SparseWork&) = delete;
    SparseWork& operator=(const SparseWork&) = delete;
    ThreadPool* pool() const { return pool_; }

   private:
    ParameterStore* const store_;
    ThreadPool* pool_;
  };

  const ParameterStoreOptions options_;
  // Applies large dense updates in parallel (options_.apply_threads), and large sparse
  // requests that run alone (SparseWork).
  ThreadPool apply_pool_;
  // Sparse pulls and pushes under way, and until when (absl::GetCurrentTimeNanos) they run on
  // the calling thread alone (SparseWork).
  static constexpr int64_t kCrowdedNanos = 100'000'000;
  const int cores_;
  std::atomic<int> sparse_in_flight_{0};
  std::atomic<int64_t> crowded_until_nanos_{0};
  // apply_totals(): dense then sparse, count then nanoseconds.
  mutable std::atomic<int64_t> apply_totals_[4] = {};
  PushLedger ledger_;
  // NoteApplied's numbers: the next one, and the pushes applied but not answered yet, with
  // their ids and outcomes once told (NoteOutcome).
  struct AppliedPush {
    bool told = false;
    v1::RequestId id;
    PushOutcome outcome;
    std::vector<std::pair<int, int64_t>> backups;  // (task, generation) its forwards go to
    std::vector<int> table_backups;  // a table push: the tasks its forwards go to, once told
  };
  std::atomic<bool> replicated_{false};  // a CreateShards asked for replication 2
  mutable absl::Mutex applied_mu_;
  int64_t next_applied_ ABSL_GUARDED_BY(applied_mu_) = 0;
  std::map<int64_t, AppliedPush> applied_ ABSL_GUARDED_BY(applied_mu_);
  // A backup's forwarded updates wait here for those before them (ApplyReplicatedDense).
  absl::Mutex replica_mu_;
  absl::CondVar replica_cv_;
  // Pushes hold it shared; Save holds it exclusively while copying: a consistent cut.
  absl::Mutex apply_barrier_;
  mutable absl::Mutex mu_;
  std::map<DenseKey, std::shared_ptr<DenseShard>> dense_ ABSL_GUARDED_BY(mu_);
  std::map<DenseKey, std::shared_ptr<DenseAccumulator>> accumulators_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Table> tables_ ABSL_GUARDED_BY(mu_);
  // Bytes of values and slots held by dense shards, and reserved by vocabulary tables (the
  // memory budget's measure).
  int64_t budgeted_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  std::function<int64_t()> bytes_elsewhere_;  // null: none
  int64_t BytesElsewhere() const { return bytes_elsewhere_ ? bytes_elsewhere_() : 0; }
  // Set by the first CreateShards; later ones must agree.
  v1::SyncOptions sync_ ABSL_GUARDED_BY(mu_);
  bool sync_set_ ABSL_GUARDED_BY(mu_) = false;
  // The last CreateShards asked for local steps: delta pushes are taken (a worker's key can
  // push them only where the cluster runs local steps).
  bool deltas_allowed_ ABSL_GUARDED_BY(mu_) = false;
  // The highest chief epoch seen in CreateShards, SaveShards or RestoreShards (Fence).
  std::atomic<int64_t> chief_epoch_{0};
  // DropBackup's tasks: dense forwards to them are skipped until CopyForNewBackup takes one
  // back (as a new generation, below); table forwards stay skipped (lost_table_backups_).
  absl::Mutex rebuild_mu_;  // RebuildBackup's, held for the whole call
  // rebuild_totals()'s.
  std::atomic<int64_t> rebuild_bytes_copied_{0};
  std::atomic<int64_t> rebuild_bytes_sent_{0};
  std::atomic<int64_t> rebuild_bytes_abandoned_{0};
  std::atomic<int64_t> rebuild_copies_sent_{0};
  std::atomic<int64_t> rebuild_copies_failed_{0};
  mutable absl::Mutex lost_backups_mu_;
  std::set<int> lost_backups_ ABSL_GUARDED_BY(lost_backups_mu_);
  // Per task, the generation of the backups it holds now (CopyForNewBackup counts one more each
  // time it takes the task back): forwards of an older one are not sent.
  std::map<int, int64_t> backup_generation_ ABSL_GUARDED_BY(lost_backups_mu_);
  // The same for table forwards: a task given dense backups again (CopyForNewBackup) stays
  // here until its table backups are rebuilt too.
  std::set<int> lost_table_backups_ ABSL_GUARDED_BY(lost_backups_mu_);
  struct OwedForwards {
    v1::RequestId id;
    std::shared_ptr<const ForwardList> forwards;  // or
    std::shared_ptr<const SparseForwards> sparse;
    int64_t applied_as = -1;  // the push's number (NoteApplied), -1 if none
  };
  mutable absl::Mutex owed_mu_;
  std::deque<OwedForwards> owed_ ABSL_GUARDED_BY(owed_mu_);
  // The backup tasks of the owed table forwards that ResendOwed is sending (as they were owed:
  // task, generation), for TableForwardsSettled.
  std::multiset<std::pair<int, int64_t>> resending_sparse_to_ ABSL_GUARDED_BY(owed_mu_);
  // The ids of owed forwards that ResendOwed is sending (client, seq).
  std::multiset<std::pair<uint64_t, uint64_t>> resending_ ABSL_GUARDED_BY(owed_mu_);
  // The (task, generation, push number) of the dense forwards ResendOwed is sending, for OwesTo.
  std::multiset<std::tuple<int, int64_t, int64_t>> resending_to_ ABSL_GUARDED_BY(owed_mu_);
  std::atomic<int64_t> owed_count_{0};  // owed_.size(), read without the lock
  // Forwards by what became of them (ForwardTotals).
  std::atomic<int64_t> forwards_acknowledged_{0};
  std::atomic<int64_t> forwards_failed_{0};
  std::atomic<int64_t> streams_fell_back_{0};
  std::atomic<int64_t> committed_early_{0};
  // OK, and the epoch raised to `epoch`, unless a newer chief has been seen (FAILED_PRECONDITION
  // naming both); epoch 0 (not a chief) always passes.
  absl::Status Fence(int64_t epoch, const char* what);
  // The directory of a Save's or Restore's checkpoint (see ParameterStoreOptions).
  // The catalog's shards now, for a save or a restore (ps_server/shard_checkpointer.h).
  ShardSet Shards() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<std::string> CheckpointPathOf(const std::string& name,
                                               const std::string& legacy_path,
                                               absl::string_view method) const;
  // See CreateShardsRequest.hold_until_restored.
  bool holding_for_restore_ ABSL_GUARDED_BY(mu_) = false;
  // The save written in the background (SAVE_CUT), kept once written for SAVE_AWAIT (a retried
  // await answers again) until the next cut. `path` is empty before the first.
  struct BackgroundSave {
    std::string path;
    bool done = false;
    absl::Status status;
    v1::SaveShardsResponse response;
  };
  // Waits for the background save's write to end and joins its thread.
  void JoinBackgroundSaveLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(save_mu_);
  absl::Mutex save_mu_;
  BackgroundSave save_ ABSL_GUARDED_BY(save_mu_);
  // Memory for the next cut (SAVE_PREPARE), until the next save.
  PreparedCut prepared_ ABSL_GUARDED_BY(save_mu_);
  // The name of the checkpoint of this task's last cut, when that cut had the tables record
  // their changes (SaveShardsRequest.track_changes): the one an incremental checkpoint may
  // build on. Empty otherwise, and after a restore.
  std::string last_cut_ ABSL_GUARDED_BY(save_mu_);
  std::thread save_thread_ ABSL_GUARDED_BY(save_mu_);
  mutable absl::Mutex dropped_mu_;
  std::map<int32_t, int64_t> dropped_by_worker_ ABSL_GUARDED_BY(dropped_mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_PARAMETER_STORE_H_
