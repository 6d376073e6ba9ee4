#include "ps_server/parameter_store.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "storage/checkpoint.h"
#include "google/protobuf/util/message_differencer.h"

namespace pscluster {
namespace {

std::string DenseName(const std::string& variable, int32_t partition) {
  return absl::StrCat(variable, "/", partition);
}

// How a complete sync step's mean reaches its shard or table.
DenseAccumulator::ApplyFn ApplyTo(DenseShard* shard) {
  return [shard](const float* mean) { shard->Apply(mean); };
}

SparseAccumulator::ApplyFn ApplyTo(EmbeddingTable* table) {
  return [table](const int64_t* keys, int64_t n, const float* mean) {
    // Keys this task owns (checked on push) and finite means: cannot fail.
    table->Push(keys, n, mean, /*allow_non_finite=*/true).IgnoreError();
  };
}

void Touch(ShardCounters& c, bool push, int64_t bytes) {
  if (push) {
    c.pushes.fetch_add(1, std::memory_order_relaxed);
    c.bytes_in.fetch_add(bytes, std::memory_order_relaxed);
    c.last_update_unix_micros.store(absl::ToUnixMicros(absl::Now()), std::memory_order_relaxed);
  } else {
    c.pulls.fetch_add(1, std::memory_order_relaxed);
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
  counters.FillStats(s);
  for (v1::HotKey& h : table.HotKeys(10)) *s->add_hot_keys() = std::move(h);
}

}  // namespace

std::string ShapeString(const v1::TensorShape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape.dims(), ", "), "]");
}

ParameterStore::ParameterStore(const ParameterStoreOptions& options) : options_(options) {}

absl::Status ParameterStore::CreateShards(const v1::CreateShardsRequest& request,
                                          v1::CreateShardsResponse* response) {
  if (request.sync().mode() == v1::SYNC && request.sync().replicas_to_aggregate() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "SYNC mode needs replicas_to_aggregate >= 1, got ",
        request.sync().replicas_to_aggregate()));
  }

  // Build everything first, outside the lock (initializing a large shard takes time), then
  // check for conflicts and insert under the lock: all or nothing.
  std::vector<std::unique_ptr<DenseShard>> dense;
  for (const v1::DenseShardSpec& spec : request.dense()) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<DenseShard> shard, DenseShard::Create(spec));
    dense.push_back(std::move(shard));
  }
  std::vector<std::unique_ptr<EmbeddingTable>> tables;
  for (const v1::TableShardSpec& spec : request.tables()) {
    std::vector<int32_t> owned(spec.virtual_shards().begin(), spec.virtual_shards().end());
    PS_ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingTable> table,
                        EmbeddingTable::Create(spec.table(), owned, spec.num_virtual_shards()));
    tables.push_back(std::move(table));
  }

  absl::MutexLock lock(&mu_);
  if (sync_set_ && !google::protobuf::util::MessageDifferencer::Equals(sync_, request.sync())) {
    return absl::AlreadyExistsError(absl::StrCat(
        "this ps task's shards were created with update mode ", v1::UpdateMode_Name(sync_.mode()),
        " (replicas_to_aggregate ", sync_.replicas_to_aggregate(), "); requested ",
        v1::UpdateMode_Name(request.sync().mode()), " (replicas_to_aggregate ",
        request.sync().replicas_to_aggregate(), ")"));
  }
  sync_ = request.sync();
  sync_set_ = true;
  const bool sync = sync_.mode() == v1::SYNC;
  std::vector<bool> present_dense(dense.size(), false), present_table(tables.size(), false);
  for (size_t i = 0; i < dense.size(); ++i) {
    auto it = dense_.find({dense[i]->name(), dense[i]->partition()});
    if (it == dense_.end()) continue;
    if (!google::protobuf::util::MessageDifferencer::Equals(it->second->spec(), dense[i]->spec())) {
      return absl::AlreadyExistsError(absl::StrCat(
          "variable ", DenseName(dense[i]->name(), dense[i]->partition()),
          " already exists with shape ", ShapeString(it->second->spec().variable().shape()),
          ", rows [", it->second->spec().partition().row_begin(), ", ",
          it->second->spec().partition().row_end(), ") and optimizer ",
          it->second->optimizer().name(), "; requested shape ",
          ShapeString(dense[i]->spec().variable().shape()), ", rows [",
          dense[i]->spec().partition().row_begin(), ", ", dense[i]->spec().partition().row_end(),
          ") and optimizer ", dense[i]->optimizer().name()));
    }
    present_dense[i] = true;
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    auto it = tables_.find(tables[i]->spec().name());
    if (it == tables_.end()) continue;
    if (!google::protobuf::util::MessageDifferencer::Equals(it->second.table->spec(),
                                                            tables[i]->spec())) {
      return absl::AlreadyExistsError(absl::StrCat(
          "table ", tables[i]->spec().name(), " already exists with dim ", it->second.table->dim(),
          " and optimizer ", it->second.table->optimizer().name(), "; requested dim ",
          tables[i]->dim(), " and optimizer ", tables[i]->optimizer().name()));
    }
    present_table[i] = true;
  }
  int created = 0, present = 0;
  for (size_t i = 0; i < dense.size(); ++i) {
    if (present_dense[i]) {
      ++present;
      continue;
    }
    DenseKey key{dense[i]->name(), dense[i]->partition()};
    if (sync) {
      auto acc = std::make_shared<DenseAccumulator>(dense[i]->num_elements(),
                                                    sync_.replicas_to_aggregate());
      acc->SetStep(request.start_step());
      accumulators_[key] = std::move(acc);
    }
    dense_[key] = std::move(dense[i]);
    ++created;
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    if (present_table[i]) {
      ++present;
      continue;
    }
    const std::string name = tables[i]->spec().name();
    std::shared_ptr<SparseAccumulator> acc;
    if (sync) {
      acc = std::make_shared<SparseAccumulator>(tables[i]->dim(), sync_.replicas_to_aggregate());
      acc->SetStep(request.start_step());
    }
    tables_[name] = Table{std::move(tables[i]), std::make_shared<ShardCounters>(), acc};
    ++created;
  }
  if (!request.hold_until_restored()) {
    holding_for_restore_ = false;
  } else if (created > 0) {
    holding_for_restore_ = true;
  }
  response->set_created(created);
  response->set_already_present(present);
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

absl::Status ParameterStore::PushDense(const std::vector<std::shared_ptr<DenseShard>>& shards,
                                       const std::vector<std::vector<float>>& grads,
                                       int64_t wire_bytes, int64_t step, int32_t worker,
                                       v1::PushDenseResponse* response) {
  if (grads.size() != shards.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a push names ", shards.size(), " shards but carries ", grads.size(), " gradients"));
  }
  for (size_t i = 0; i < shards.size(); ++i) {
    const DenseShard& s = *shards[i];
    if (static_cast<int64_t>(grads[i].size()) != s.num_elements()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "variable ", DenseName(s.name(), s.partition()), ": gradient has ", grads[i].size(),
          " elements, expected ", s.num_elements(), " (shape ", ShapeString(s.shape()), ")"));
    }
    if (!options_.allow_non_finite) {
      const int64_t bad = FindNonFinite(grads[i].data(), s.num_elements());
      if (bad >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("variable ", DenseName(s.name(), s.partition()), ": gradient element ",
                         bad, " is ", grads[i][bad],
                         "; NaN and Inf gradients are refused (ps_server --nan_policy=allow "
                         "accepts them)"));
      }
    }
  }
  const std::vector<std::shared_ptr<DenseAccumulator>> accumulators = AccumulatorsOf(shards);
  absl::ReaderMutexLock barrier(&apply_barrier_);
  int accepted = 0, dropped = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    Touch(shards[i]->counters(), /*push=*/true, wire_bytes / static_cast<int64_t>(shards.size()));
    if (accumulators[i] == nullptr) {
      shards[i]->Apply(grads[i].data());
      ++accepted;
      continue;
    }
    switch (accumulators[i]->Add(step, worker, grads[i].data(), ApplyTo(shards[i].get()))) {
      case AccumulateOutcome::kComplete:  // pending until the next step needs it
      case AccumulateOutcome::kAccumulated:
        ++accepted;
        break;
      case AccumulateOutcome::kStale:
      case AccumulateOutcome::kDuplicate:
      case AccumulateOutcome::kAhead:
        CountDropped(worker, shards[i]->counters());
        ++dropped;
        break;
    }
  }
  response->set_accepted(accepted);
  response->set_dropped_stale(dropped);
  return absl::OkStatus();
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
      accumulators[i]->Settle(before_step, ApplyTo(shards[i].get()));
    }
  }
}

void ParameterStore::SettleTable(const Table& t, int64_t before_step) {
  if (t.accumulator == nullptr) return;
  absl::ReaderMutexLock barrier(&apply_barrier_);
  t.accumulator->Settle(before_step, ApplyTo(t.table.get()));
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

absl::Status ParameterStore::PullSparse(const std::string& table, const int64_t* keys, int64_t n,
                                        float* out, int64_t wire_bytes, int64_t step) {
  PS_ASSIGN_OR_RETURN(Table t, FindTable(table));
  SettleTable(t, step);
  PS_RETURN_IF_ERROR(t.table->Pull(keys, n, out));
  Touch(*t.counters, /*push=*/false, wire_bytes);
  return absl::OkStatus();
}

absl::Status ParameterStore::PushSparse(const std::string& table, const int64_t* keys, int64_t n,
                                        const float* grads, int64_t wire_bytes, int64_t step,
                                        int32_t worker, v1::PushSparseResponse* response) {
  PS_ASSIGN_OR_RETURN(Table t, FindTable(table));
  absl::ReaderMutexLock barrier(&apply_barrier_);
  if (t.accumulator == nullptr) {
    PS_RETURN_IF_ERROR(t.table->Push(keys, n, grads, options_.allow_non_finite));
    Touch(*t.counters, /*push=*/true, wire_bytes);
    response->set_accepted_rows(static_cast<int32_t>(n));
    return absl::OkStatus();
  }
  // Validate as an immediate push would (ownership, finiteness) before accumulating.
  for (int64_t i = 0; i < n; ++i) {
    if (!t.table->OwnsKey(keys[i])) {
      return absl::FailedPreconditionError(absl::StrCat(
          "key ", keys[i], " of table ", table, " is not held by this ps task: placement mismatch"));
    }
  }
  if (!options_.allow_non_finite) {
    const int64_t bad = FindNonFinite(grads, n * t.table->dim());
    if (bad >= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", table, ": gradient for key ", keys[bad / t.table->dim()], " has non-finite value ",
          grads[bad], "; NaN and Inf gradients are refused"));
    }
  }
  Touch(*t.counters, /*push=*/true, wire_bytes);
  switch (t.accumulator->Add(step, worker, keys, n, grads, ApplyTo(t.table.get()))) {
    case AccumulateOutcome::kComplete:  // pending until the next step needs it
    case AccumulateOutcome::kAccumulated:
      response->set_accepted_rows(static_cast<int32_t>(n));
      break;
    case AccumulateOutcome::kStale:
    case AccumulateOutcome::kDuplicate:
    case AccumulateOutcome::kAhead:
      CountDropped(worker, *t.counters);
      response->set_dropped_stale(1);
      break;
  }
  return absl::OkStatus();
}

absl::Status ParameterStore::Save(const v1::SaveShardsRequest& request,
                                  v1::SaveShardsResponse* response) {
  const absl::Time start = absl::Now();
  // The checkpoint holds every complete step (the workers are held at a step boundary).
  SettleAll();
  struct DenseCopy {
    std::shared_ptr<DenseShard> shard;
    std::vector<float> data;
    int64_t updates = 0;
  };
  struct TableCopy {
    std::shared_ptr<EmbeddingTable> table;
    std::vector<int64_t> keys, counts;
    std::vector<float> rows;
    int64_t stride = 0;
  };
  std::vector<DenseCopy> dense;
  std::vector<TableCopy> tables;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [key, shard] : dense_) dense.push_back({shard, {}, 0});
    for (const auto& [name, t] : tables_) tables.push_back({t.table, {}, {}, {}, 0});
  }
  {
    // No push is applied while the copies are taken.
    absl::MutexLock barrier(&apply_barrier_);
    for (DenseCopy& d : dense) d.shard->Snapshot(&d.data, &d.updates);
    for (TableCopy& t : tables) {
      t.stride = t.table->dim() * (1 + t.table->optimizer().num_slots());
      t.table->ForEachRow([&t](int64_t key, const float* row, int64_t count) {
        t.keys.push_back(key);
        t.counts.push_back(count);
        t.rows.insert(t.rows.end(), row, row + t.stride);
      });
    }
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWriter> writer,
                      CheckpointWriter::Open(request.checkpoint_path(), request.ps_index(),
                                             options_.crash_points));
  int64_t bytes = 0;
  for (DenseCopy& d : dense) {
    PS_ASSIGN_OR_RETURN(v1::SavedShard saved,
                        writer->WriteDense(d.shard->spec(), d.updates, d.data));
    bytes += saved.bytes();
    *response->add_shards() = std::move(saved);
  }
  for (TableCopy& t : tables) {
    PS_ASSIGN_OR_RETURN(v1::SavedShard saved,
                        writer->WriteTable(t.table->spec(), std::move(t.keys), t.rows, t.counts,
                                           t.stride));
    bytes += saved.bytes();
    *response->add_shards() = std::move(saved);
  }
  PS_RETURN_IF_ERROR(writer->Finish());
  response->set_bytes(bytes);
  response->set_micros(absl::ToInt64Microseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::Status ParameterStore::Restore(const v1::RestoreShardsRequest& request,
                                     v1::RestoreShardsResponse* response) {
  std::map<std::string, std::unique_ptr<CheckpointReader>> readers;
  auto reader_for = [&](const v1::SavedShard& saved) -> absl::StatusOr<CheckpointReader*> {
    auto& r = readers[saved.file()];
    if (!r) {
      PS_ASSIGN_OR_RETURN(r, CheckpointReader::Open(
                                 absl::StrCat(request.checkpoint_path(), "/", saved.file())));
    }
    return r.get();
  };
  std::vector<std::pair<std::shared_ptr<DenseShard>, DenseKey>> dense;
  std::vector<std::pair<std::string, Table>> tables;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [key, shard] : dense_) dense.push_back({shard, key});
    for (const auto& [name, t] : tables_) tables.push_back({name, t});
  }
  // Read and verify everything first; apply only when all of it is good.
  std::vector<std::vector<float>> new_data(dense.size());
  std::vector<int64_t> new_updates(dense.size(), 0);
  for (size_t i = 0; i < dense.size(); ++i) {
    const DenseShard& shard = *dense[i].first;
    const v1::DensePartition& mine = shard.spec().partition();
    const int64_t n = shard.num_elements();
    const int64_t rows = mine.row_end() - mine.row_begin();
    const int64_t row_elems = rows > 0 ? n / rows : 0;
    const int slots = shard.optimizer().num_slots();
    new_data[i].assign(n * (1 + slots), 0.0f);
    int64_t covered = 0;
    for (const v1::SavedShard& saved : request.saved()) {
      if (saved.is_table() || saved.name() != shard.name()) continue;
      const v1::DensePartition& theirs = saved.dense().partition();
      const int64_t begin = std::max(mine.row_begin(), theirs.row_begin());
      const int64_t end = std::min(mine.row_end(), theirs.row_end());
      if (begin >= end) continue;
      if (!google::protobuf::util::MessageDifferencer::Equals(saved.dense().variable().shape(),
                                                              shard.spec().variable().shape()) ||
          saved.dense().variable().optimizer().kind_case() !=
              shard.spec().variable().optimizer().kind_case()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "variable ", shard.name(), " in the checkpoint has shape ",
            ShapeString(saved.dense().variable().shape()), " and optimizer ",
            saved.dense().variable().optimizer().kind_case(), "; the model has ",
            ShapeString(shard.spec().variable().shape()), " and ",
            shard.spec().variable().optimizer().kind_case()));
      }
      PS_ASSIGN_OR_RETURN(CheckpointReader* reader, reader_for(saved));
      PS_ASSIGN_OR_RETURN(DenseRecord record, reader->ReadDense(saved));
      const int64_t their_n = (theirs.row_end() - theirs.row_begin()) * row_elems;
      if (static_cast<int64_t>(record.values_and_slots.size()) != their_n * (1 + slots)) {
        return absl::DataLossError(absl::StrCat("checkpoint shard ", saved.name(), "/",
                                                saved.partition(), " in ", saved.file(),
                                                " has ", record.values_and_slots.size(),
                                                " floats, expected ", their_n * (1 + slots)));
      }
      for (int s = 0; s <= slots; ++s) {
        std::copy_n(record.values_and_slots.data() + s * their_n +
                        (begin - theirs.row_begin()) * row_elems,
                    (end - begin) * row_elems,
                    new_data[i].data() + s * n + (begin - mine.row_begin()) * row_elems);
      }
      new_updates[i] = std::max(new_updates[i], record.updates);
      covered += end - begin;
    }
    if (covered != rows) {
      return absl::DataLossError(absl::StrCat("the checkpoint covers ", covered, " of the ", rows,
                                              " rows of ", shard.name(), "/",
                                              shard.partition(), " held here"));
    }
  }
  struct Row {
    int64_t key;
    std::vector<float> data;
    int64_t t;
  };
  std::vector<std::vector<Row>> table_rows(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    EmbeddingTable& table = *tables[i].second.table;
    for (const v1::SavedShard& saved : request.saved()) {
      if (!saved.is_table() || saved.name() != tables[i].first) continue;
      PS_ASSIGN_OR_RETURN(CheckpointReader* reader, reader_for(saved));
      const int64_t stride = table.dim() * (1 + table.optimizer().num_slots());
      PS_RETURN_IF_ERROR(reader->ReadTable(saved, [&](int64_t key, const float* row, int64_t t) {
        if (table.OwnsKey(key)) table_rows[i].push_back({key, std::vector<float>(row, row + stride), t});
      }));
    }
  }
  // Everything verified: apply.
  absl::MutexLock barrier(&apply_barrier_);
  int32_t restored = 0;
  for (size_t i = 0; i < dense.size(); ++i) {
    PS_RETURN_IF_ERROR(dense[i].first->Restore(new_data[i], new_updates[i]));
    ++restored;
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    for (const Row& r : table_rows[i]) {
      PS_RETURN_IF_ERROR(tables[i].second.table->InsertRow(r.key, r.data.data(), r.t));
    }
    ++restored;
  }
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
    FillTableStats(name, *t.table, *t.counters, out.add_shards());
  }
  return out;
}

absl::StatusOr<v1::InspectShardResponse> ParameterStore::Inspect(
    const v1::InspectShardRequest& request) const {
  v1::InspectShardResponse out;
  const v1::ShardRef& ref = request.shard();
  if (ref.partition() < 0) {
    PS_ASSIGN_OR_RETURN(Table t, FindTable(ref.variable()));
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
  const DenseShard& shard = *shards[0];
  FillDenseStats(shard, out.mutable_shard());
  std::vector<float> values(shard.num_elements());
  shard.ReadValues(values.data());
  ComputeFloatStats(values.data(), shard.num_elements(), out.mutable_values());
  const int64_t offset = request.values_offset();
  if (offset < 0 || request.values_count() < 0 || offset > shard.num_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "values offset ", offset, " and count ", request.values_count(), " are outside variable ",
        DenseName(shard.name(), shard.partition()), " of ", shard.num_elements(), " elements"));
  }
  const int64_t count = std::min(request.values_count(), shard.num_elements() - offset);
  out.set_slice(reinterpret_cast<const char*>(values.data() + offset), count * sizeof(float));
  return out;
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
