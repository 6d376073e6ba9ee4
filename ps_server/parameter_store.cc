#include "ps_server/parameter_store.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <set>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/chief_epoch.h"
#include "common/log_once.h"
#include "common/status_macros.h"
#include "common/wire_codec.h"
#include "glog/logging.h"
#include "ps_server/float_stats.h"
#include "ps_server/shard_checkpointer.h"
#include "sharding/partitioner.h"
#include "sharding/sparse_hash.h"
#include "storage/checkpoint.h"
#include "storage/checkpoint_path.h"

namespace pscluster {
namespace {

// Whether an async push's forwards are committed under its shards' locks, before its own apply
// (FinishPushDense); PSCLUSTER_FORWARD_EARLY_COMMIT=0 commits after the apply, for A/B.
bool EarlyCommit() {
  static const bool early = [] {
    const char* env = std::getenv("PSCLUSTER_FORWARD_EARLY_COMMIT");
    return env == nullptr || std::string(env) != "0";
  }();
  return early;
}

// How a complete sync step's mean reaches its shard or table.
// Adds an apply's count and duration to `totals` (ParameterStore::apply_totals) when it ends.
class ApplyTimer {
 public:
  ApplyTimer(std::atomic<int64_t>* totals, int64_t applies)
      : totals_(totals), applies_(applies), start_(absl::Now()) {}
  ~ApplyTimer() {
    totals_[0].fetch_add(applies_, std::memory_order_relaxed);
    totals_[1].fetch_add(absl::ToInt64Nanoseconds(absl::Now() - start_), std::memory_order_relaxed);
  }

 private:
  std::atomic<int64_t>* const totals_;
  const int64_t applies_;
  const absl::Time start_;
};

DenseAccumulator::ApplyFn ApplyTo(DenseShard* shard, ThreadPool* pool,
                                  std::atomic<int64_t>* totals) {
  return [shard, pool, totals](const float* mean) {
    ApplyTimer timer(totals, 1);
    shard->Apply(mean, pool);
  };
}

SparseAccumulator::ApplyFn ApplyTo(EmbeddingTable* table, ThreadPool* pool,
                                   std::atomic<int64_t>* totals) {
  return [table, pool, totals](int64_t step, const int64_t* keys, int64_t n, const float* mean) {
    ApplyTimer timer(totals, 1);
    // Keys this task owns and finite means (checked on push): only a stripe past 2^32 rows can
    // fail it, and nobody waits for this apply to answer, so that is logged. The step's mean
    // is applied at the step's tick, whenever it is settled; the clock is the last settled step.
    table->ObserveStep(step);
    if (absl::Status s = table->ApplyPush(keys, n, mean, pool, step); !s.ok()) {
      LOG(ERROR) << "the sync mean of step " << step
                 << " was not applied in full to a table: " << s;
    }
  };
}

// `count`: whether this is a push or pull of its own (false: a stripe of a pull after its first,
// whose bytes count but not as another pull).
void Touch(ShardCounters& c, bool push, int64_t bytes, bool count = true) {
  if (push) {
    c.pushes.fetch_add(1, std::memory_order_relaxed);
    c.bytes_in.fetch_add(bytes, std::memory_order_relaxed);
    c.last_update_unix_micros.store(absl::ToUnixMicros(absl::Now()), std::memory_order_relaxed);
  } else {
    if (count) c.pulls.fetch_add(1, std::memory_order_relaxed);
    c.bytes_out.fetch_add(bytes, std::memory_order_relaxed);
  }
}

void FillDenseStats(const DenseShard& shard, v1::ShardStats* s) {
  s->set_name(shard.name());
  s->set_partition(shard.partition());
  *s->mutable_shape() = shard.shape();
  s->set_bytes(shard.bytes());
  s->set_optimizer(std::string(shard.optimizer().name()));
  s->set_applied_step(shard.updates());
  if (shard.backup_ps_task() >= 0) s->set_backup_ps_task(shard.backup_ps_task());
  shard.counters().FillStats(s);
}

void FillTableStats(const std::string& name, const EmbeddingTable& table,
                    const ShardCounters& counters, v1::ShardStats* s) {
  s->set_name(name);
  s->set_partition(-1);
  s->set_is_table(true);
  s->mutable_shape()->add_dims(table.num_rows());
  s->mutable_shape()->add_dims(table.dim());
  s->set_rows(table.num_rows());
  s->set_bytes(table.bytes());
  s->set_optimizer(std::string(table.optimizer().name()));
  const EmbeddingTable::Counts counts = table.counts();
  s->set_admitted_rows(counts.admitted);
  s->set_evicted_rows(counts.evicted);
  s->set_expired_rows(counts.expired);
  s->set_unadmitted_keys(counts.unadmitted);
  counters.FillStats(s);
  for (v1::HotKey& h : table.HotKeys(10)) *s->add_hot_keys() = std::move(h);
}

absl::Status RequestIdTooOld(const v1::RequestId& id) {
  return absl::AbortedError(absl::StrCat(
      "push ", id.seq(), " of client ", absl::Hex(id.client()),
      " is older than every push this ps task remembers of that client: whether it was applied "
      "cannot be told, so it is not applied again"));
}

}  // namespace

// ---- ParameterStore

ParameterStore::ParameterStore(const ParameterStoreOptions& options)
    : options_(options),
      apply_pool_(options.apply_threads),
      cores_(options.cores > 0
                 ? options.cores
                 : std::max(1, static_cast<int>(std::thread::hardware_concurrency()))),
      ledger_(options.push_ids_per_client, options.max_push_clients) {}

absl::Status ParameterStore::Fence(int64_t epoch, const char* what) {
  if (epoch == 0) return absl::OkStatus();
  int64_t seen = chief_epoch_.load();
  while (epoch > seen && !chief_epoch_.compare_exchange_weak(seen, epoch)) {
  }
  if (epoch < seen) {
    return SupersededChiefError(what, epoch, seen);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::shared_ptr<DenseShard>>> ParameterStore::FindDense(
    const google::protobuf::RepeatedPtrField<v1::ShardRef>& refs) const {
  std::vector<std::shared_ptr<DenseShard>> out;
  out.reserve(refs.size());
  absl::ReaderMutexLock lock(&mu_);
  PS_RETURN_IF_ERROR(CheckNotHeldLocked());
  for (const v1::ShardRef& ref : refs) {
    auto it = dense_.find({ref.variable(), ref.partition()});
    if (it == dense_.end()) {
      return absl::NotFoundError(
          absl::StrCat("unknown variable ", DenseName(ref.variable(), ref.partition()),
                       " on this ps task (", dense_.size(), " dense shards held)"));
    }
    out.push_back(it->second);
  }
  return out;
}

bool ParameterStore::HoldsDense(const v1::ShardRef& ref) const {
  absl::ReaderMutexLock lock(&mu_);
  return dense_.count({ref.variable(), ref.partition()}) > 0;
}

bool ParameterStore::HoldsTableKey(const std::string& table, int64_t key) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = tables_.find(table);
  return it != tables_.end() && it->second.table->OwnsKey(key);
}

absl::StatusOr<ParameterStore::Table> ParameterStore::FindTable(const std::string& name) const {
  absl::ReaderMutexLock lock(&mu_);
  PS_RETURN_IF_ERROR(CheckNotHeldLocked());
  auto it = tables_.find(name);
  if (it == tables_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown table ", name, " on this ps task"));
  }
  return it->second;
}

absl::Status ParameterStore::CheckNotHeldLocked() const {
  if (!holding_for_restore_) return absl::OkStatus();
  return absl::UnavailableError(
      "this ps task restarted and waits for the chief to restore its shards from a checkpoint");
}

void ParameterStore::CountDropped(int32_t worker, ShardCounters& counters) {
  counters.dropped_stale.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&dropped_mu_);
  ++dropped_by_worker_[worker];
}

std::vector<std::shared_ptr<DenseAccumulator>> ParameterStore::AccumulatorsOf(
    const std::vector<std::shared_ptr<DenseShard>>& shards) const {
  std::vector<std::shared_ptr<DenseAccumulator>> out(shards.size());
  absl::ReaderMutexLock lock(&mu_);
  for (size_t i = 0; i < shards.size(); ++i) {
    auto it = accumulators_.find({shards[i]->name(), shards[i]->partition()});
    if (it != accumulators_.end()) out[i] = it->second;
  }
  return out;
}

void ParameterStore::SettleDense(const std::vector<std::shared_ptr<DenseShard>>& shards,
                                 int64_t before_step) {
  const std::vector<std::shared_ptr<DenseAccumulator>> accumulators = AccumulatorsOf(shards);
  absl::ReaderMutexLock barrier(&apply_barrier_);
  for (size_t i = 0; i < shards.size(); ++i) {
    if (accumulators[i] != nullptr) {
      accumulators[i]->Settle(before_step, ApplyTo(shards[i].get(), &apply_pool_, apply_totals_));
    }
  }
}

void ParameterStore::SettleTable(const Table& t, int64_t before_step) {
  if (t.accumulator == nullptr) return;
  absl::ReaderMutexLock barrier(&apply_barrier_);
  t.accumulator->Settle(before_step, ApplyTo(t.table.get(), &apply_pool_, apply_totals_ + 2));
}

void ParameterStore::SettleAll() {
  std::vector<std::shared_ptr<DenseShard>> dense;
  std::vector<Table> tables;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [key, shard] : dense_) dense.push_back(shard);
    for (const auto& [name, t] : tables_) tables.push_back(t);
  }
  SettleDense(dense, -1);
  for (const Table& t : tables) SettleTable(t, -1);
}

absl::Status ParameterStore::CheckSparseSize(const std::string& table, const char* what, int64_t n,
                                             int64_t dim) const {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", table, ": ", what, " of ", n, " keys"));
  }
  // n * dim * 4 without overflow: both limits are far below 2^63 / dim.
  const bool too_many = n > options_.max_sparse_keys;
  const bool too_big = !too_many && n * dim > options_.max_sparse_bytes / int64_t{sizeof(float)};
  if (too_many || too_big) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table, ": a ", what, " of ", n, " keys of dim ", dim,
        " is over this ps task's limit of ", options_.max_sparse_keys, " keys and ",
        options_.max_sparse_bytes, " bytes of rows per request; split it (nothing was done)"));
  }
  return absl::OkStatus();
}

absl::Status ParameterStore::CheckTableRows(const std::string& table, const EmbeddingTable& t,
                                            const int64_t* keys, int64_t n) const {
  const bool by_rows = options_.max_table_rows > 0;
  const bool by_memory = options_.memory_budget_bytes > 0;
  if (!by_rows && !by_memory) return absl::OkStatus();
  const int64_t rows = t.num_rows();
  int64_t limit = by_rows ? options_.max_table_rows : std::numeric_limits<int64_t>::max();
  int64_t free_bytes = 0;
  if (by_memory) {
    // What the budget has left after the dense shards, vocabulary tables and every hashed
    // table's rows, in rows of this table.
    const int64_t held = held_bytes() + BytesElsewhere();
    free_bytes = std::max<int64_t>(0, options_.memory_budget_bytes - held);
    limit = std::min(limit, rows + free_bytes / t.row_bytes());
  }
  if (rows + n <= limit) return absl::OkStatus();
  std::vector<int64_t> found, missing;
  std::vector<float> values;
  t.Lookup(keys, n, &found, &values, &missing);
  const int64_t fresh =
      static_cast<int64_t>(absl::flat_hash_set<int64_t>(missing.begin(), missing.end()).size());
  if (rows + fresh <= limit) return absl::OkStatus();
  if (by_rows && rows + fresh > options_.max_table_rows) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table ", table, ": ", fresh, " new rows would pass this ps task's limit of ",
                     options_.max_table_rows, " rows per table (--max_table_rows; it holds ", rows,
                     "); nothing was done"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "table ", table, ": ", fresh, " new rows of ", t.row_bytes(), " bytes would pass this ps ",
      "task's memory budget of ", options_.memory_budget_bytes, " bytes, of which ", free_bytes,
      " are left (ps_server --memory_budget_mb); nothing was done. Give the table admission or "
      "eviction (docs/embeddings.md), or place it on more ps tasks"));
}

int64_t ParameterStore::held_bytes() const {
  absl::ReaderMutexLock lock(&mu_);
  int64_t held = budgeted_bytes_;
  for (const auto& [name, t] : tables_) {
    if (!t.table->is_vocabulary()) held += t.table->bytes();
  }
  return held;
}

absl::Status ParameterStore::CheckRangeCounts(const v1::PullDenseRequest& request) {
  if ((request.element_begin_size() == 0 && request.element_end_size() == 0) ||
      (request.element_begin_size() == request.shards_size() &&
       request.element_end_size() == request.shards_size())) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the pull names ", request.shards_size(), " shards with ",
                   request.element_begin_size(), " element_begin and ", request.element_end_size(),
                   " element_end; expected none or one of each per shard"));
}

absl::Status ParameterStore::PullDense(const v1::PullDenseRequest& request, DensePullSink* sink) {
  PS_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<DenseShard>> shards, FindDense(request.shards()));
  PS_ASSIGN_OR_RETURN(const int elem_bytes, WireBytesPerElement(WireOrFloat(request.wire_dtype())));
  // Element ranges (a pull in stripes): one per shard, inside it, not empty.
  PS_RETURN_IF_ERROR(CheckRangeCounts(request));
  const bool ranged = request.element_begin_size() > 0;
  std::vector<int64_t> begins(shards.size(), 0);
  std::vector<int64_t> counts(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) {
    const int64_t n = shards[i]->num_elements();
    counts[i] = n;
    if (!ranged) continue;
    const int64_t begin = request.element_begin(static_cast<int>(i));
    const int64_t end = request.element_end(static_cast<int>(i));
    if (begin < 0 || begin >= end || end > n) {
      return absl::InvalidArgumentError(
          absl::StrCat("the pull asks for elements [", begin, ", ", end, ") of variable ",
                       DenseName(shards[i]->name(), shards[i]->partition()), ", which has ", n,
                       "; expected 0 <= begin < end <= ", n));
    }
    begins[i] = begin;
    counts[i] = end - begin;
  }
  SettleDense(shards, request.has_step() ? request.step() : -1);
  PS_RETURN_IF_ERROR(sink->Begin(counts));
  for (size_t i = 0; i < shards.size(); ++i) {
    PS_RETURN_IF_ERROR(shards[i]->WithValues([&](const float* values, int64_t) {
      return sink->Values(static_cast<int>(i), values + begins[i], counts[i]);
    }));
    // A shard pulled in stripes counts one pull: the stripe that starts it.
    Touch(shards[i]->counters(), /*push=*/false, counts[i] * elem_bytes, begins[i] == 0);
  }
  return absl::OkStatus();
}

absl::Status ParameterStore::StartPushDense(const v1::PushDenseHeader& header, DensePush* push,
                                            bool forwarded) {
  push->shards_.clear();
  push->payload_bytes_ = 0;
  push->received_bytes_ = 0;
  PS_ASSIGN_OR_RETURN(push->shards_, FindDense(header.shards()));
  if (header.num_elements_size() != header.shards_size()) {
    push->shards_.clear();
    return absl::InvalidArgumentError(absl::StrCat("the push header names ", header.shards_size(),
                                                   " shards but gives ", header.num_elements_size(),
                                                   " element counts"));
  }
  push->wire_ = WireOrFloat(header.wire_dtype());
  absl::StatusOr<int> elem_bytes = WireBytesPerElement(push->wire_);
  if (!elem_bytes.ok()) {
    push->shards_.clear();
    return elem_bytes.status();
  }
  push->elem_bytes_ = *elem_bytes;
  push->allow_non_finite_ = options_.allow_non_finite || forwarded;
  const int n = static_cast<int>(push->shards_.size());
  if (static_cast<int>(push->grads_.size()) < n) push->grads_.resize(n);
  for (int i = 0; i < n; ++i) {
    const DenseShard& s = *push->shards_[i];
    for (int j = 0; j < i; ++j) {
      if (push->shards_[j] == push->shards_[i]) {
        push->shards_.clear();
        return absl::InvalidArgumentError(absl::StrCat(
            "variable ", DenseName(s.name(), s.partition()),
            " is named twice in one push (positions ", j, " and ", i, "); each shard once"));
      }
    }
    if (header.num_elements(i) != s.num_elements()) {
      const std::string message =
          absl::StrCat("variable ", DenseName(s.name(), s.partition()), ": gradient has ",
                       header.num_elements(i), " elements, expected ", s.num_elements(), " (shape ",
                       ShapeString(s.shape()), ")");
      push->shards_.clear();
      return absl::InvalidArgumentError(message);
    }
  }
  for (int i = 0; i < n; ++i) {
    DensePush::Buffer& b = push->grads_[i];
    b.size = push->shards_[i]->num_elements();
    b.received = 0;
    b.view = nullptr;
    b.scanned = true;
    if (static_cast<int64_t>(b.data.size()) < b.size) b.data.resize(b.size);
    push->payload_bytes_ += b.size * push->elem_bytes_;
  }
  push->header_ = header;
  return absl::OkStatus();
}

void PushStreams::Piece(int index, const float* values, int64_t n) {
  if (failed_ || stream_of_[index] < 0) return;
  absl::Status s = streams_[stream_of_[index]]->Write(values, n);
  if (!s.ok()) {
    failed_ = true;
    LOG_EVERY_N(WARNING, 100) << "a forward sent while the push arrives failed (" << s
                              << "); the push is forwarded after its apply";
  }
}

bool PushStreams::commits_queue() const {
  return std::all_of(streams_.begin(), streams_.end(),
                     [](const std::unique_ptr<ForwardStream>& s) { return s->CommitQueues(); });
}

std::unique_ptr<PushStreams> ParameterStore::OpenForwardStreams(const DensePush& push) const {
  if (options_.forwarder == nullptr) return nullptr;
  std::map<int, std::vector<int>> by_backup;
  std::map<int, std::pair<int, int64_t>> backup_of;  // task -> (task, generation)
  for (int i = 0; i < push.num_shards(); ++i) {
    // (Read without the shard's lock: a pair torn by a backup set meanwhile does not match
    // the one the update reads under it, and the push then goes after its apply.)
    const int backup = push.shards_[i]->backup_ps_task();
    const int64_t generation = push.shards_[i]->backup_generation();
    if (backup < 0) continue;
    by_backup[backup].push_back(i);
    backup_of.emplace(backup, std::make_pair(backup, generation));
  }
  if (by_backup.empty()) return nullptr;
  auto streams = std::make_unique<PushStreams>();
  streams->stream_of_.assign(push.num_shards(), -1);
  for (const auto& [backup, shards] : by_backup) {
    v1::ReplicateHeader header;
    v1::PushDenseHeader* h = header.mutable_push();
    h->set_step(push.header_.step());
    h->set_worker(push.header_.worker());
    *h->mutable_request_id() = push.header_.request_id();
    h->set_delta(push.header_.delta());
    h->set_wire_dtype(v1::DT_FLOAT32);
    int64_t values = 0;
    for (int i : shards) {
      const DenseShard& shard = *push.shards_[i];
      v1::ShardRef* ref = h->add_shards();
      ref->set_variable(shard.name());
      ref->set_partition(shard.partition());
      h->add_num_elements(shard.num_elements());
      values += shard.num_elements();
    }
    std::unique_ptr<ForwardStream> stream = options_.forwarder->OpenStream(backup, header, values);
    if (stream == nullptr) return nullptr;  // that backup takes forwards after the apply only
    for (int i : shards) streams->stream_of_[i] = static_cast<int>(streams->streams_.size());
    streams->streams_.push_back(std::move(stream));
    streams->backups_.push_back(backup_of[backup]);
    streams->headers_.push_back(std::move(header));
    streams->shards_.push_back(shards);
  }
  return streams;
}

bool ParameterStore::StreamsFit(const PushStreams& streams, const std::vector<int64_t>& versions,
                                const std::vector<std::pair<int, int64_t>>& backups) {
  if (streams.failed()) return false;
  for (size_t i = 0; i < versions.size(); ++i) {
    const int k = streams.stream_of_[i];
    if (versions[i] == 0 || backups[i].first < 0) {
      if (k >= 0) return false;
    } else if (k < 0 || backups[i] != streams.backups_[k]) {
      return false;
    }
  }
  return true;
}

absl::Status ParameterStore::SendCommits(PushStreams* streams, const std::vector<int64_t>& versions,
                                         const PushOutcome& outcome) {
  std::vector<v1::ReplicateHeader> commits(streams->streams_.size());
  for (size_t k = 0; k < streams->streams_.size(); ++k) {
    for (int i : streams->shards_[k]) {
      // Dropped (a sync gradient of another step, or a second one of its worker): a stream
      // cannot leave a shard out.
      if (versions[i] == 0) return absl::FailedPreconditionError("a shard was not applied");
      commits[k].add_versions(versions[i]);
    }
    commits[k].set_accepted(outcome.accepted);
    commits[k].set_dropped_stale(outcome.dropped_stale);
  }
  // Every commit goes out before any answer is awaited: the backups apply at once.
  for (size_t k = 0; k < streams->streams_.size(); ++k) {
    PS_RETURN_IF_ERROR(streams->streams_[k]->Commit(commits[k]));
  }
  return absl::OkStatus();
}

absl::Status ParameterStore::AwaitCommits(PushStreams* streams) {
  for (size_t k = 0; k < streams->streams_.size(); ++k) {
    v1::ReplicateResponse answer;
    PS_RETURN_IF_ERROR(streams->streams_[k]->Await(&answer));
  }
  return absl::OkStatus();
}

absl::Status ParameterStore::FinishPushDense(DensePush* push, v1::PushDenseResponse* response,
                                             PushStreams* streams) {
  const v1::PushDenseHeader& header = push->header_;
  const int n = push->num_shards();
  if (n == 0 && header.shards_size() > 0) {
    return absl::FailedPreconditionError("FinishPushDense without a successful StartPushDense");
  }
  for (int i = 0; i < n; ++i) {
    const DensePush::Buffer& b = push->grads_[i];
    if (b.received != b.size) {
      const DenseShard& s = *push->shards_[i];
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", DenseName(s.name(), s.partition()), ": received ", b.received,
                       " of ", b.size, " gradient elements"));
    }
  }
  PS_RETURN_IF_ERROR(push->ScanDeferred(&apply_pool_));
  const std::vector<std::shared_ptr<DenseAccumulator>> accumulators = AccumulatorsOf(push->shards_);
  if (header.delta()) PS_RETURN_IF_ERROR(CheckDeltaPush(*push, accumulators));
  PushOutcome outcome;
  std::shared_ptr<const ForwardList> owed;
  switch (ledger_.Begin(header.request_id(), &outcome, &owed)) {
    case PushLedger::Claim::kDuplicate:
      // A retry of a push whose forwards to its backups failed: the forwards the store owes
      // go again first, this push's among them (unless another push's forward took them
      // meanwhile); answered once none is owed.
      if (owed != nullptr) {
        ResendOwed();
        PushOutcome again;
        (void)ledger_.Begin(header.request_id(), &again, &owed);
        if (owed != nullptr) {
          return absl::UnavailableError(
              "the push was applied on this ps task but its forward to the backup failed again; "
              "send it again with the same request id");
        }
      }
      response->set_accepted(outcome.accepted);
      response->set_dropped_stale(outcome.dropped_stale);
      response->set_duplicate(true);
      return absl::OkStatus();
    case PushLedger::Claim::kTooOld:
      return RequestIdTooOld(header.request_id());
    case PushLedger::Claim::kNew:
      break;
  }
  std::vector<int64_t> versions;
  std::vector<std::pair<int, int64_t>> backups;
  // The streams carry the push only if its update of every shard went where its stream goes: a
  // shard whose backup changed while the push arrived (lost, or a new one: CopyForNewBackup)
  // has the whole push forwarded after the apply instead, in one forward per backup (the
  // streams are abandoned), so that no backup records the push with a part of it missing.
  //
  // An async push (every shard updated at once) commits its streams under the shards' locks,
  // as soon as it has its place in their order and before its own apply: the backups apply it
  // while this task does, and the answer waits for the later of the two, not their sum. Only
  // where the streams queue their commits (a writer thread sends them: the locks are never held
  // waiting on a backup); not while forwards are owed (they go first, outside the locks), nor
  // when PSCLUSTER_FORWARD_EARLY_COMMIT=0 (for A/B): then the commit follows the apply.
  bool committed_early = false;
  absl::Status early;
  DenseShard::OrderedFn ordered;
  if (streams != nullptr && !streams->failed() && EarlyCommit() && streams->commits_queue() &&
      owed_count_.load(std::memory_order_relaxed) == 0 &&
      std::all_of(accumulators.begin(), accumulators.end(),
                  [](const std::shared_ptr<DenseAccumulator>& a) { return a == nullptr; })) {
    PushOutcome whole = outcome;
    whole.accepted += n;  // what ApplyDensePush counts for n async shards
    ordered = [&, whole](const std::vector<int64_t>& at,
                         const std::vector<std::pair<int, int64_t>>& backups_at) {
      // (Owed since the check above: the forward that failed comes first, after the apply.)
      if (owed_count_.load(std::memory_order_relaxed) > 0) return;
      if (!StreamsFit(*streams, at, backups_at)) return;
      committed_early = true;
      early = SendCommits(streams, at, whole);
    };
  }
  // Numbered as applied (on a store with backups), told as soon as the apply is over, and
  // answered (recorded in the ledger with its number, or failed) by the time this returns: a
  // copy for a new backup carries the pushes it holds whose answers are on their way, and
  // leaves out those applied after it (CopyForNewBackup).
  int64_t applied_as = -1;
  const absl::Cleanup answered = [&] {
    if (applied_as >= 0) NoteAnswered(applied_as);
  };
  ApplyDensePush(*push, accumulators, &outcome, &versions, &backups, ordered,
                 replicated_.load(std::memory_order_relaxed) ? &applied_as : nullptr);
  if (applied_as >= 0) NoteOutcome(applied_as, header.request_id(), outcome);
  if (options_.crash_points != nullptr && replicated_.load(std::memory_order_relaxed)) {
    options_.crash_points->Reach(kCrashPushApplied);
  }
  bool streams_fit = false;
  absl::Status committed;
  if (committed_early) {
    streams_fit = true;
    committed = early.ok() ? AwaitCommits(streams) : early;
  } else if (streams != nullptr && StreamsFit(*streams, versions, backups)) {
    streams_fit = true;
    // What the store owes goes first, or the backups would wait for it before applying this.
    if (owed_count_.load(std::memory_order_relaxed) > 0) {
      ResendOwed(applied_as);
      if (OwesAnyBelow(backups, applied_as)) {
        committed = absl::UnavailableError("an earlier push's forward to a backup is owed");
      }
    }
    // The backups have the gradients already: the versions complete the forwards.
    if (committed.ok()) committed = SendCommits(streams, versions, outcome);
    if (committed.ok()) committed = AwaitCommits(streams);
  }
  if (streams_fit) {
    if (committed.ok()) {
      forwards_acknowledged_.fetch_add(1, std::memory_order_relaxed);
      if (committed_early) {
        committed_early_.fetch_add(1, std::memory_order_relaxed);
        PS_LOG_FIRST_N(INFO, 1) << "pushes streamed to the backups are committed before this "
                                   "task applies them (the backups apply them meanwhile)";
      }
      ledger_.Record(header.request_id(), outcome, nullptr, applied_as);
      response->set_accepted(outcome.accepted);
      response->set_dropped_stale(outcome.dropped_stale);
      return absl::OkStatus();
    }
    streams_fell_back_.fetch_add(1, std::memory_order_relaxed);
    LOG_EVERY_N(WARNING, 100) << "a forward sent while the push arrived failed at its commit ("
                              << committed << "); forwarding the push again after its apply";
  } else if (streams != nullptr && !streams->failed()) {
    streams_fell_back_.fetch_add(1, std::memory_order_relaxed);
    PS_LOG_FIRST_N(INFO, 4) << "a push's streams no longer match where its updates go (a "
                               "shard's backup changed while it arrived, or a sync gradient "
                               "was dropped); forwarding it after its apply";
  }
  // The streams are abandoned first, so their backups stop waiting for a commit (and any
  // later Piece is ignored).
  if (streams != nullptr) {
    streams->failed_ = true;
    streams->streams_.clear();
  }
  owed = ForwardsOf(*push, versions, outcome, backups);
  // Answered only once the backups applied it too (chain replication: docs/replication.md).
  const absl::Status forwarded =
      owed == nullptr ? absl::OkStatus() : SendForwards(*owed, applied_as);
  if (!forwarded.ok()) {
    // Kept for the retry and for the next forward: a copy that owns its gradients (the push's
    // buffers are reused).
    auto kept = std::make_shared<const ForwardList>(*owed);
    ledger_.Record(header.request_id(), outcome, kept, applied_as);
    OweForwards(header.request_id(), std::move(kept), nullptr, applied_as);
    return forwarded;
  }
  ledger_.Record(header.request_id(), outcome, nullptr, applied_as);
  response->set_accepted(outcome.accepted);
  response->set_dropped_stale(outcome.dropped_stale);
  return absl::OkStatus();
}

std::shared_ptr<const ForwardList> ParameterStore::ForwardsOf(
    const DensePush& push, const std::vector<int64_t>& versions, const PushOutcome& outcome,
    const std::vector<std::pair<int, int64_t>>& backups) const {
  if (options_.forwarder == nullptr) return nullptr;
  std::map<std::pair<int, int64_t>, DenseForward> by_backup;
  for (int i = 0; i < push.num_shards(); ++i) {
    const DenseShard& shard = *push.shards_[i];
    const int backup = backups[i].first;
    if (backup < 0 || versions[i] == 0) continue;
    DenseForward& f = by_backup[backups[i]];
    if (f.backup < 0) {
      f.backup = backup;
      f.generation = backups[i].second;
      v1::PushDenseHeader* h = f.header.mutable_push();
      h->set_step(push.header_.step());
      h->set_worker(push.header_.worker());
      *h->mutable_request_id() = push.header_.request_id();
      h->set_delta(push.header_.delta());
      h->set_wire_dtype(v1::DT_FLOAT32);
      f.header.set_accepted(outcome.accepted);
      f.header.set_dropped_stale(outcome.dropped_stale);
    }
    v1::ShardRef* ref = f.header.mutable_push()->add_shards();
    ref->set_variable(shard.name());
    ref->set_partition(shard.partition());
    f.header.mutable_push()->add_num_elements(shard.num_elements());
    f.header.add_versions(versions[i]);
    f.grads.emplace_back(push.grads_[i].values(), shard.num_elements());
  }
  if (by_backup.empty()) return nullptr;
  auto list = std::make_shared<ForwardList>();
  for (auto& [backup, f] : by_backup) list->forwards.push_back(std::move(f));
  return list;
}

absl::Status ParameterStore::CopyForNewBackup(const v1::ShardRef& ref, int backup,
                                              v1::DenseReplica* replica) {
  google::protobuf::RepeatedPtrField<v1::ShardRef> refs;
  *refs.Add() = ref;
  PS_ASSIGN_OR_RETURN(const std::vector<std::shared_ptr<DenseShard>> shards, FindDense(refs));
  DenseShard& shard = *shards[0];
  const std::string name = DenseName(shard.name(), shard.partition());
  if (backup < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a new backup of ", name, " on ps:", backup, "; expected a task index >= 0"));
  }
  if (!replicated_.load(std::memory_order_relaxed)) {
    return absl::FailedPreconditionError(
        absl::StrCat(name,
                     ": this ps task's shards were not created with replication 2, so its "
                     "pushes are not numbered and a copy could not tell which it holds"));
  }
  if (AccumulatorsOf(shards)[0] != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(name,
                     " accumulates sync steps; a new backup of it needs its accumulator, "
                     "which is not copied yet"));
  }
  const int current = shard.backup_ps_task();
  if (current >= 0 && current != backup) {  // (checked again with the copy, under its lock)
    return absl::FailedPreconditionError(absl::StrCat(name, " is backed up on ps:", current,
                                                      " already; a new backup on ps:", backup,
                                                      " would leave that one behind"));
  }
  replica->Clear();
  // A task counted lost (DropBackup) is back: its backups from now on are of a new
  // generation, and what was made for the one that died is not sent to this one.
  int64_t generation = 0;
  {
    absl::MutexLock lock(&lost_backups_mu_);
    if (lost_backups_.erase(backup) > 0) ++backup_generation_[backup];
    generation = backup_generation_[backup];
  }
  int64_t updates = 0;
  int64_t applied_before = 0;  // every push applied to the shard before the copy is numbered below
  PS_RETURN_IF_ERROR(shard.CopyAndSetBackup(backup, generation, replica->mutable_values_and_slots(),
                                            &updates, [&] { applied_before = AppliedSoFar(); }));
  bool lost_again = false;
  {
    absl::MutexLock lock(&lost_backups_mu_);
    lost_again = lost_backups_.count(backup) > 0 || backup_generation_[backup] != generation;
  }
  if (lost_again) {
    // Lost again meanwhile (DropBackup may have passed this shard before the copy set it).
    shard.ClearBackupIf(backup, generation);
    replica->Clear();
    return absl::UnavailableError(absl::StrCat("ps:", backup, " was lost while ", name,
                                               " was copied for it; no backup there now"));
  }
  // A push the copy holds that went to this task as a forward too (it was applied after an
  // earlier copy of this rebuild, to a shard of it): its id goes out as done below, so its
  // forward must have been applied there first. Waited for (those forwards find their shards'
  // copies installed there already), and the copy given up when one failed or is owed: the
  // task would hold the push here and count it done, without it in that other shard.
  // (One deadline for both waits: a copy gives up after replica_wait, not twice that.)
  const absl::Time deadline = absl::Now() + options_.replica_wait;
  if (!ForwardsSettled(backup, generation, applied_before, deadline)) {
    shard.ClearBackupIf(backup, generation);
    replica->Clear();
    return absl::UnavailableError(
        absl::StrCat("a push applied to ", name, " before its copy for ps:", backup,
                     " has a forward to ps:", backup, " that failed or was not answered within ",
                     absl::FormatDuration(options_.replica_wait),
                     " (it went there for a shard copied before); no backup there now, try again"));
  }
  // The pushes the copy holds, by their ids, for the new backup's ledger: a worker's retry of
  // one there, once it is promoted, is a duplicate. Those applied before the copy whose answers
  // are still on their way (their forwards to other backups) are not recorded here yet: taken
  // from their numbers, first (one answered meanwhile is in the ledger read after). Those
  // applied after it (numbered from applied_before) are left out even where already recorded:
  // the copy does not hold them, and their forwards bring them to the new backup.
  if (!AppliedUnanswered(applied_before, deadline, replica->mutable_ledger())) {
    shard.ClearBackupIf(backup, generation);
    replica->Clear();
    return absl::UnavailableError(absl::StrCat(
        "a push applied to ", name, " before its copy for ps:", backup,
        " did not finish its apply within ", absl::FormatDuration(options_.replica_wait),
        "; no backup there now, try again"));
  }
  replica->mutable_shard()->set_variable(shard.name());
  replica->mutable_shard()->set_partition(shard.partition());
  replica->set_updates(updates);
  ledger_.ExportDone(replica->mutable_ledger(), replica->mutable_ledger_floors(), applied_before);
  return absl::OkStatus();
}

int64_t ParameterStore::NoteApplied(const std::vector<std::pair<int, int64_t>>& backups) {
  absl::MutexLock lock(&applied_mu_);
  const int64_t number = next_applied_++;
  AppliedPush& p = applied_.emplace_hint(applied_.end(), number, AppliedPush())->second;
  for (const std::pair<int, int64_t>& b : backups) {
    if (b.first >= 0 && std::find(p.backups.begin(), p.backups.end(), b) == p.backups.end()) {
      p.backups.push_back(b);
    }
  }
  return number;
}

void ParameterStore::NoteOutcome(int64_t number, const v1::RequestId& id,
                                 const PushOutcome& outcome, std::vector<int> table_backups) {
  absl::MutexLock lock(&applied_mu_);
  auto it = applied_.find(number);
  if (it == applied_.end()) return;
  it->second.told = true;
  it->second.id = id;
  it->second.outcome = outcome;
  it->second.table_backups = std::move(table_backups);
}

void ParameterStore::NoteAnswered(int64_t number) {
  absl::MutexLock lock(&applied_mu_);
  applied_.erase(number);
}

int64_t ParameterStore::AppliedSoFar() const {
  absl::MutexLock lock(&applied_mu_);
  return next_applied_;
}

bool ParameterStore::AppliedUnanswered(int64_t below, absl::Time deadline,
                                       google::protobuf::RepeatedPtrField<v1::LedgerEntry>* out) {
  absl::MutexLock lock(&applied_mu_);
  const auto told = [this, below]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(applied_mu_) {
    for (auto it = applied_.begin(); it != applied_.end() && it->first < below; ++it) {
      if (!it->second.told) return false;
    }
    return true;
  };
  if (!applied_mu_.AwaitWithDeadline(absl::Condition(&told), deadline)) return false;
  for (auto it = applied_.begin(); it != applied_.end() && it->first < below; ++it) {
    const AppliedPush& p = it->second;
    if (p.id.client() == 0) continue;  // (never remembered: RequestId)
    v1::LedgerEntry* entry = out->Add();
    *entry->mutable_id() = p.id;
    entry->set_accepted(p.outcome.accepted);
    entry->set_dropped_stale(p.outcome.dropped_stale);
  }
  return true;
}

bool ParameterStore::ForwardsSettled(int backup, int64_t generation, int64_t below,
                                     absl::Time deadline) {
  {
    absl::MutexLock lock(&applied_mu_);
    const std::pair<int, int64_t> to(backup, generation);
    const auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(applied_mu_) {
      for (auto it = applied_.begin(); it != applied_.end() && it->first < below; ++it) {
        // (Its backups were noted with its number, under the locks its update took.)
        const std::vector<std::pair<int, int64_t>>& b = it->second.backups;
        if (std::find(b.begin(), b.end(), to) != b.end()) return false;
      }
      return true;
    };
    if (!applied_mu_.AwaitWithDeadline(absl::Condition(&answered), deadline)) return false;
  }
  // A failed forward is owed before its push is answered (FinishPushDense).
  return !OwesTo(backup, generation, below);
}

bool ParameterStore::OwesAnyBelow(const std::vector<std::pair<int, int64_t>>& backups,
                                  int64_t below) const {
  if (below < 0) return false;  // (a push not numbered: not ordered against the owed ones)
  for (const auto& [task, generation] : backups) {
    if (task >= 0 && OwesTo(task, generation, below)) return true;
  }
  return false;
}

bool ParameterStore::OwesTo(int backup, int64_t generation, int64_t below) const {
  absl::MutexLock lock(&owed_mu_);
  for (const auto& [task, gen, number] : resending_to_) {
    if (task == backup && gen == generation && number < below) return true;
  }
  for (const OwedForwards& o : owed_) {
    if (o.forwards == nullptr || o.applied_as >= below) continue;
    for (const DenseForward& f : o.forwards->forwards) {
      if (f.backup == backup && f.generation == generation) return true;
    }
  }
  return false;
}

bool ParameterStore::TableForwardsSettled(int backup, int64_t generation, int64_t below,
                                          absl::Time deadline) {
  {
    absl::MutexLock lock(&applied_mu_);
    const auto answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(applied_mu_) {
      for (auto it = applied_.begin(); it != applied_.end() && it->first < below; ++it) {
        // (A table push's forwards are known once it told its outcome.)
        if (!it->second.told) return false;
        const std::vector<int>& b = it->second.table_backups;
        if (std::find(b.begin(), b.end(), backup) != b.end()) return false;
      }
      return true;
    };
    if (!applied_mu_.AwaitWithDeadline(absl::Condition(&answered), deadline)) return false;
  }
  // A failed table forward is owed before its push is answered (PushSparse).
  absl::MutexLock lock(&owed_mu_);
  if (resending_sparse_to_.count({backup, generation}) > 0) return false;
  for (const OwedForwards& o : owed_) {
    if (o.sparse == nullptr || o.applied_as >= below) continue;
    auto it = o.sparse->find(backup);
    if (it != o.sparse->end() && it->second.generation() == generation) return false;
  }
  return true;
}

absl::Status ParameterStore::InstallReplica(const v1::DenseReplica& replica, bool* installed) {
  *installed = false;
  google::protobuf::RepeatedPtrField<v1::ShardRef> refs;
  *refs.Add() = replica.shard();
  PS_ASSIGN_OR_RETURN(const std::vector<std::shared_ptr<DenseShard>> shards, FindDense(refs));
  if (replica.updates() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("a copy of ", DenseName(shards[0]->name(), shards[0]->partition()),
                     " at update ", replica.updates(), "; expected >= 0"));
  }
  // (Outside replica_mu_, so forwards of other shards go on during the memcpy; a forward
  // waiting for this one is woken below, whenever it checked.)
  PS_RETURN_IF_ERROR(
      shards[0]->InstallCopy(replica.values_and_slots(), replica.updates(), installed));
  {
    absl::MutexLock lock(&replica_mu_);
    replica_cv_.SignalAll();
  }
  ledger_.ImportDone(replica.ledger(), replica.ledger_floors());
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParameterStore::ReplicaBytes(const v1::ShardRef& ref) const {
  google::protobuf::RepeatedPtrField<v1::ShardRef> refs;
  *refs.Add() = ref;
  PS_ASSIGN_OR_RETURN(const std::vector<std::shared_ptr<DenseShard>> shards, FindDense(refs));
  return shards[0]->state_bytes();
}

absl::StatusOr<int64_t> ParameterStore::TableReplicaStride(const std::string& table) const {
  PS_ASSIGN_OR_RETURN(Table t, FindTable(table));
  return (1 + static_cast<int64_t>(t.table->optimizer().num_slots())) * t.table->dim();
}

absl::Status ParameterStore::InstallTableReplica(const v1::TableReplica& replica,
                                                 const int64_t* keys, const int64_t* counts,
                                                 const float* rows, bool* installed) {
  *installed = false;
  if (replica.stripe() == -1) {
    // The pushes the copies hold, for a retry once this store is promoted (InstallReplica).
    ledger_.ImportDone(replica.ledger(), replica.ledger_floors(), /*over_partial=*/true);
    *installed = true;
    return absl::OkStatus();
  }
  PS_ASSIGN_OR_RETURN(Table t, FindTable(replica.table()));
  if (replica.stripe() < 0 || replica.stripe() >= EmbeddingTable::kNumStripes ||
      replica.sequence() < 0 || replica.rows() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a copy of table ", replica.table(), "'s stripe ", replica.stripe(), " at number ",
        replica.sequence(), " with ", replica.rows(), " rows; expected a stripe 0 to ",
        EmbeddingTable::kNumStripes - 1, " (or -1 for the ledger), a number and rows >= 0"));
  }
  if (t.order == nullptr || t.accumulator != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table ", replica.table(), " takes no copies here (not an async backup part)"));
  }
  const int64_t n = replica.rows();
  for (int64_t i = 0; i < n; ++i) {
    if (t.table->StripeOf(keys[i]) != replica.stripe() || counts[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a copy of table ", replica.table(), "'s stripe ", replica.stripe(), " has key ", keys[i],
          " of stripe ", t.table->StripeOf(keys[i]), " with update count ", counts[i],
          "; expected keys of that stripe alone, counts >= 0"));
    }
  }
  const std::vector<uint32_t> last(n, 0);  // (replicated tables have no eviction)
  TableOrder::Stripe& stripe = t.order->stripes[replica.stripe()];
  absl::MutexLock lock(&stripe.mu);
  // The copy has a number of its own, which no group has: only this copy takes the stripe to
  // it (a copy sent again finds it there, and changes nothing).
  if (stripe.applied >= replica.sequence()) return absl::OkStatus();
  // (Checked whole before anything changes: a key not held is FAILED_PRECONDITION.)
  PS_RETURN_IF_ERROR(t.table->InsertRows(keys, rows, counts, last.data(), n));
  stripe.applied = replica.sequence();  // (the groups waiting for it look again as it is let go)
  *installed = true;
  return absl::OkStatus();
}

absl::Status ParameterStore::RebuildBackup(const v1::RebuildBackupRequest& request, int self,
                                           v1::RebuildBackupResponse* response,
                                           const std::function<bool()>& cancelled) {
  absl::MutexLock one_at_a_time(&rebuild_mu_);
  response->Clear();
  // An attempt its caller gave up on while it waited: a later one may have done the work
  // since, which giving this one up (DropBackup) would undo.
  if (cancelled && cancelled()) {
    return absl::CancelledError("the caller gave the rebuild up before it started");
  }
  const int backup = request.backup_ps_task();
  if (backup < 0 || backup == self) {
    return absl::InvalidArgumentError(absl::StrCat(
        "RebuildBackup names ps:", backup, "; expected another ps task's index (the new backup)"));
  }
  if (request.shards().empty() && request.tables().empty()) {
    return absl::InvalidArgumentError(
        "RebuildBackup names no shard and no table; expected at least one");
  }
  std::set<std::string> named_tables;
  for (const std::string& name : request.tables()) {
    if (!named_tables.insert(name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("RebuildBackup names table ", name, " twice; expected each table once"));
    }
    PS_ASSIGN_OR_RETURN(Table t, FindTable(name));
    if (t.order == nullptr || t.accumulator != nullptr || t.order->Backups() == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("table ", name,
                       " accumulates sync steps or has no backups; only async tables with "
                       "backups have their rows copied for a new backup"));
    }
  }
  std::set<std::pair<std::string, int32_t>> named;
  for (const v1::ShardRef& ref : request.shards()) {
    if (!named.insert({ref.variable(), ref.partition()}).second) {
      return absl::InvalidArgumentError(absl::StrCat("RebuildBackup names ",
                                                     DenseName(ref.variable(), ref.partition()),
                                                     " twice; expected each shard once"));
    }
  }
  // Every shard must be held before anything is copied.
  if (!request.shards().empty()) PS_RETURN_IF_ERROR(FindDense(request.shards()).status());
  if (options_.forwarder == nullptr) {
    return absl::FailedPreconditionError("this ps task has no forwarder to send copies with");
  }
  for (const v1::ShardRef& ref : request.shards()) {
    v1::DenseReplica replica;
    absl::Status s = cancelled && cancelled()
                         ? absl::CancelledError("the caller gave the rebuild up")
                         : CopyForNewBackup(ref, backup, &replica);
    bool installed = false;
    if (s.ok()) {
      const int64_t size = static_cast<int64_t>(replica.values_and_slots().size());
      const int64_t sent_before = rebuild_bytes_sent_.load();  // (one rebuild at a time)
      rebuild_bytes_copied_ += size;
      s = options_.forwarder->SendReplica(backup, replica, &installed, &rebuild_bytes_sent_);
      const int64_t sent = rebuild_bytes_sent_.load() - sent_before;
      if (s.ok()) {
        ++rebuild_copies_sent_;
        if (sent < size) rebuild_bytes_sent_ += size - sent;  // (a forwarder that does not count)
      } else {
        ++rebuild_copies_failed_;
        rebuild_bytes_abandoned_ += std::max<int64_t>(0, size - sent);
      }
    }
    if (!s.ok()) {
      // Not half a backup: forwards to a shard the copy never reached would wait for it.
      DropBackup(backup);
      return absl::Status(s.code(),
                          absl::StrCat("rebuild of ", DenseName(ref.variable(), ref.partition()),
                                       " on ps:", backup, ": ", s.message()));
    }
    response->set_shards_copied(response->shards_copied() + 1);
    response->set_bytes_copied(response->bytes_copied() +
                               static_cast<int64_t>(replica.values_and_slots().size()));
  }
  if (!request.tables().empty()) {
    const absl::Status s =
        CopyTablesForNewBackup({request.tables().begin(), request.tables().end()}, backup,
                               !request.shards().empty(), response, cancelled);
    if (!s.ok()) {
      DropBackup(backup);  // (its stripes forward to it no more)
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterStore::CopyTablesForNewBackup(const std::vector<std::string>& tables,
                                                    int backup, bool dense_copied,
                                                    v1::RebuildBackupResponse* response,
                                                    const std::function<bool()>& cancelled) {
  if (!replicated_.load(std::memory_order_relaxed)) {
    return absl::FailedPreconditionError(
        "this ps task's shards were not created with replication 2, so its pushes are not "
        "numbered and a copy could not tell which it holds");
  }
  // As CopyForNewBackup: a task counted lost is back, as a new generation (taken by the dense
  // copies of the same rebuild already, when there were any: lost again since, it is given
  // up); its table forwards go again from now on, each stripe's once that stripe is copied
  // (TableOrder::Stripe::off).
  int64_t generation = 0;
  {
    absl::MutexLock lock(&lost_backups_mu_);
    if (dense_copied) {
      if (lost_backups_.count(backup) > 0) {
        return absl::UnavailableError(absl::StrCat(
            "ps:", backup, " was lost after its dense shards were copied; no backup there now"));
      }
    } else if (lost_backups_.erase(backup) > 0) {
      ++backup_generation_[backup];
    }
    generation = backup_generation_[backup];
    lost_table_backups_.erase(backup);
  }
  const auto lost_again = [&] {
    absl::MutexLock lock(&lost_backups_mu_);
    return lost_table_backups_.count(backup) > 0 || backup_generation_[backup] != generation;
  };
  for (const std::string& name : tables) {
    PS_ASSIGN_OR_RETURN(Table t, FindTable(name));
    PS_ASSIGN_OR_RETURN(const int64_t stride, TableReplicaStride(name));
    TableOrder& order = *t.order;
    for (int s = 0; s < EmbeddingTable::kNumStripes; ++s) {
      if (cancelled && cancelled()) return absl::CancelledError("the caller gave the rebuild up");
      if (lost_again()) {
        return absl::UnavailableError(absl::StrCat(
            "ps:", backup, " was lost while the tables were copied for it; no backup there now"));
      }
      v1::TableReplica replica;
      replica.set_table(name);
      replica.set_stripe(s);
      EmbeddingTable::RowsCopy rows;
      {
        // Under the stripe's order lock: every group of it numbered for the task so far is in
        // the copy, every later one is numbered after it and sent there.
        TableOrder::Stripe& stripe = order.stripes[s];
        absl::MutexLock lock(&stripe.mu);
        const std::shared_ptr<const std::vector<int32_t>> backups = order.Backups();
        const auto backed_up_there = [&](int64_t key) {
          const int32_t v =
              VirtualShardOfTableKey(key, order.vocabulary_size, order.num_virtual_shards);
          return backups != nullptr && v < static_cast<int32_t>(backups->size()) &&
                 (*backups)[v] == backup;
        };
        t.table->CopyStripeRows(s, backed_up_there, &rows);
        // A number of its own, after every group numbered for the task so far: the task takes
        // the copy even where its part already holds the stripe at an earlier number (a rebuild
        // onto a part an earlier one filled, behind pushes applied here while the task was
        // off), and its later groups wait for the copy.
        replica.set_sequence(++stripe.sent[backup]);
        stripe.off.erase(backup);
      }
      const int64_t n = static_cast<int64_t>(rows.keys.size());
      replica.set_rows(n);
      const int64_t bytes = n * (2 * static_cast<int64_t>(sizeof(int64_t)) +
                                 stride * static_cast<int64_t>(sizeof(float)));
      const int64_t sent_before = rebuild_bytes_sent_.load();
      rebuild_bytes_copied_ += bytes;
      bool installed = false;
      const absl::Status sent_status = options_.forwarder->SendTableReplica(
          backup, replica, rows.keys, rows.counts,
          absl::MakeConstSpan(rows.rows.data(), rows.rows.size()), &installed,
          &rebuild_bytes_sent_);
      const int64_t sent = rebuild_bytes_sent_.load() - sent_before;
      if (!sent_status.ok()) {
        ++rebuild_copies_failed_;
        rebuild_bytes_abandoned_ += std::max<int64_t>(0, bytes - sent);
        return absl::Status(sent_status.code(),
                            absl::StrCat("rebuild of table ", name, "'s stripe ", s,
                                         " on ps:", backup, ": ", sent_status.message()));
      }
      ++rebuild_copies_sent_;
      if (sent < bytes) rebuild_bytes_sent_ += bytes - sent;
      response->set_rows_copied(response->rows_copied() + n);
      response->set_bytes_copied(response->bytes_copied() + bytes);
    }
    response->set_tables_copied(response->tables_copied() + 1);
  }
  if (lost_again()) {
    return absl::UnavailableError(absl::StrCat(
        "ps:", backup, " was lost while the tables were copied for it; no backup there now"));
  }
  // The pushes the copies hold, by their ids, for the new backup's ledger (as a dense copy's).
  // Every push numbered from here on began after every stripe was copied: its groups for the
  // task are all forwarded there, and bring its id. One numbered before may hold groups in the
  // copies and groups forwarded: it goes out as done once those forwards were applied there
  // (waited for; the rebuild given up where one failed). So may a dense push applied after the
  // dense copies, whose forward went there: the same.
  const int64_t at_end = AppliedSoFar();
  const absl::Time deadline = absl::Now() + options_.replica_wait;
  v1::TableReplica ledger;
  ledger.set_table(tables.empty() ? "" : tables.front());
  ledger.set_stripe(-1);
  if (!TableForwardsSettled(backup, generation, at_end, deadline) ||
      !ForwardsSettled(backup, generation, at_end, deadline) ||
      !AppliedUnanswered(at_end, deadline, ledger.mutable_ledger())) {
    return absl::UnavailableError(absl::StrCat(
        "a table push applied while its tables were copied for ps:", backup,
        " has a forward there that failed or was not answered within ",
        absl::FormatDuration(options_.replica_wait), "; no backup there now, try again"));
  }
  ledger_.ExportDone(ledger.mutable_ledger(), ledger.mutable_ledger_floors(), at_end);
  bool installed = false;
  const absl::Status s =
      options_.forwarder->SendTableReplica(backup, ledger, {}, {}, {}, &installed, nullptr);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("rebuild of the tables on ps:", backup,
                                               ": the ledger: ", s.message()));
  }
  return absl::OkStatus();
}

int ParameterStore::DropBackup(int backup) {
  int64_t generation = 0;
  {
    absl::MutexLock lock(&lost_backups_mu_);
    lost_backups_.insert(backup);
    lost_table_backups_.insert(backup);
    generation = backup_generation_[backup];
  }
  // Forwards under way to it end now (counted lost above, they are not sent again): one that
  // hangs would hold its push, and the worker's answer, for the forwarder's I/O timeout.
  if (options_.forwarder != nullptr) options_.forwarder->AbortCalls(backup);
  int dropped = 0;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [key, shard] : dense_) {
    // (Of that generation only: a shard CopyForNewBackup gave the task back meanwhile keeps it.)
    if (shard->ClearBackupIf(backup, generation)) ++dropped;
  }
  // No table group is numbered for it any more (a rebuild copies each stripe again first).
  for (const auto& [name, t] : tables_) {
    if (t.order == nullptr) continue;
    for (TableOrder::Stripe& stripe : t.order->stripes) {
      absl::MutexLock stripe_lock(&stripe.mu);
      stripe.off.insert(backup);
    }
  }
  return dropped;
}

absl::Status ParameterStore::SendForwards(const ForwardList& forwards, int64_t applied_as) {
  if (owed_count_.load(std::memory_order_relaxed) > 0) {
    ResendOwed(applied_as);
    // An earlier push's forward to one of these backups failed again (or is on its way on
    // another thread): this one would wait for it there, replica_wait, and hold its thread.
    // Owed instead; the retry sends them in order.
    std::vector<std::pair<int, int64_t>> to;
    for (const DenseForward& f : forwards.forwards) to.emplace_back(f.backup, f.generation);
    if (OwesAnyBelow(to, applied_as)) {
      forwards_failed_.fetch_add(1, std::memory_order_relaxed);
      return absl::UnavailableError(
          "the push was applied on this ps task but not yet on its backup (an earlier push's "
          "forward to it is owed: this one goes after it); send it again with the same request "
          "id");
    }
  }
  absl::Status s = SendForwardsNow(forwards);
  if (s.ok()) {
    forwards_acknowledged_.fetch_add(1, std::memory_order_relaxed);
    return s;
  }
  forwards_failed_.fetch_add(1, std::memory_order_relaxed);
  return absl::UnavailableError(
      absl::StrCat("the push was applied on this ps task but not yet on its backup (", s.message(),
                   "); send it again with the same request id"));
}

void ParameterStore::OweForwards(const v1::RequestId& id,
                                 std::shared_ptr<const ForwardList> forwards,
                                 std::shared_ptr<const SparseForwards> sparse, int64_t applied_as) {
  absl::MutexLock lock(&owed_mu_);
  owed_.push_back(OwedForwards{id, std::move(forwards), std::move(sparse), applied_as});
  owed_count_.store(static_cast<int64_t>(owed_.size()), std::memory_order_relaxed);
}

void ParameterStore::ResendOwed(int64_t below) {
  std::deque<OwedForwards> owed;
  std::vector<std::pair<uint64_t, uint64_t>> ids;
  std::vector<std::tuple<int, int64_t, int64_t>> to;  // (task, generation, push) per forward
  std::vector<std::pair<int, int64_t>> sparse_to;     // (task, generation) per table forward
  {
    absl::MutexLock lock(&owed_mu_);
    if (below < 0) {
      owed.swap(owed_);
    } else {
      // A push applied after the caller's stays owed: sent first, its backup would wait for
      // the caller's forward (one number below it) for replica_wait, while the caller waits
      // for it to be answered. Its retry, or a later push, sends it.
      std::deque<OwedForwards> later;
      for (OwedForwards& o : owed_) {
        (o.forwards != nullptr && o.applied_as >= below ? later : owed).push_back(std::move(o));
      }
      owed_.swap(later);
    }
    // Still owed while they are sent (Owes): a retry is not answered before they went through.
    for (const OwedForwards& o : owed) {
      ids.emplace_back(o.id.client(), o.id.seq());
      if (o.sparse != nullptr) {
        for (const auto& [task, f] : *o.sparse) sparse_to.emplace_back(task, f.generation());
      }
      if (o.forwards == nullptr) continue;
      for (const DenseForward& f : o.forwards->forwards) {
        to.emplace_back(f.backup, f.generation, o.applied_as);
      }
    }
    resending_.insert(ids.begin(), ids.end());
    resending_to_.insert(to.begin(), to.end());
    resending_sparse_to_.insert(sparse_to.begin(), sparse_to.end());
  }
  // The dense ones in their pushes' order, which every backup applies them in (owed_ has them
  // in the order their sends failed: two pushes failing at once may be owed either way round,
  // and a later one sent first would wait at its backup for the earlier, replica_wait, behind
  // this very loop); the table forwards after them (below).
  std::stable_sort(owed.begin(), owed.end(), [](const OwedForwards& x, const OwedForwards& y) {
    const bool x_dense = x.forwards != nullptr, y_dense = y.forwards != nullptr;
    if (x_dense != y_dense) return x_dense;
    return x_dense && x.applied_as < y.applied_as;
  });
  // Backups (task, generation) a dense forward failed to reach in this pass: the later ones to
  // them stay owed unsent, for the same reason.
  std::set<std::pair<int, int64_t>> failed_to;
  const auto held_back = [&failed_to](const OwedForwards& o) {
    if (o.forwards == nullptr || failed_to.empty()) return false;
    for (const DenseForward& f : o.forwards->forwards) {
      if (failed_to.count({f.backup, f.generation}) > 0) return true;
    }
    return false;
  };
  // Those that fail again, or are held back, stay owed, before any owed meanwhile.
  std::deque<OwedForwards> still;
  // The table forwards all at once, after the dense ones: two table pushes may meet stripes in
  // opposite orders, so no order of them would do one after the other (the backup would wait
  // replica_wait for the second's group in a stripe while this loop held the second behind
  // the first); sent together, each waits there for the other's groups as it needs them.
  std::vector<OwedForwards*> tables;
  for (OwedForwards& o : owed) {
    if (o.sparse != nullptr) {
      tables.push_back(&o);
      continue;
    }
    if (held_back(o)) {
      still.push_back(std::move(o));
      continue;
    }
    const bool sent = SendForwardsNow(*o.forwards).ok();
    if (sent) {
      ledger_.MarkReplicated(o.id);
      forwards_acknowledged_.fetch_add(1, std::memory_order_relaxed);
    } else {
      for (const DenseForward& f : o.forwards->forwards) failed_to.insert({f.backup, f.generation});
      still.push_back(std::move(o));
    }
  }
  std::vector<char> sent(tables.size(), 0);
  {
    std::vector<std::thread> others;
    for (size_t i = 1; i < tables.size(); ++i) {
      others.emplace_back([&, i] { sent[i] = SendSparseNow(*tables[i]->sparse).ok(); });
    }
    if (!tables.empty()) sent[0] = SendSparseNow(*tables[0]->sparse).ok();
    for (std::thread& t : others) t.join();
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    if (sent[i]) {
      forwards_acknowledged_.fetch_add(1, std::memory_order_relaxed);
    } else {
      still.push_back(std::move(*tables[i]));
    }
  }
  absl::MutexLock lock(&owed_mu_);
  for (const auto& id : ids) {
    auto it = resending_.find(id);
    if (it != resending_.end()) resending_.erase(it);
  }
  for (const auto& backup : to) {
    auto it = resending_to_.find(backup);
    if (it != resending_to_.end()) resending_to_.erase(it);
  }
  for (const auto& backup : sparse_to) {
    auto it = resending_sparse_to_.find(backup);
    if (it != resending_sparse_to_.end()) resending_sparse_to_.erase(it);
  }
  owed_.insert(owed_.begin(), std::make_move_iterator(still.begin()),
               std::make_move_iterator(still.end()));
  owed_count_.store(static_cast<int64_t>(owed_.size()), std::memory_order_relaxed);
}

ParameterStore::ForwardTotals ParameterStore::forward_totals() const {
  ForwardTotals t;
  t.acknowledged = forwards_acknowledged_.load(std::memory_order_relaxed);
  t.failed = forwards_failed_.load(std::memory_order_relaxed);
  t.streams_fell_back = streams_fell_back_.load(std::memory_order_relaxed);
  t.committed_early = committed_early_.load(std::memory_order_relaxed);
  t.owed = owed_count_.load(std::memory_order_relaxed);
  return t;
}

ParameterStore::RebuildTotals ParameterStore::rebuild_totals() const {
  RebuildTotals t;
  // Read in the reverse of the order RebuildBackup raises them (copied, then sent, then
  // abandoned), so that copied - sent - abandoned is never below 0 in what a scrape sees.
  t.bytes_abandoned = rebuild_bytes_abandoned_.load();
  t.bytes_sent = rebuild_bytes_sent_.load();
  t.bytes_copied = rebuild_bytes_copied_.load();
  t.copies_sent = rebuild_copies_sent_.load(std::memory_order_relaxed);
  t.copies_failed = rebuild_copies_failed_.load(std::memory_order_relaxed);
  return t;
}

absl::Status ParameterStore::SendForwardsNow(const ForwardList& forwards) {
  // Forwards to a backup that died are left out (copied only then: it owns its gradients).
  const ForwardList* send = &forwards;
  ForwardList live;
  {
    absl::MutexLock lock(&lost_backups_mu_);
    // Lost, or made for a backup of the task that was lost before this one (a rebuild).
    const auto gone = [&](const DenseForward& f) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lost_backups_mu_) {
      if (lost_backups_.count(f.backup) > 0) return true;
      auto it = backup_generation_.find(f.backup);
      return f.generation != (it == backup_generation_.end() ? 0 : it->second);
    };
    bool any_gone = false;
    for (const DenseForward& f : forwards.forwards) any_gone |= gone(f);
    if (any_gone) {
      for (const DenseForward& f : forwards.forwards) {
        if (!gone(f)) live.forwards.push_back(f);
      }
      send = &live;
    }
  }
  if (send->forwards.empty()) return absl::OkStatus();
  return options_.forwarder->Forward(*send);
}

absl::Status ParameterStore::ApplyReplicatedDense(const v1::ReplicateHeader& header,
                                                  DensePush* push,
                                                  v1::ReplicateResponse* response) {
  const int n = push->num_shards();
  if (header.versions_size() != n || n != header.push().shards_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a replicated push names ", header.push().shards_size(), " shards but gives ",
                     header.versions_size(), " versions"));
  }
  for (int i = 0; i < n; ++i) {
    const DensePush::Buffer& b = push->grads_[i];
    const DenseShard& s = *push->shards_[i];
    if (b.received != b.size) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", DenseName(s.name(), s.partition()), ": received ", b.received,
                       " of ", b.size, " replicated gradient elements"));
    }
    if (header.versions(i) < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", DenseName(s.name(), s.partition()), ": replicated version ",
                       header.versions(i), "; expected >= 1"));
    }
  }
  PS_RETURN_IF_ERROR(push->ScanDeferred(&apply_pool_));
  const std::vector<std::shared_ptr<DenseAccumulator>> accumulators = AccumulatorsOf(push->shards_);
  // Where each backup shard is against the forward: -1 behind it (wait), 0 at it (apply),
  // 1 past it (already applied). A sync shard's place is its accumulator's order.
  auto place = [&](int i) {
    const int64_t have =
        accumulators[i] != nullptr ? accumulators[i]->adds() : push->shards_[i]->updates();
    const int64_t want = header.versions(i) - 1;
    return have < want ? -1 : have == want ? 0 : 1;
  };
  // Async shards go all at once (as ApplyAll took them on the primary); sync shards one by one,
  // each as soon as its accumulator is at the gradient's place.
  std::vector<DenseShard*> now;
  std::vector<const float*> now_grads;
  std::vector<int> one_by_one;
  for (int i = 0; i < n; ++i) {
    if (accumulators[i] != nullptr) {
      one_by_one.push_back(i);
    } else {
      now.push_back(push->shards_[i].get());
      now_grads.push_back(push->grads_[i].values());
    }
  }
  const int64_t step = header.push().step();
  const int32_t worker = header.push().worker();
  std::vector<char> done(n, 0);
  bool now_done = now.empty();
  int applied = 0, already = 0;
  const absl::Time deadline = absl::Now() + options_.replica_wait;
  absl::ReleasableMutexLock lock(&replica_mu_);
  while (true) {
    bool progressed = false;
    int behind = 0;
    if (!now_done) {
      int at = 0, past = 0, waiting = 0;
      for (int i = 0; i < n; ++i) {
        if (accumulators[i] != nullptr) continue;
        const int p = place(i);
        waiting += p < 0;
        at += p == 0;
        past += p > 0;
      }
      const int k = static_cast<int>(now.size());
      if (past == k) {
        already += k;
        now_done = true;
      } else if (past > 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "a replicated push is already applied to ", past, " of its ", k,
            " shards but not to the others: this backup has diverged from its primary"));
      } else if (at == k) {
        absl::ReaderMutexLock barrier(&apply_barrier_);
        ApplyTimer timer(apply_totals_, k);
        DenseShard::ApplyAll(now, now_grads, &apply_pool_, header.push().delta());
        applied += k;
        now_done = progressed = true;
      }
      behind += waiting;
    }
    for (int i : one_by_one) {
      if (done[i]) continue;
      const int p = place(i);
      if (p < 0) {
        ++behind;
        continue;
      }
      done[i] = 1;
      if (p > 0) {
        ++already;
        continue;
      }
      DenseShard& shard = *push->shards_[i];
      int64_t order = 0;
      AccumulateOutcome outcome;
      {
        absl::ReaderMutexLock barrier(&apply_barrier_);
        outcome = accumulators[i]->Add(step, worker, push->grads_[i].values(),
                                       ApplyTo(&shard, &apply_pool_, apply_totals_), &order);
      }
      if (order != header.versions(i)) {
        return absl::InternalError(absl::StrCat(
            "backup ", DenseName(shard.name(), shard.partition()), " did not take the gradient of ",
            "worker ", worker, " for step ", step, " that its primary took as number ",
            header.versions(i), " (here: outcome ", static_cast<int>(outcome), ", step ",
            accumulators[i]->step(), "): this backup has diverged from its primary"));
      }
      ++applied;
      progressed = true;
    }
    if (progressed) replica_cv_.SignalAll();
    if (now_done && behind == 0) break;
    if (progressed) continue;
    if (replica_cv_.WaitWithDeadline(&replica_mu_, deadline)) {
      const DenseShard& s = *push->shards_[0];
      return absl::DeadlineExceededError(absl::StrCat(
          "waited ", absl::FormatDuration(options_.replica_wait), " for the updates before ",
          header.versions(0), " of backup ", DenseName(s.name(), s.partition()),
          " (and the push's other shards), which have ",
          accumulators[0] != nullptr ? accumulators[0]->adds() : s.updates(), "; ", behind,
          " shards behind"));
    }
  }
  // (The ledger waits for an attempt that holds the id: not while holding replica_mu_.)
  lock.Release();
  PushOutcome outcome;
  if (applied == 0) {
    // Applied before (a forward sent again), or part of a copy this backup took (a rebuild:
    // InstallReplica), which may not have its id: remembered either way.
    if (ledger_.Begin(header.push().request_id(), &outcome) == PushLedger::Claim::kNew) {
      outcome.accepted = header.accepted();
      outcome.dropped_stale = header.dropped_stale();
      ledger_.Record(header.push().request_id(), outcome);
    }
    response->set_already_applied(already);
    return absl::OkStatus();
  }
  (void)ledger_.Begin(header.push().request_id(), &outcome);
  for (int i = 0; i < n; ++i) {
    Touch(push->shards_[i]->counters(), /*push=*/true, push->grads_[i].size * push->elem_bytes_);
  }
  outcome.accepted = header.accepted();
  outcome.dropped_stale = header.dropped_stale();
  ledger_.Record(header.push().request_id(), outcome);
  response->set_applied(applied);
  response->set_already_applied(already);
  return absl::OkStatus();
}

absl::Status ParameterStore::CheckDeltaPush(
    const DensePush& push,
    const std::vector<std::shared_ptr<DenseAccumulator>>& accumulators) const {
  {
    absl::MutexLock lock(&mu_);
    if (!deltas_allowed_) {
      return absl::FailedPreconditionError(
          "a delta push (local steps) to a cluster that does not run them (the chief's "
          "--local_steps is 1)");
    }
  }
  // A delta is added to the values as they are: a sync step's mean has no place for it.
  for (int i = 0; i < push.num_shards(); ++i) {
    if (accumulators[i] == nullptr) continue;
    const DenseShard& s = *push.shards_[i];
    return absl::FailedPreconditionError(absl::StrCat(
        "variable ", DenseName(s.name(), s.partition()),
        " accumulates sync steps; a delta push (local steps) needs async or ssp mode"));
  }
  return absl::OkStatus();
}

void ParameterStore::ApplyDensePush(
    const DensePush& push, const std::vector<std::shared_ptr<DenseAccumulator>>& accumulators,
    PushOutcome* outcome, std::vector<int64_t>* versions,
    std::vector<std::pair<int, int64_t>>* backups, const DenseShard::OrderedFn& ordered,
    int64_t* applied_as) {
  const v1::PushDenseHeader& header = push.header_;
  const int n = push.num_shards();
  versions->assign(n, 0);
  // (Sync shards: as they are now; CopyForNewBackup never gives them a new backup.)
  backups->resize(n);
  for (int i = 0; i < n; ++i) {
    (*backups)[i] = {push.shards_[i]->backup_ps_task(), push.shards_[i]->backup_generation()};
  }
  absl::ReaderMutexLock barrier(&apply_barrier_);
  // Shards updated at once (async) are applied together: one parallel loop for the push.
  std::vector<DenseShard*> now;
  std::vector<const float*> now_grads;
  std::vector<int> now_index;
  for (int i = 0; i < n; ++i) {
    if (accumulators[i] != nullptr) continue;
    now.push_back(push.shards_[i].get());
    now_grads.push_back(push.grads_[i].values());
    now_index.push_back(i);
  }
  std::vector<int64_t> after;
  std::vector<std::pair<int, int64_t>> backups_after;
  if (applied_as != nullptr) *applied_as = -1;
  // `ordered` reads the versions by the push's shard: only when every shard is in `now`.
  const bool whole = static_cast<int>(now.size()) == n && ordered != nullptr;
  DenseShard::OrderedFn under_locks;
  if (applied_as != nullptr || whole) {
    under_locks = [&](const std::vector<int64_t>& at,
                      const std::vector<std::pair<int, int64_t>>& backups_at) {
      if (applied_as != nullptr) *applied_as = NoteApplied(backups_at);
      if (whole) ordered(at, backups_at);
    };
  }
  {
    ApplyTimer timer(apply_totals_, static_cast<int64_t>(now.size()));
    DenseShard::ApplyAll(now, now_grads, &apply_pool_, header.delta(), &after, &backups_after,
                         under_locks);
  }
  for (size_t j = 0; j < after.size(); ++j) {
    (*versions)[now_index[j]] = after[j];
    (*backups)[now_index[j]] = backups_after[j];
  }
  for (int i = 0; i < n; ++i) {
    DenseShard& shard = *push.shards_[i];
    const float* grad = push.grads_[i].values();
    const int64_t bytes = push.grads_[i].size * push.elem_bytes_;
    Touch(shard.counters(), /*push=*/true, bytes);
    if (accumulators[i] == nullptr) {
      ++outcome->accepted;
      continue;
    }
    // A gradient taken has its place in the accumulator's order, which its backup follows.
    switch (accumulators[i]->Add(header.step(), header.worker(), grad,
                                 ApplyTo(&shard, &apply_pool_, apply_totals_), &(*versions)[i])) {
      case AccumulateOutcome::kComplete:  // pending until the next step needs it
      case AccumulateOutcome::kAccumulated:
        ++outcome->accepted;
        break;
      case AccumulateOutcome::kStale:
      case AccumulateOutcome::kDuplicate:
      case AccumulateOutcome::kAhead:
        CountDropped(header.worker(), shard.counters());
        ++outcome->dropped_stale;
        break;
    }
  }
}

absl::StatusOr<int64_t> ParameterStore::TableDim(const std::string& table) const {
  PS_ASSIGN_OR_RETURN(Table t, FindTable(table));
  return t.table->dim();
}

ParameterStore::SparseWork::SparseWork(ParameterStore* store) : store_(store), pool_(nullptr) {
  const int under_way = store->sparse_in_flight_.fetch_add(1, std::memory_order_relaxed) + 1;
  const int64_t now = absl::GetCurrentTimeNanos();
  if (under_way + store->apply_pool_.num_threads() > store->cores_) {
    store->crowded_until_nanos_.store(now + kCrowdedNanos, std::memory_order_relaxed);
  } else if (now >= store->crowded_until_nanos_.load(std::memory_order_relaxed)) {
    pool_ = &store->apply_pool_;
  }
}

ParameterStore::SparseWork::~SparseWork() {
  store_->sparse_in_flight_.fetch_sub(1, std::memory_order_relaxed);
}

absl::Status ParameterStore::PullSparse(const v1::PullSparseRequest& request, const int64_t* keys,
                                        int64_t n, std::vector<float>* rows) {
  PS_ASSIGN_OR_RETURN(Table t, FindTable(request.table()));
  PS_ASSIGN_OR_RETURN(const int elem_bytes, WireBytesPerElement(WireOrFloat(request.wire_dtype())));
  const int64_t dim = t.table->dim();
  PS_RETURN_IF_ERROR(CheckSparseSize(request.table(), "pull", n, dim));
  // With admission or eviction a pull creates no row: nothing to limit.
  if (t.table->pulls_create_rows()) {
    PS_RETURN_IF_ERROR(CheckTableRows(request.table(), *t.table, keys, n));
  }
  SettleTable(t, request.has_step() ? request.step() : -1);
  rows->resize(n * dim);
  // Sync: a TTL is judged at the step the pull is for (EmbeddingTable::Pull).
  const int64_t ttl_step = t.accumulator != nullptr && request.has_step() ? request.step() : -1;
  const SparseWork work(this);
  PS_RETURN_IF_ERROR(t.table->Pull(keys, n, rows->data(), work.pool(), ttl_step));
  Touch(*t.counters, /*push=*/false, n * dim * elem_bytes);
  return absl::OkStatus();
}

absl::Status ParameterStore::PushSparse(const v1::PushSparseRequest& request, const int64_t* keys,
                                        int64_t n, absl::string_view gradient_bytes,
                                        v1::PushSparseResponse* response) {
  const std::string& table = request.table();
  PS_ASSIGN_OR_RETURN(Table t, FindTable(table));
  const v1::DataType wire = WireOrFloat(request.wire_dtype());
  PS_ASSIGN_OR_RETURN(const int elem_bytes, WireBytesPerElement(wire));
  const int64_t dim = t.table->dim();
  PS_RETURN_IF_ERROR(CheckSparseSize(table, "push", n, dim));
  if (static_cast<int64_t>(gradient_bytes.size()) != n * dim * elem_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", table, ": ", n, " keys of dim ", dim, " need ", n * dim * elem_bytes,
        " gradient bytes of ", v1::DataType_Name(wire), ", got ", gradient_bytes.size()));
  }
  // float32 gradients are used where they lie when aligned; others are decoded first.
  const float* grads = reinterpret_cast<const float*>(gradient_bytes.data());
  std::vector<float> decoded;
  if (wire != v1::DT_FLOAT32 || reinterpret_cast<uintptr_t>(grads) % alignof(float) != 0) {
    decoded.resize(n * dim);
    PS_RETURN_IF_ERROR(DecodeFloats(gradient_bytes, wire, decoded.data(), n * dim));
    grads = decoded.data();
  }
  const SparseWork work(this);
  PS_RETURN_IF_ERROR(t.table->CheckPush(keys, n, grads, options_.allow_non_finite, work.pool()));
  // A table with a capacity evicts rather than refuse.
  if (!t.table->has_capacity()) PS_RETURN_IF_ERROR(CheckTableRows(table, *t.table, keys, n));
  PushOutcome outcome;
  uint64_t applied_stripes = 0;
  switch (ledger_.Begin(request.request_id(), &outcome, nullptr, &applied_stripes)) {
    case PushLedger::Claim::kDuplicate:
      // A retry of a push whose forwards to its backups failed: they go again first.
      if (owed_count_.load(std::memory_order_relaxed) > 0) {
        ResendOwed();
        if (Owes(request.request_id())) {
          return absl::UnavailableError(
              "the push was applied on this ps task but its forward to the backup failed again; "
              "send it again with the same request id");
        }
      }
      response->set_accepted_rows(outcome.accepted);
      response->set_dropped_stale(outcome.dropped_stale);
      response->set_duplicate(true);
      return absl::OkStatus();
    case PushLedger::Claim::kTooOld:
      return RequestIdTooOld(request.request_id());
    case PushLedger::Claim::kNew:
      break;
  }
  // Part of it was applied here already: this store backed the push's rows up, and the forward
  // of it, which its primary sent before it died, applied the groups of some stripes and waited
  // in vain for the others' turn (ApplyReplicatedSparse). Only the rows of the other stripes now.
  const int64_t request_keys = n;
  std::vector<int64_t> rest_keys;
  std::vector<float> rest_grads;
  if (applied_stripes != 0) {
    for (int64_t i = 0; i < n; ++i) {
      if ((applied_stripes >> t.table->StripeOf(keys[i])) & 1) continue;
      rest_keys.push_back(keys[i]);
      rest_grads.insert(rest_grads.end(), grads + i * dim, grads + (i + 1) * dim);
    }
    PS_LOG_FIRST_N(INFO, 4) << "table " << table << ": a push of " << n << " keys was partly "
                            << "applied by its forward before; applying the " << rest_keys.size()
                            << " keys of the stripes it had not";
    keys = rest_keys.data();
    grads = rest_grads.data();
    n = static_cast<int64_t>(rest_keys.size());
  }
  absl::Status applied;
  // With backups (replication 2): what each backup task must apply of it.
  const std::shared_ptr<const std::vector<int32_t>> backups =
      t.order != nullptr && options_.forwarder != nullptr ? t.order->Backups() : nullptr;
  const bool replicated = backups != nullptr;
  SparseForwards forwards;
  // Numbered before its apply on a store with backups, told once the apply is over, answered
  // by the time this returns (as a dense push: FinishPushDense): a table copy for a new backup
  // carries the pushes numbered before its end (CopyTablesForNewBackup).
  int64_t applied_as = -1;
  const absl::Cleanup answered = [&] {
    if (applied_as >= 0) NoteAnswered(applied_as);
  };
  if (replicated && t.accumulator == nullptr && replicated_.load(std::memory_order_relaxed)) {
    applied_as = NoteApplied({});
  }
  {
    absl::ReaderMutexLock barrier(&apply_barrier_);
    Touch(*t.counters, /*push=*/true, static_cast<int64_t>(gradient_bytes.size()));
    if (t.accumulator == nullptr) {
      ApplyTimer timer(apply_totals_ + 2, 1);
      // Only a push that is applied moves the table's clock (sync: the settled step, ApplyTo).
      t.table->ObserveStep(request.step());
      applied = replicated ? ApplyPushInStripeOrder(t, *backups, request, keys, n, grads,
                                                    work.pool(), &forwards)
                           : t.table->ApplyPush(keys, n, grads, work.pool());
      // (A retry of a partly applied push took all of its keys, some of them before.)
      if (applied.ok()) outcome.accepted = static_cast<int32_t>(request_keys);
    } else {
      switch (t.accumulator->Add(request.step(), request.worker(), request.part(),
                                 request.num_parts(), keys, n, grads,
                                 ApplyTo(t.table.get(), &apply_pool_, apply_totals_ + 2))) {
        case AccumulateOutcome::kComplete:  // pending until the next step needs it
        case AccumulateOutcome::kAccumulated:
          outcome.accepted = static_cast<int32_t>(n);
          break;
        case AccumulateOutcome::kStale:
        case AccumulateOutcome::kDuplicate:
        case AccumulateOutcome::kAhead:
          CountDropped(request.worker(), *t.counters);
          outcome.dropped_stale = 1;
          break;
      }
    }
  }
  if (!applied.ok()) {
    ledger_.Release(request.request_id());
    return applied;
  }
  if (applied_as >= 0) {
    std::vector<int> to;
    for (const auto& [backup, f] : forwards) to.push_back(backup);
    NoteOutcome(applied_as, request.request_id(), outcome, std::move(to));
  }
  if (!forwards.empty()) {
    if (options_.crash_points != nullptr) options_.crash_points->Reach(kCrashPushApplied);
    for (auto& [backup, f] : forwards) f.set_accepted_rows(outcome.accepted);
    // Answered only once the backups applied it too; owed (and sent before the next forward,
    // or by the worker's retry) when they did not. Recorded in the ledger only then, owed
    // first: a retry that arrives meanwhile waits for the record, and then finds it owed.
    // What is owed goes at the same time as this push's forward, not before it: an owed push
    // numbered after this one in a stripe would have the backup wait replica_wait for this
    // one's group while this thread waited for that answer (as for dense, ResendOwed's
    // `below`); two pushes can also meet stripes in opposite orders, so neither order would do.
    std::thread resend;
    if (owed_count_.load(std::memory_order_relaxed) > 0)
      resend = std::thread([this] { ResendOwed(); });
    absl::Status forwarded = SendSparseNow(forwards);
    if (resend.joinable()) resend.join();
    if (!forwarded.ok()) {
      forwards_failed_.fetch_add(1, std::memory_order_relaxed);
      OweForwards(request.request_id(), nullptr,
                  std::make_shared<const SparseForwards>(std::move(forwards)), applied_as);
      ledger_.Record(request.request_id(), outcome, nullptr, applied_as);
      return absl::UnavailableError(
          absl::StrCat("the push was applied on this ps task but not yet on its backup (",
                       forwarded.message(), "); send it again with the same request id"));
    }
    forwards_acknowledged_.fetch_add(1, std::memory_order_relaxed);
  }
  ledger_.Record(request.request_id(), outcome, nullptr, applied_as);
  response->set_accepted_rows(outcome.accepted);
  response->set_dropped_stale(outcome.dropped_stale);
  return absl::OkStatus();
}

absl::Status ParameterStore::ApplyPushInStripeOrder(const Table& t,
                                                    const std::vector<int32_t>& backups,
                                                    const v1::PushSparseRequest& request,
                                                    const int64_t* keys, int64_t n,
                                                    const float* grads, ThreadPool* pool,
                                                    SparseForwards* forwards) {
  EmbeddingTable& table = *t.table;
  TableOrder& order = *t.order;
  const int64_t dim = table.dim();
  constexpr int kStripes = EmbeddingTable::kNumStripes;
  // Each key goes to a slot: one per backup task this table has, and a last one for the keys of
  // virtual shards without a backup. A slot's keys and gradients are laid out stripe by stripe
  // in one buffer: for a backup, the buffer is its forward's own (each stripe's part is applied
  // here from it and sent from it as it lies), so every key and gradient is copied once.
  std::vector<int32_t> tasks;  // slot -> backup task
  std::vector<int32_t> slot_of_vshard(backups.size());
  for (size_t v = 0; v < backups.size(); ++v) {
    if (backups[v] < 0) continue;
    const auto at = std::find(tasks.begin(), tasks.end(), backups[v]);
    slot_of_vshard[v] = static_cast<int32_t>(at - tasks.begin());
    if (at == tasks.end()) tasks.push_back(backups[v]);
  }
  const int num_slots = static_cast<int>(tasks.size()) + 1;
  const int unbacked = num_slots - 1;
  for (size_t v = 0; v < backups.size(); ++v) {
    if (backups[v] < 0) slot_of_vshard[v] = unbacked;
  }
  const int num_buckets = kStripes * num_slots;  // bucket = stripe * num_slots + slot
  // A counting sort in blocks of keys, on the pool's threads when given: each block counts its
  // buckets, then writes its keys at its own offsets in them.
  const int64_t max_blocks = pool == nullptr ? 1 : pool->num_threads() + 1;
  const int64_t num_blocks = std::max<int64_t>(1, std::min<int64_t>(max_blocks, n / 4096));
  const auto block_begin = [&](int64_t b) { return n * b / num_blocks; };
  const auto for_each_block = [&](const std::function<void(int64_t)>& fn) {
    if (num_blocks > 1) {
      pool->ForEachIndex(num_blocks, fn);
    } else {
      fn(0);
    }
  };
  std::vector<uint32_t> bucket_of(n);
  std::vector<int64_t> at(num_blocks * num_buckets, 0);  // counts, then offsets in the slot
  for_each_block([&](int64_t b) {
    int64_t* count = at.data() + b * num_buckets;
    for (int64_t i = block_begin(b); i < block_begin(b + 1); ++i) {
      const int32_t v =
          VirtualShardOfTableKey(keys[i], order.vocabulary_size, order.num_virtual_shards);
      const uint32_t bucket = table.StripeOf(keys[i]) * num_slots + slot_of_vshard[v];
      bucket_of[i] = bucket;
      ++count[bucket];
    }
  });
  // Offsets: within a slot's buffer, stripe after stripe, and within a stripe block after block.
  std::vector<int64_t> bucket_start(num_buckets), bucket_count(num_buckets, 0);
  std::vector<int64_t> slot_keys(num_slots, 0);
  for (int s = 0; s < kStripes; ++s) {
    for (int slot = 0; slot < num_slots; ++slot) {
      const int bucket = s * num_slots + slot;
      bucket_start[bucket] = slot_keys[slot];
      for (int64_t b = 0; b < num_blocks; ++b) {
        const int64_t c = at[b * num_buckets + bucket];
        at[b * num_buckets + bucket] = slot_keys[slot];
        slot_keys[slot] += c;
        bucket_count[bucket] += c;
      }
    }
  }
  // The buffers: the forwards' (an empty slot sends nothing), and one of this call's own.
  std::vector<int64_t> unbacked_keys(slot_keys[unbacked]);
  std::vector<float> unbacked_grads(slot_keys[unbacked] * dim);
  std::vector<int64_t*> slot_key_data(num_slots);
  std::vector<float*> slot_grad_data(num_slots);
  for (int slot = 0; slot < unbacked; ++slot) {
    if (slot_keys[slot] == 0) continue;
    v1::ReplicateSparseRequest& f = (*forwards)[tasks[slot]];
    f.set_table(request.table());
    *f.mutable_request_id() = request.request_id();
    // Reserved beyond any string's inline buffer first, so that the storage is malloc's,
    // aligned for any scalar (an inline one need not be).
    f.mutable_keys()->reserve(std::max<size_t>(slot_keys[slot] * sizeof(int64_t), 64));
    f.mutable_gradients()->reserve(std::max<size_t>(slot_keys[slot] * dim * sizeof(float), 64));
    f.mutable_keys()->resize(slot_keys[slot] * sizeof(int64_t));
    f.mutable_gradients()->resize(slot_keys[slot] * dim * sizeof(float));
    slot_key_data[slot] = reinterpret_cast<int64_t*>(f.mutable_keys()->data());
    slot_grad_data[slot] = reinterpret_cast<float*>(f.mutable_gradients()->data());
  }
  slot_key_data[unbacked] = unbacked_keys.data();
  slot_grad_data[unbacked] = unbacked_grads.data();
  for_each_block([&](int64_t b) {
    int64_t* next = at.data() + b * num_buckets;
    const size_t row_bytes = dim * sizeof(float);
    for (int64_t i = block_begin(b); i < block_begin(b + 1); ++i) {
      const uint32_t bucket = bucket_of[i];
      const int slot = static_cast<int>(bucket % num_slots);
      const int64_t to = next[bucket]++;
      slot_key_data[slot][to] = keys[i];
      std::memcpy(slot_grad_data[slot] + to * dim, grads + i * dim, row_bytes);
    }
  });
  std::vector<int> stripes;
  for (int s = 0; s < kStripes; ++s) {
    for (int slot = 0; slot < num_slots; ++slot) {
      if (bucket_count[s * num_slots + slot] > 0) {
        stripes.push_back(s);
        break;
      }
    }
  }
  // Each stripe's part is applied and numbered under the stripe's order lock (on the pool's
  // threads, as an unreplicated push's stripes are): the numbers of its groups, by bucket.
  std::vector<int64_t> sequence(num_buckets, 0);
  std::vector<absl::Status> status(stripes.size());
  const auto apply = [&](int64_t index) {
    const int s = stripes[index];
    TableOrder::Stripe& stripe = order.stripes[s];
    absl::MutexLock lock(&stripe.mu);
    for (int slot = 0; slot < num_slots; ++slot) {
      const int bucket = s * num_slots + slot;
      const int64_t m = bucket_count[bucket];
      if (m == 0) continue;
      const int64_t begin = bucket_start[bucket];
      status[index] = table.ApplyPush(slot_key_data[slot] + begin, m,
                                      slot_grad_data[slot] + begin * dim, nullptr, -1,
                                      /*sample_hot_keys=*/false);
      if (!status[index].ok()) return;
    }
    for (int slot = 0; slot < unbacked; ++slot) {
      const int bucket = s * num_slots + slot;
      // (Not for a task lost, until a rebuild copies the stripe for it: number 0, not sent.)
      if (bucket_count[bucket] > 0 && (stripe.off.empty() || stripe.off.count(tasks[slot]) == 0)) {
        sequence[bucket] = ++stripe.sent[tasks[slot]];
      }
    }
  };
  if (pool != nullptr && stripes.size() > 1) {
    pool->ForEachIndex(static_cast<int64_t>(stripes.size()), apply);
  } else {
    for (size_t i = 0; i < stripes.size(); ++i) apply(static_cast<int64_t>(i));
  }
  table.SampleHotKeys(keys, n);  // once for the push, as an unreplicated one
  for (const absl::Status& st : status) PS_RETURN_IF_ERROR(st);
  // Each backup's groups in increasing stripe order, as its buffer holds them (and as every
  // forward lists them: a backup waiting in one forward for a group of another never closes a
  // cycle). Groups not numbered (the stripe is off for the task) are left out of the buffer.
  std::vector<int64_t> generation_of(num_slots, 0);
  {
    absl::MutexLock lock(&lost_backups_mu_);
    for (int slot = 0; slot < unbacked; ++slot) {
      auto it = backup_generation_.find(tasks[slot]);
      if (it != backup_generation_.end()) generation_of[slot] = it->second;
    }
  }
  for (int slot = 0; slot < unbacked; ++slot) {
    if (slot_keys[slot] == 0) continue;
    auto it = forwards->find(tasks[slot]);
    v1::ReplicateSparseRequest& f = it->second;
    f.set_generation(generation_of[slot]);
    int64_t kept = 0;
    for (int s = 0; s < kStripes; ++s) {
      const int bucket = s * num_slots + slot;
      if (bucket_count[bucket] == 0 || sequence[bucket] == 0) continue;
      v1::SparseStripeGroup* group = f.add_groups();
      group->set_stripe(s);
      group->set_sequence(sequence[bucket]);
      group->set_count(bucket_count[bucket]);
      kept += bucket_count[bucket];
    }
    if (kept == 0) {
      forwards->erase(it);
    } else if (kept < slot_keys[slot]) {
      // Some stripes are off for the task (a rebuild under way): their keys out of the forward.
      std::string keys, grads;
      keys.reserve(std::max<size_t>(kept * sizeof(int64_t), 64));
      grads.reserve(std::max<size_t>(kept * dim * sizeof(float), 64));
      for (int s = 0; s < kStripes; ++s) {
        const int bucket = s * num_slots + slot;
        if (bucket_count[bucket] == 0 || sequence[bucket] == 0) continue;
        keys.append(f.keys(), bucket_start[bucket] * sizeof(int64_t),
                    bucket_count[bucket] * sizeof(int64_t));
        grads.append(f.gradients(), bucket_start[bucket] * dim * sizeof(float),
                     bucket_count[bucket] * dim * sizeof(float));
      }
      *f.mutable_keys() = std::move(keys);
      *f.mutable_gradients() = std::move(grads);
    }
  }
  return absl::OkStatus();
}

absl::Status ParameterStore::SendSparseNow(const SparseForwards& forwards) {
  std::vector<const std::pair<const int, v1::ReplicateSparseRequest>*> to_send;
  {
    absl::MutexLock lock(&lost_backups_mu_);
    for (const auto& entry : forwards) {
      // A backup that died: its rows have no backup now. Nor is a forward made for it sent to
      // the task's next backup (a rebuild's copies hold what it carried).
      if (lost_table_backups_.count(entry.first) > 0) continue;
      auto it = backup_generation_.find(entry.first);
      if (entry.second.generation() != (it == backup_generation_.end() ? 0 : it->second)) continue;
      to_send.push_back(&entry);
    }
  }
  std::vector<absl::Status> sent(to_send.size());
  std::vector<std::thread> others;
  for (size_t i = 1; i < to_send.size(); ++i) {
    others.emplace_back([&, i] {
      sent[i] = options_.forwarder->ForwardSparse(to_send[i]->first, to_send[i]->second);
    });
  }
  if (!to_send.empty()) {
    sent[0] = options_.forwarder->ForwardSparse(to_send[0]->first, to_send[0]->second);
  }
  for (std::thread& t : others) t.join();
  for (const absl::Status& s : sent) PS_RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

bool ParameterStore::Owes(const v1::RequestId& id) const {
  absl::MutexLock lock(&owed_mu_);
  for (const OwedForwards& o : owed_) {
    if (o.id.client() == id.client() && o.id.seq() == id.seq()) return true;
  }
  return resending_.count({id.client(), id.seq()}) > 0;
}

namespace {

struct GroupReady {
  const int64_t* applied;
  int64_t sequence;
};
bool GroupIsNext(GroupReady* g) { return *g->applied >= g->sequence - 1; }

}  // namespace

absl::Status ParameterStore::ApplyReplicatedSparse(const v1::ReplicateSparseRequest& request,
                                                   v1::ReplicateSparseResponse* response) {
  PS_ASSIGN_OR_RETURN(Table t, FindTable(request.table()));
  const int64_t dim = t.table->dim();
  if (request.keys().size() % sizeof(int64_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a replicated push of table ", request.table(),
                                                   " has ", request.keys().size(),
                                                   " bytes of keys; expected 8 per key"));
  }
  const int64_t n = static_cast<int64_t>(request.keys().size() / sizeof(int64_t));
  int64_t counted = 0;
  for (const v1::SparseStripeGroup& g : request.groups()) {
    if (g.stripe() < 0 || g.stripe() >= EmbeddingTable::kNumStripes || g.count() < 0 ||
        g.sequence() < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a replicated push of table ", request.table(), " has a group of stripe ", g.stripe(),
          ", number ", g.sequence(), " and ", g.count(), " keys; expected a stripe 0 to ",
          EmbeddingTable::kNumStripes - 1, ", a number >= 1 and a count >= 0"));
    }
    counted += g.count();
  }
  if (counted != n || static_cast<int64_t>(request.gradients().size()) !=
                          n * dim * static_cast<int64_t>(sizeof(float))) {
    return absl::InvalidArgumentError(absl::StrCat("a replicated push of table ", request.table(),
                                                   " has ", n, " keys, groups of ", counted,
                                                   " and ", request.gradients().size(),
                                                   " gradient bytes; expected as many keys as the "
                                                   "groups count and ",
                                                   n * dim * 4, " bytes (dim ", dim, ", float32)"));
  }
  // The request's bytes are used where they lie when aligned (a forward read off the data plane
  // always is), copied otherwise.
  const int64_t* keys = reinterpret_cast<const int64_t*>(request.keys().data());
  const float* grads = reinterpret_cast<const float*>(request.gradients().data());
  std::vector<int64_t> key_copy;
  std::vector<float> grad_copy;
  if (reinterpret_cast<uintptr_t>(keys) % alignof(int64_t) != 0) {
    key_copy.resize(n);
    std::memcpy(key_copy.data(), request.keys().data(), request.keys().size());
    keys = key_copy.data();
  }
  if (reinterpret_cast<uintptr_t>(grads) % alignof(float) != 0) {
    grad_copy.resize(n * dim);
    std::memcpy(grad_copy.data(), request.gradients().data(), request.gradients().size());
    grads = grad_copy.data();
  }
  const SparseWork work(this);
  // The gradients as the primary applied them (it checked them against its --nan_policy).
  PS_RETURN_IF_ERROR(t.table->CheckPush(keys, n, grads, /*allow_non_finite=*/true, work.pool()));
  PushOutcome outcome;
  // (An earlier attempt's groups applied before it was released are seen by their stripes'
  // counts below: their stripes have passed them.)
  uint64_t applied_before = 0;
  if (ledger_.Begin(request.request_id(), &outcome, nullptr, &applied_before) ==
      PushLedger::Claim::kDuplicate) {
    // Recorded here already: this forward went through before, or, on a store promoted since
    // it was sent, the worker's retry of the push was applied here. Nothing again.
    response->set_already_applied(request.groups_size());
    return absl::OkStatus();
  }
  const absl::Time deadline = absl::Now() + options_.replica_wait;
  const int num_groups = request.groups_size();
  std::vector<int64_t> offsets(num_groups + 1, 0);
  for (int i = 0; i < num_groups; ++i) offsets[i + 1] = offsets[i] + request.groups(i).count();
  // Each group's fate: 0 not yet taken, 1 applied, 2 applied before (a forward sent again).
  std::vector<char> done(num_groups, 0);
  std::vector<absl::Status> failed(num_groups);
  // A group whose turn has come (its stripe applied the one before it, which nobody but this
  // forward can move past) is applied at once; `wait` waits for its turn first.
  const auto take = [&](int i, bool wait) {
    const v1::SparseStripeGroup& g = request.groups(i);
    TableOrder::Stripe& stripe = t.order->stripes[g.stripe()];
    absl::MutexLock lock(&stripe.mu);
    GroupReady ready{&stripe.applied, g.sequence()};
    if (!GroupIsNext(&ready)) {
      if (!wait) return;
      if (!stripe.mu.AwaitWithDeadline(absl::Condition(&GroupIsNext, &ready), deadline)) {
        failed[i] = absl::DeadlineExceededError(
            absl::StrCat("waited ", absl::FormatDuration(options_.replica_wait), " for group ",
                         g.sequence() - 1, " of stripe ", g.stripe(), " of backup table ",
                         request.table(), " (it has applied ", stripe.applied, ")"));
        return;
      }
    }
    if (stripe.applied >= g.sequence()) {
      done[i] = 2;
      return;
    }
    failed[i] =
        t.table->ApplyPush(keys + offsets[i], g.count(), grads + offsets[i] * dim, nullptr, -1,
                           /*sample_hot_keys=*/false);
    if (!failed[i].ok()) return;
    stripe.applied = g.sequence();
    done[i] = 1;
  };
  // First every group whose turn has come, on the apply pool's threads (a single worker's
  // pushes: all of them); then the rest one by one in the forward's order, waiting for each
  // one's turn. Groups are in increasing stripe order and those of the first pass wait for
  // nothing, so forwards waiting for each other never close a cycle.
  if (work.pool() != nullptr && num_groups > 1) {
    work.pool()->ForEachIndex(num_groups, [&](int64_t i) { take(static_cast<int>(i), false); });
  } else {
    for (int i = 0; i < num_groups; ++i) take(i, false);
  }
  absl::Status status;
  for (int i = 0; i < num_groups && status.ok(); ++i) {
    if (done[i] == 0 && failed[i].ok()) take(i, true);
    status = failed[i];
  }
  t.table->SampleHotKeys(keys, n);
  int applied = 0, already = 0;
  for (char d : done) {
    applied += d == 1;
    already += d == 2;
  }
  if (applied > 0) {
    Touch(*t.counters, /*push=*/true, static_cast<int64_t>(request.gradients().size()));
  }
  if (!status.ok()) {
    // Some groups may have been applied (their turn had come) and others not (their turn never
    // came: the primary died before sending a group before them). The stripes applied stay in
    // the ledger, so that the worker's retry of the push, should this store be promoted, or
    // the forward sent again, applies only the rest.
    uint64_t applied_stripes = applied_before;
    for (int i = 0; i < num_groups; ++i) {
      if (done[i] != 0) applied_stripes |= uint64_t{1} << request.groups(i).stripe();
    }
    ledger_.Release(request.request_id(), applied_stripes);
    return status;
  }
  outcome.accepted = request.accepted_rows();
  ledger_.Record(request.request_id(), outcome);
  response->set_applied(applied);
  response->set_already_applied(already);
  return absl::OkStatus();
}

absl::StatusOr<std::string> ParameterStore::CheckpointPathOf(const std::string& name,
                                                             const std::string& legacy_path,
                                                             absl::string_view method) const {
  if (!options_.checkpoint_dir.empty()) return ResolveCheckpoint(options_.checkpoint_dir, name);
  if (options_.require_checkpoint_dir) {
    return absl::FailedPreconditionError(
        absl::StrCat(method,
                     ": this ps task has no --checkpoint_dir (give it the chief's shared "
                     "checkpoint directory); with TLS a peer's path is never used"));
  }
  if (legacy_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(method, ": no checkpoint_path"));
  }
  return legacy_path;
}

ShardSet ParameterStore::Shards() const {
  ShardSet set;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [key, shard] : dense_) set.dense.push_back(shard);
  for (const auto& [name, t] : tables_) set.tables.push_back({name, t.table});
  return set;
}

absl::Status ParameterStore::Save(const v1::SaveShardsRequest& request,
                                  v1::SaveShardsResponse* response,
                                  const std::vector<AdoptedStore>& adopted) {
  if (request.phase() == v1::SAVE_PREPARE) {
    PS_RETURN_IF_ERROR(Fence(request.chief_epoch(), "SaveShards"));
    {
      absl::MutexLock lock(&save_mu_);
      prepared_.clear();  // an earlier one's memory goes first
    }
    PreparedCut prepared = PrepareCut(Shards());  // with nothing held: pushes go on
    absl::MutexLock lock(&save_mu_);
    prepared_ = std::move(prepared);
    return absl::OkStatus();
  }
  PS_ASSIGN_OR_RETURN(
      const std::string checkpoint_path,
      CheckpointPathOf(request.checkpoint(), request.checkpoint_path(), "SaveShards"));
  PS_RETURN_IF_ERROR(CheckNotCommitted(checkpoint_path));
  if (request.ps_index() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SaveShards: ps_index ", request.ps_index(), " is negative"));
  }
  PS_RETURN_IF_ERROR(Fence(request.chief_epoch(), "SaveShards"));
  absl::MutexLock lock(&save_mu_);
  if (request.phase() == v1::SAVE_AWAIT) {
    if (save_.path != checkpoint_path) {
      return absl::FailedPreconditionError(
          absl::StrCat("SaveShards: no save of ", checkpoint_path, " was cut on this ps task",
                       save_.path.empty() ? "" : absl::StrCat(" (the last was ", save_.path, ")"),
                       "; it must be cut again (SAVE_CUT)"));
    }
    save_mu_.Await(absl::Condition(&save_.done));
    PS_RETURN_IF_ERROR(save_.status);
    *response = save_.response;
    return absl::OkStatus();
  }
  CutOptions cut_options;
  cut_options.delta = !request.delta_base().empty();
  cut_options.track_changes = request.track_changes();
  if (cut_options.delta && request.delta_base() != last_cut_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "SaveShards: an incremental checkpoint on ", request.delta_base(),
        ", but this ps task's last cut ",
        last_cut_.empty() ? "did not record changes (none since it started or was restored)"
                          : absl::StrCat("was ", last_cut_),
        ": this checkpoint must be full"));
  }
  // One save is written at a time. A second cut of the same checkpoint (a retry) fails in
  // the write, which finds its part there already: never two writers of one part.
  JoinBackgroundSaveLocked();
  // The checkpoint holds every complete step (the workers are held at a step boundary).
  SettleAll();
  ShardSet shards = Shards();
  // The adopted stores' table parts first, each cut on its own (an incremental cut they cannot
  // make fails here, before anything of this store is marked), to be written to a part of
  // their own: their tables have the names of this store's.
  std::vector<std::pair<int32_t, ShardCut>> adopted_cuts;  // (part index, cut)
  for (const AdoptedStore& a : adopted) {
    a.store->SettleAll();
    ShardSet tables;
    tables.tables = a.store->Shards().tables;
    if (tables.tables.empty()) continue;
    if (request.num_ps() <= 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "SaveShards: this ps task serves table parts of ps:", a.primary,
          " since a failover, and the request does not say how many ps tasks the cluster has "
          "(num_ps), which names their part"));
    }
    PS_ASSIGN_OR_RETURN(ShardCut c,
                        CutShardSet(tables, &a.store->apply_barrier_, nullptr, cut_options));
    adopted_cuts.emplace_back(request.num_ps() * (1 + a.primary) + request.ps_index(),
                              std::move(c));
  }
  // The adopted stores' dense pushes are held too (theirs before this store's, the only place
  // that holds two barriers), so the cut is one moment of every dense shard this task serves.
  std::vector<std::unique_ptr<absl::MutexLock>> adopted_held;
  for (const AdoptedStore& a : adopted) {
    const ShardSet theirs = a.store->Shards();
    shards.dense.insert(shards.dense.end(), theirs.dense.begin(), theirs.dense.end());
    adopted_held.push_back(std::make_unique<absl::MutexLock>(&a.store->apply_barrier_));
  }
  absl::StatusOr<ShardCut> cut_or = CutShardSet(shards, &apply_barrier_, &prepared_, cut_options);
  adopted_held.clear();
  PS_ASSIGN_OR_RETURN(ShardCut cut, std::move(cut_or));
  prepared_.clear();  // what the cut did not use (a table dropped since) goes now
  // The tables record their changes from this cut on only when asked to.
  last_cut_ = cut_options.track_changes ? std::filesystem::path(checkpoint_path).filename().string()
                                        : std::string();
  // This task's part, then the adopted table parts, each a part of its own.
  auto write = [this, checkpoint_path, ps_index = request.ps_index()](
                   ShardCut own, std::vector<std::pair<int32_t, ShardCut>> others,
                   v1::SaveShardsResponse* written) -> absl::Status {
    PS_RETURN_IF_ERROR(WriteShardCut(std::move(own), checkpoint_path, ps_index,
                                     options_.crash_points, written, &apply_pool_));
    for (auto& [index, other] : others) {
      v1::SaveShardsResponse part;
      PS_RETURN_IF_ERROR(
          WriteShardCut(std::move(other), checkpoint_path, index, nullptr, &part, &apply_pool_));
      written->mutable_shards()->MergeFrom(part.shards());
      written->set_bytes(written->bytes() + part.bytes());
      written->set_micros(written->micros() + part.micros());
      written->set_cut_micros(written->cut_micros() + part.cut_micros());
    }
    return absl::OkStatus();
  };
  if (request.phase() != v1::SAVE_CUT) {
    return write(std::move(cut), std::move(adopted_cuts), response);
  }
  response->set_cut_micros(absl::ToInt64Microseconds(cut.held));
  save_ = BackgroundSave{checkpoint_path, false, absl::OkStatus(), {}};
  save_thread_ = std::thread([this, write, cut = std::move(cut),
                              adopted_cuts = std::move(adopted_cuts), checkpoint_path]() mutable {
    v1::SaveShardsResponse written;
    absl::Status s = write(std::move(cut), std::move(adopted_cuts), &written);
    if (!s.ok()) LOG(WARNING) << "the save of " << checkpoint_path << " failed: " << s;
    absl::MutexLock lock(&save_mu_);
    save_.done = true;
    save_.status = std::move(s);
    save_.response = std::move(written);
  });
  return absl::OkStatus();
}

void ParameterStore::JoinBackgroundSaveLocked() {
  if (!save_thread_.joinable()) return;
  // The thread's last act is to set `done` under save_mu_; it needs nothing more once set.
  save_mu_.Await(absl::Condition(&save_.done));
  save_thread_.join();
}

ParameterStore::~ParameterStore() {
  absl::MutexLock lock(&save_mu_);
  JoinBackgroundSaveLocked();
}

absl::Status ParameterStore::Restore(const v1::RestoreShardsRequest& request,
                                     v1::RestoreShardsResponse* response) {
  // The checkpoints it builds on (an incremental one), then itself.
  std::vector<RestoreLink> chain;
  for (const v1::CheckpointLink& link : request.chain()) {
    PS_ASSIGN_OR_RETURN(
        std::string path,
        CheckpointPathOf(link.checkpoint(), link.checkpoint_path(), "RestoreShards"));
    chain.push_back(RestoreLink{std::move(path), &link.saved()});
  }
  PS_ASSIGN_OR_RETURN(
      std::string checkpoint_path,
      CheckpointPathOf(request.checkpoint(), request.checkpoint_path(), "RestoreShards"));
  chain.push_back(RestoreLink{std::move(checkpoint_path), &request.saved()});
  for (const RestoreLink& link : chain) {
    for (const v1::SavedShard& saved : *link.saved) {
      PS_RETURN_IF_ERROR(CheckShardFileName(saved.file()));
    }
  }
  PS_RETURN_IF_ERROR(Fence(request.chief_epoch(), "RestoreShards"));
  {
    // The tables' changes are no longer those since the last cut: the next checkpoint is full.
    absl::MutexLock lock(&save_mu_);
    last_cut_.clear();
  }
  PS_ASSIGN_OR_RETURN(const int32_t restored, RestoreShardSet(Shards(), &apply_barrier_, chain,
                                                              request.step(), &apply_pool_));
  {
    absl::MutexLock lock(&mu_);
    for (auto& [key, acc] : accumulators_) acc->SetStep(request.step());
    for (auto& [name, t] : tables_) {
      if (t.accumulator) t.accumulator->SetStep(request.step());
    }
    holding_for_restore_ = false;
  }
  response->set_step(request.step());
  response->set_shards(restored);
  return absl::OkStatus();
}

v1::ListShardsResponse ParameterStore::ListShards() const {
  v1::ListShardsResponse out;
  {
    absl::MutexLock lock(&dropped_mu_);
    for (const auto& [w, n] : dropped_by_worker_) (*out.mutable_dropped_by_worker())[w] = n;
  }
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [key, shard] : dense_) {
    v1::ShardStats* stats = out.add_shards();
    FillDenseStats(*shard, stats);
    // SYNC: a complete step counts as applied, also while its update is pending.
    auto acc = accumulators_.find(key);
    if (acc != accumulators_.end()) {
      stats->set_applied_step(std::max(stats->applied_step(), acc->second->step()));
    }
  }
  for (const auto& [name, t] : tables_) {
    v1::ShardStats* stats = out.add_shards();
    FillTableStats(name, *t.table, *t.counters, stats);
    if (t.order == nullptr) continue;
    int64_t applied = 0;
    for (TableOrder::Stripe& stripe : t.order->stripes) {
      absl::MutexLock lock(&stripe.mu);
      applied += stripe.applied;
      for (const auto& [backup, sent] : stripe.sent) {
        (*stats->mutable_table_groups_sent())[backup] += sent;
      }
    }
    stats->set_table_groups_applied(applied);
  }
  return out;
}

absl::StatusOr<v1::InspectShardResponse> ParameterStore::Inspect(
    const v1::InspectShardRequest& request) {
  v1::InspectShardResponse out;
  const v1::ShardRef& ref = request.shard();
  if (ref.partition() < 0) {
    PS_ASSIGN_OR_RETURN(Table t, FindTable(ref.variable()));
    SettleTable(t, -1);
    FillTableStats(ref.variable(), *t.table, *t.counters, out.mutable_shard());
    t.table->ComputeValueStats(out.mutable_values());
    std::vector<int64_t> found, missing;
    std::vector<float> rows;
    t.table->Lookup(request.keys().data(), request.keys_size(), &found, &rows, &missing);
    out.mutable_found_keys()->Add(found.begin(), found.end());
    out.mutable_missing_keys()->Add(missing.begin(), missing.end());
    out.set_found_rows(reinterpret_cast<const char*>(rows.data()), rows.size() * sizeof(float));
    return out;
  }
  google::protobuf::RepeatedPtrField<v1::ShardRef> refs;
  *refs.Add() = ref;
  PS_ASSIGN_OR_RETURN(std::vector<std::shared_ptr<DenseShard>> shards, FindDense(refs));
  SettleDense(shards, -1);
  const DenseShard& shard = *shards[0];
  const int64_t n = shard.num_elements();
  const int64_t offset = request.values_offset();
  if (offset < 0 || request.values_count() < 0 || offset > n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values offset ", offset, " and count ", request.values_count(), " are outside variable ",
        DenseName(shard.name(), shard.partition()), " of ", n, " elements"));
  }
  FillDenseStats(shard, out.mutable_shard());
  const int64_t count = std::min(request.values_count(), n - offset);
  shard.WithValues([&](const float* values, int64_t) {
    ComputeFloatStats(values, n, out.mutable_values());
    out.set_slice(reinterpret_cast<const char*>(values + offset), count * sizeof(float));
  });
  return out;
}

ParameterStore::ApplyTotals ParameterStore::apply_totals() const {
  ApplyTotals t;
  t.dense_applies = apply_totals_[0].load(std::memory_order_relaxed);
  t.dense_nanos = apply_totals_[1].load(std::memory_order_relaxed);
  t.sparse_applies = apply_totals_[2].load(std::memory_order_relaxed);
  t.sparse_nanos = apply_totals_[3].load(std::memory_order_relaxed);
  return t;
}

int64_t ParameterStore::total_pushes() const {
  absl::ReaderMutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [k, s] : dense_) n += s->counters().pushes.load(std::memory_order_relaxed);
  for (const auto& [k, t] : tables_) n += t.counters->pushes.load(std::memory_order_relaxed);
  return n;
}

int64_t ParameterStore::total_pulls() const {
  absl::ReaderMutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [k, s] : dense_) n += s->counters().pulls.load(std::memory_order_relaxed);
  for (const auto& [k, t] : tables_) n += t.counters->pulls.load(std::memory_order_relaxed);
  return n;
}

}  // namespace pscluster
