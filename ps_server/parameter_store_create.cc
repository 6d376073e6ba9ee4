// ParameterStore::CreateShards and its steps: the request checked on its own and against the
// memory budget, the shards built outside the lock, then those already held found and the
// others inserted with their sync accumulators, all or nothing.

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "google/protobuf/stubs/common.h"
#include "google/protobuf/util/message_differencer.h"
#include "ps_server/parameter_store.h"
#include "sharding/partitioner.h"

namespace pscluster {

namespace {

// Names go into checkpoint manifests, which are JSON: they must be UTF-8, or the manifest
// would name another shard than the one written.
absl::Status CheckName(const char* what, const std::string& name) {
  // protobuf's own check, as its parser applies to string fields (the gRPC path).
  if (name.size() <= static_cast<size_t>(std::numeric_limits<int>::max()) &&
      google::protobuf::internal::IsStructurallyValidUTF8(name.data(),
                                                          static_cast<int>(name.size()))) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, " name \"", absl::CHexEscape(name),
                                                 "\" is not valid UTF-8; names must be UTF-8"));
}

// A CreateShards request on its own: the sync settings and every name.
absl::Status CheckCreateRequest(const v1::CreateShardsRequest& request) {
  if (request.sync().mode() == v1::SYNC && request.sync().replicas_to_aggregate() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("SYNC mode needs replicas_to_aggregate >= 1, got ",
                     request.sync().replicas_to_aggregate()));
  }
  for (const v1::DenseShardSpec& spec : request.dense()) {
    PS_RETURN_IF_ERROR(CheckName("variable", spec.variable().name()));
    if (request.replication() >= 2 && spec.partition().backup_ps_task() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("variable ", DenseName(spec.variable().name(), spec.partition().partition()),
                       ": replication ", request.replication(),
                       " needs a backup_ps_task >= 0, got ", spec.partition().backup_ps_task()));
    }
  }
  for (const v1::TableShardSpec& spec : request.tables()) {
    PS_RETURN_IF_ERROR(CheckName("table", spec.table().name()));
    if (spec.virtual_shard_backups_size() != 0 &&
        spec.virtual_shard_backups_size() != spec.virtual_shards_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", spec.table().name(), ": ", spec.virtual_shard_backups_size(),
                       " virtual_shard_backups for ", spec.virtual_shards_size(),
                       " virtual shards; expected one backup task per shard, or none"));
    }
    for (int32_t backup : spec.virtual_shard_backups()) {
      if (backup < 0) {
        return absl::InvalidArgumentError(absl::StrCat("table ", spec.table().name(),
                                                       ": a virtual shard's backup task is ",
                                                       backup, "; expected a ps task index"));
      }
    }
  }
  return absl::OkStatus();
}

// Whether a dense shard held with `held` is the one `requested` asks for. Where its backup is
// (DensePartition.backup_ps_task) is not part of a shard's identity: a placement that adds or
// moves backups asks for the same shards.
bool SameDenseShard(const v1::DenseShardSpec& held, const v1::DenseShardSpec& requested) {
  google::protobuf::util::MessageDifferencer same;
  same.IgnoreField(v1::DensePartition::descriptor()->FindFieldByName("backup_ps_task"));
  return same.Compare(held, requested);
}

}  // namespace

absl::Status ParameterStore::CheckMemoryBudget(const v1::CreateShardsRequest& request) const {
  // Sizes first: a request whose shards do not fit the budget is refused before anything is
  // allocated (initializing a huge shard would itself exhaust the memory).
  std::vector<int64_t> dense_bytes, table_bytes;
  for (const v1::DenseShardSpec& spec : request.dense()) {
    PS_ASSIGN_OR_RETURN(const int64_t bytes, DenseShard::BytesFor(spec));
    dense_bytes.push_back(bytes);
  }
  for (const v1::TableShardSpec& spec : request.tables()) {
    // A vocabulary table's rows are reserved up front; a hashed table grows (max_table_rows).
    PS_ASSIGN_OR_RETURN(const int64_t bytes,
                        EmbeddingTable::ReservedBytes(spec.table(), spec.virtual_shards_size(),
                                                      spec.num_virtual_shards()));
    table_bytes.push_back(bytes);
  }
  if (options_.memory_budget_bytes <= 0) return absl::OkStatus();
  int64_t needed = 0, held = 0;
  {
    absl::ReaderMutexLock lock(&mu_);
    held = budgeted_bytes_;
    for (int i = 0; i < request.dense_size(); ++i) {
      const v1::DenseShardSpec& spec = request.dense(i);
      if (dense_.count({spec.variable().name(), spec.partition().partition()}) == 0) {
        needed += dense_bytes[i];
      }
    }
    for (int i = 0; i < request.tables_size(); ++i) {
      if (tables_.count(request.tables(i).table().name()) == 0) needed += table_bytes[i];
    }
  }
  const int64_t elsewhere = BytesElsewhere();
  held += elsewhere;
  if (needed > options_.memory_budget_bytes - held) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the shards requested need ", needed,
        " bytes (values and optimizer slots; a vocabulary table's rows) but this ps "
        "task's memory budget is ",
        options_.memory_budget_bytes, " bytes, of which ", held, " are in use",
        elsewhere > 0 ? absl::StrCat(" (", elsewhere,
                                     " of them in its other stores: its own shards and the "
                                     "backups it holds)")
                      : "",
        " (ps_server --memory_budget_mb); place the model on more ps tasks"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ParameterStore::NewShards> ParameterStore::BuildShards(
    const v1::CreateShardsRequest& request) {
  NewShards built;
  for (const v1::DenseShardSpec& spec : request.dense()) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<DenseShard> shard, DenseShard::Create(spec));
    built.dense.push_back(std::move(shard));
  }
  for (const v1::TableShardSpec& spec : request.tables()) {
    std::vector<int32_t> owned(spec.virtual_shards().begin(), spec.virtual_shards().end());
    PS_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingTable> table,
                        EmbeddingTable::Create(spec.table(), owned, spec.num_virtual_shards()));
    built.tables.push_back(std::move(table));
    auto order = std::make_shared<TableOrder>();
    order->num_virtual_shards = spec.num_virtual_shards();
    order->vocabulary_size = spec.table().vocabulary_size();
    built.table_orders.push_back(std::move(order));
  }
  built.present_dense.assign(built.dense.size(), false);
  built.present_table.assign(built.tables.size(), false);
  return built;
}

absl::Status ParameterStore::FindPresentLocked(NewShards& shards) const {
  for (size_t i = 0; i < shards.dense.size(); ++i) {
    const DenseShard& mine = *shards.dense[i];
    auto it = dense_.find({mine.name(), mine.partition()});
    if (it == dense_.end()) continue;
    const DenseShard& held = *it->second;
    if (!SameDenseShard(held.spec(), mine.spec())) {
      return absl::AlreadyExistsError(absl::StrCat(
          "variable ", DenseName(mine.name(), mine.partition()), " already exists with shape ",
          ShapeString(held.spec().variable().shape()), ", rows [",
          held.spec().partition().row_begin(), ", ", held.spec().partition().row_end(),
          ") and optimizer ", held.optimizer().name(), "; requested shape ",
          ShapeString(mine.spec().variable().shape()), ", rows [",
          mine.spec().partition().row_begin(), ", ", mine.spec().partition().row_end(),
          ") and optimizer ", mine.optimizer().name()));
    }
    shards.present_dense[i] = true;
  }
  for (size_t i = 0; i < shards.tables.size(); ++i) {
    const EmbeddingTable& mine = *shards.tables[i];
    auto it = tables_.find(mine.spec().name());
    if (it == tables_.end()) continue;
    const EmbeddingTable& held = *it->second.table;
    if (!google::protobuf::util::MessageDifferencer::Equals(held.spec(), mine.spec())) {
      return absl::AlreadyExistsError(
          absl::StrCat("table ", mine.spec().name(), " already exists with dim ", held.dim(),
                       " and optimizer ", held.optimizer().name(), "; requested dim ", mine.dim(),
                       " and optimizer ", mine.optimizer().name()));
    }
    shards.present_table[i] = true;
  }
  return absl::OkStatus();
}

int ParameterStore::InsertLocked(NewShards& shards, int64_t start_step) {
  const bool sync = sync_.mode() == v1::SYNC;
  int created = 0;
  for (size_t i = 0; i < shards.dense.size(); ++i) {
    if (shards.present_dense[i]) continue;
    std::unique_ptr<DenseShard>& shard = shards.dense[i];
    DenseKey key{shard->name(), shard->partition()};
    if (sync) {
      auto acc =
          std::make_shared<DenseAccumulator>(shard->num_elements(), sync_.replicas_to_aggregate());
      acc->SetStep(start_step);
      accumulators_[key] = std::move(acc);
    }
    budgeted_bytes_ += shard->bytes();
    dense_[key] = std::move(shard);
    ++created;
  }
  for (size_t i = 0; i < shards.tables.size(); ++i) {
    if (shards.present_table[i]) continue;
    std::unique_ptr<EmbeddingTable>& table = shards.tables[i];
    const std::string name = table->spec().name();
    std::shared_ptr<SparseAccumulator> acc;
    if (sync) {
      acc = std::make_shared<SparseAccumulator>(table->dim(), sync_.replicas_to_aggregate());
      acc->SetStep(start_step);
    }
    budgeted_bytes_ += table->reserved_bytes();
    tables_[name] =
        Table{std::move(table), std::make_shared<ShardCounters>(), acc, shards.table_orders[i]};
    ++created;
  }
  return created;
}

absl::Status ParameterStore::CreateShards(const v1::CreateShardsRequest& request,
                                          v1::CreateShardsResponse* response) {
  MaybeCrash(options_.crash_points, kCrashPsCreateShards);
  PS_RETURN_IF_ERROR(Fence(request.chief_epoch(), "CreateShards"));
  PS_RETURN_IF_ERROR(CheckCreateRequest(request));
  if (!request.backups().empty()) {
    return absl::InvalidArgumentError(
        "this store holds no backups: backup shards are created by ps_server's service "
        "(ps_server/backup_stores.h), not by an in-process store");
  }
  PS_RETURN_IF_ERROR(CheckMemoryBudget(request));
  // Build everything first, outside the lock (initializing a large shard takes time), then
  // check for conflicts and insert under the lock: all or nothing.
  PS_ASSIGN_OR_RETURN(NewShards shards, BuildShards(request));

  // Local steps are the workers' concern: a ps applies deltas in any async mode.
  v1::SyncOptions sync = request.sync();
  sync.clear_local_steps();
  absl::MutexLock lock(&mu_);
  if (sync_set_ && !google::protobuf::util::MessageDifferencer::Equals(sync_, sync)) {
    return absl::AlreadyExistsError(absl::StrCat(
        "this ps task's shards were created with update mode ", v1::UpdateMode_Name(sync_.mode()),
        " (replicas_to_aggregate ", sync_.replicas_to_aggregate(), "); requested ",
        v1::UpdateMode_Name(request.sync().mode()), " (replicas_to_aggregate ",
        request.sync().replicas_to_aggregate(), ")"));
  }
  sync_ = sync;
  sync_set_ = true;
  deltas_allowed_ = request.sync().local_steps() > 1;
  // From now on its async dense pushes are numbered as they are applied (NoteApplied), for the
  // copies of its shards for new backups.
  if (request.replication() >= 2) replicated_.store(true, std::memory_order_relaxed);
  PS_RETURN_IF_ERROR(FindPresentLocked(shards));
  const int created = InsertLocked(shards, request.start_step());
  // Where each dense shard's updates are forwarded: as this request says, for shards created
  // now and those already held alike (a placement that adds or moves backups).
  for (const v1::DenseShardSpec& spec : request.dense()) {
    auto it = dense_.find({spec.variable().name(), spec.partition().partition()});
    if (it == dense_.end()) continue;
    const int backup = request.replication() >= 2 ? spec.partition().backup_ps_task() : -1;
    int64_t generation = 0;
    if (backup >= 0) {
      // The task's backups now (a task given backups again is a new generation:
      // CopyForNewBackup), or its forwards would be taken for the lost one's.
      absl::MutexLock generations(&lost_backups_mu_);
      generation = backup_generation_[backup];
    }
    it->second->set_backup_ps_task(backup, generation);
  }
  // And each table's rows, by virtual shard.
  for (const v1::TableShardSpec& spec : request.tables()) {
    auto it = tables_.find(spec.table().name());
    if (it == tables_.end() || it->second.order == nullptr) continue;
    std::shared_ptr<std::vector<int32_t>> backups;
    if (request.replication() >= 2 && spec.virtual_shard_backups_size() > 0) {
      backups = std::make_shared<std::vector<int32_t>>(it->second.order->num_virtual_shards, -1);
      for (int i = 0; i < spec.virtual_shards_size(); ++i) {
        const int32_t v = spec.virtual_shards(i);
        if (v >= 0 && v < static_cast<int32_t>(backups->size())) {
          (*backups)[v] = spec.virtual_shard_backups(i);
        }
      }
    }
    it->second.order->SetBackups(std::move(backups));
  }
  const int present = static_cast<int>(shards.dense.size() + shards.tables.size()) - created;
  if (!request.hold_until_restored()) {
    holding_for_restore_ = false;
  } else if (created > 0) {
    holding_for_restore_ = true;
  }
  response->set_created(created);
  response->set_already_present(present);
  response->set_awaiting_restore(holding_for_restore_);
  return absl::OkStatus();
}

}  // namespace pscluster
