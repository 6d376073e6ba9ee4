#include "ps_server/shard_checkpointer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "google/protobuf/util/message_differencer.h"
#include "sharding/partitioner.h"
#include "storage/checkpoint.h"

namespace pscluster {
namespace {

// A dense shard's values and slots as the checkpoint has them, re-cut to its rows.
struct DenseContents {
  std::vector<float> values_and_slots;
  int64_t updates = 0;
};

absl::StatusOr<DenseContents> ReadDense(const DenseShard& shard, const RestoreLink& link,
                                        CheckpointReaders& readers) {
  const v1::DensePartition& mine = shard.spec().partition();
  const RowRange my_rows = RowsOf(mine);
  const int64_t row_elems = RowElements(shard.spec().variable().shape());
  const int slots = shard.optimizer().num_slots();
  DenseContents out;
  out.values_and_slots.assign(shard.num_elements() * (1 + slots), 0.0f);
  int64_t covered = 0;
  for (const v1::SavedShard& saved : *link.saved) {
    if (saved.is_table() || saved.name() != shard.name()) continue;
    const v1::DensePartition& theirs = saved.dense().partition();
    const RowRange their_rows = RowsOf(theirs);
    if (std::max(my_rows.begin, their_rows.begin) >= std::min(my_rows.end, their_rows.end)) {
      continue;
    }
    if (!google::protobuf::util::MessageDifferencer::Equals(saved.dense().variable().shape(),
                                                            shard.spec().variable().shape()) ||
        saved.dense().variable().optimizer().kind_case() !=
            shard.spec().variable().optimizer().kind_case()) {
      return absl::FailedPreconditionError(
          absl::StrCat("variable ", shard.name(), " in the checkpoint has shape ",
                       ShapeString(saved.dense().variable().shape()), " and optimizer ",
                       saved.dense().variable().optimizer().kind_case(), "; the model has ",
                       ShapeString(shard.spec().variable().shape()), " and ",
                       shard.spec().variable().optimizer().kind_case()));
    }
    PS_ASSIGN_OR_RETURN(CheckpointReader * reader, readers.For(link.checkpoint_path, saved));
    PS_ASSIGN_OR_RETURN(DenseRecord record, reader->ReadDense(saved));
    const int64_t their_n = ElementsOf(theirs, row_elems).size;
    if (static_cast<int64_t>(record.values_and_slots.size()) != their_n * (1 + slots)) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint shard ", saved.name(), "/", saved.partition(), " in ", saved.file(), " has ",
          record.values_and_slots.size(), " floats, expected ", their_n * (1 + slots)));
    }
    covered += CopyOverlappingRows(record.values_and_slots.data(), their_rows,
                                   out.values_and_slots.data(), my_rows, row_elems, 1 + slots);
    out.updates = std::max(out.updates, record.updates);
  }
  if (covered != my_rows.end - my_rows.begin) {
    return absl::DataLossError(absl::StrCat("the checkpoint covers ", covered, " of the ",
                                            my_rows.end - my_rows.begin, " rows of ", shard.name(),
                                            "/", shard.partition(), " held here"));
  }
  return out;
}

// A table's rows as the checkpoint has them (those this task owns), and the admission
// sketches of the saved parts whose virtual shards overlap this task's. The rows are either in
// `staged` (a table like the restored one, filled while it serves, adopted whole) or in the
// arrays (inserted into the restored table).
struct TableContents {
  std::unique_ptr<EmbeddingTable> staged;
  // Row i: keys[i], its floats at data[i * stride], update count t[i], last-push tick last[i].
  std::vector<int64_t> keys, t;
  std::vector<uint32_t> last;
  UninitializedFloats data;
  std::vector<std::vector<uint16_t>> sketches;
};

// Rows a restore reads and inserts at a time into a staged table: a few MB, so that a table
// part of any size passes through two batches' memory instead of being read whole first.
constexpr int64_t kStagedBatchRows = 32768;

// Keeps the rows of `batch` that `table` owns, in order. (A checkpoint of another placement
// holds rows of other ps tasks too.)
void KeepOwned(const EmbeddingTable& table, CheckpointReader::TableRows& batch) {
  const size_t n = batch.keys.size();
  const size_t stride = static_cast<size_t>(batch.stride);
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!table.OwnsKey(batch.keys[i])) continue;
    if (kept != i) {
      batch.keys[kept] = batch.keys[i];
      batch.counts[kept] = batch.counts[i];
      std::memmove(batch.values.data() + kept * stride, batch.values.data() + i * stride,
                   stride * sizeof(float));
    }
    ++kept;
  }
  batch.keys.resize(kept);
  batch.counts.resize(kept);
  batch.values.resize(kept * stride);
}

// A saved part of `table` that this table can take: the same dim and the same kind (a
// vocabulary table would drop the keys of a hashed one that are outside its range).
absl::Status CheckSavedTable(const v1::SavedShard& saved, const EmbeddingTable& table) {
  // Another dim may have the same stride with another number of slots: check both.
  if (saved.has_table() && saved.table().dim() != table.dim()) {
    return absl::DataLossError(absl::StrCat("checkpoint table ", saved.name(), " in ", saved.file(),
                                            " has dim ", saved.table().dim(),
                                            ", this ps task's table has dim ", table.dim()));
  }
  if (saved.has_table() && saved.table().vocabulary_size() != table.spec().vocabulary_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint table ", saved.name(), " in ", saved.file(), " has vocabulary_size ",
        saved.table().vocabulary_size(), ", this ps task's table has vocabulary_size ",
        table.spec().vocabulary_size(), " (0: hashed)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TableContents> ReadTable(const std::string& name, const EmbeddingTable& table,
                                        const std::vector<RestoreLink>& chain, int64_t step,
                                        CheckpointReaders& readers, ThreadPool* pool) {
  TableContents out;
  const int64_t stride = table.dim() * (1 + table.optimizer().num_slots());
  std::vector<TableLink> links;
  const v1::SavedShard* newest = nullptr;  // a part of the last checkpoint
  for (const RestoreLink& link : chain) {
    TableLink& parts = links.emplace_back();
    parts.checkpoint_path = link.checkpoint_path;
    for (const v1::SavedShard& saved : *link.saved) {
      if (!saved.is_table() || saved.name() != name) continue;
      PS_RETURN_IF_ERROR(CheckSavedTable(saved, table));
      parts.parts.push_back(&saved);
      newest = &saved;
    }
  }
  if (newest == nullptr) return out;
  // Ticks saved by a table without eviction (0), or in another unit, mean nothing here: such
  // rows count as pushed at the checkpoint's step (or now). (A chain is written by one run:
  // its parts have one spec.)
  const bool comparable_ticks = newest->has_table() && table.TicksComparable(newest->table());
  const uint32_t restore_tick = table.TickOf(step);
  const auto unpack = [&](const std::vector<int64_t>& counts, std::vector<int64_t>* t,
                          std::vector<uint32_t>* last) {
    const size_t n = counts.size();
    t->resize(n);
    last->resize(n);
    for (size_t i = 0; i < n; ++i) {
      (*t)[i] = UnpackRowCount(counts[i]);
      (*last)[i] = comparable_ticks ? UnpackRowLast(counts[i]) : restore_tick;
    }
  };
  if (!table.is_vocabulary()) {
    // A hashed table: the chain is read a batch at a time straight into a table of its own,
    // the deltas' removed keys taken out of it and their rows put over, and the restore adopts
    // it only once every part checked out.
    PS_ASSIGN_OR_RETURN(out.staged, table.EmptyLike());
    TableChainSink sink;
    // Called from the pool's threads at once when a part is read in ranges of its runs.
    sink.put = [&](CheckpointReader::TableRows& batch) {
      KeepOwned(table, batch);
      std::vector<int64_t> t;
      std::vector<uint32_t> last;
      unpack(batch.counts, &t, &last);
      return out.staged->InsertRows(batch.keys.data(), batch.values.data(), t.data(), last.data(),
                                    static_cast<int64_t>(batch.keys.size()), pool);
    };
    sink.remove = [&](const std::vector<int64_t>& keys) {
      out.staged->RemoveRows(keys.data(), static_cast<int64_t>(keys.size()));
      return absl::OkStatus();
    };
    PS_RETURN_IF_ERROR(
        ReadTableChainBatches(links, stride, kStagedBatchRows, sink, &readers, pool));
  } else {
    // Rows of another stride (another dim or optimizer) are refused, not read past.
    PS_ASSIGN_OR_RETURN(
        CheckpointReader::TableRows rows,
        ReadTableChain(
            links, stride, [&table](int64_t key) { return table.OwnsKey(key); }, &readers));
    unpack(rows.counts, &out.t, &out.last);
    out.keys = std::move(rows.keys);
    out.data = std::move(rows.values);
  }
  // The admission sketches of the last checkpoint's parts whose virtual shards overlap this
  // task's.
  const std::vector<int32_t> owned = table.OwnedVirtualShards();
  const size_t sketch_size = static_cast<size_t>(table.admission_sketch_size());
  for (const v1::SavedShard* saved : links.back().parts) {
    const bool overlaps = std::any_of(
        saved->virtual_shards().begin(), saved->virtual_shards().end(),
        [&owned](int32_t v) { return std::binary_search(owned.begin(), owned.end(), v); });
    if (saved->sketch_counters() == 0 || sketch_size == 0 || !overlaps) continue;
    PS_ASSIGN_OR_RETURN(CheckpointReader * reader,
                        readers.For(links.back().checkpoint_path, *saved));
    PS_ASSIGN_OR_RETURN(std::vector<uint16_t> sketch, reader->ReadTableSketch(*saved));
    if (sketch.size() == sketch_size) {
      out.sketches.push_back(std::move(sketch));
    } else {
      LOG(WARNING) << "table " << name << ": the checkpoint's admission sketch in " << saved->file()
                   << " has " << sketch.size() << " counters, this table's " << sketch_size
                   << " (admission.sketch_width changed?): not restored, "
                   << "admission counts start again";
    }
  }
  return out;
}

}  // namespace

PreparedCut PrepareCut(const ShardSet& shards) {
  PreparedCut prepared;
  for (const auto& [name, table] : shards.tables) {
    if (!table->is_vocabulary()) continue;  // marked, not copied
    const size_t rows = static_cast<size_t>(table->num_rows());
    const size_t stride = static_cast<size_t>(table->dim() * (1 + table->optimizer().num_slots()));
    prepared[name].MakeRoom(rows + rows / 16 + 1024, stride);
  }
  return prepared;
}

absl::StatusOr<ShardCut> CutShardSet(const ShardSet& shards, absl::Mutex* apply_barrier,
                                     PreparedCut* prepared, const CutOptions& options) {
  ShardCut cut;
  cut.dense.resize(shards.dense.size());
  cut.tables.resize(shards.tables.size());
  if (prepared != nullptr) {
    for (size_t i = 0; i < shards.tables.size(); ++i) {
      auto it = prepared->find(shards.tables[i].first);
      if (it == prepared->end()) continue;
      cut.tables[i].rows = std::move(it->second);
      prepared->erase(it);
    }
  }
  {
    // No push is applied while the copies are taken.
    absl::MutexLock barrier(apply_barrier);
    const absl::Time start = absl::Now();
    if (options.delta) {
      for (const auto& [name, table] : shards.tables) {
        if (!table->is_vocabulary() && !table->ChangesTracked()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "table ", name,
              " has changes not recorded since the last cut (it was created, "
              "restored or cleared since, or that cut did not track changes): this checkpoint "
              "must be full"));
        }
      }
    }
    for (size_t i = 0; i < shards.dense.size(); ++i) {
      ShardCut::Dense& d = cut.dense[i];
      d.spec = shards.dense[i]->spec();
      shards.dense[i]->Snapshot(&d.values_and_slots, &d.updates);
    }
    for (size_t i = 0; i < shards.tables.size(); ++i) {
      const std::shared_ptr<EmbeddingTable>& table = shards.tables[i].second;
      ShardCut::Table& t = cut.tables[i];
      t.spec = table->spec();
      t.stride = table->dim() * (1 + table->optimizer().num_slots());
      if (table->is_vocabulary()) {
        table->CopyRows(&t.rows);
      } else {
        table->MarkCut(options.delta, options.track_changes);
        t.delta = options.delta;
        // The last copy of the pointer lets the mark go, written or not (an error, a cut never
        // written): its table then keeps no rows aside for it.
        t.marked = std::shared_ptr<EmbeddingTable>(
            table.get(), [table](EmbeddingTable* marked) { marked->DropCut(); });
      }
      t.sketch = table->AdmissionSketch();
      if (!t.sketch.empty()) t.virtual_shards = table->OwnedVirtualShards();
    }
    cut.held = absl::Now() - start;
  }
  // Pushes go on from here.
  for (ShardCut::Table& t : cut.tables) {
    EmbeddingTable::RowsCopy& r = t.rows;
    for (size_t i = 0; i < r.counts.size(); ++i) {
      r.counts[i] = PackRowCount(r.counts[i], r.last[i]);
    }
    std::vector<uint32_t>().swap(r.last);
  }
  return cut;
}

absl::Status WriteShardCut(ShardCut cut, const std::string& checkpoint_path, int32_t ps_index,
                           CrashPoints* crash_points, v1::SaveShardsResponse* response,
                           ThreadPool* pool) {
  const absl::Time start = absl::Now();
  PS_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointWriter> writer,
                      CheckpointWriter::Open(checkpoint_path, ps_index, crash_points));
  int64_t bytes = 0;
  for (ShardCut::Dense& d : cut.dense) {
    PS_ASSIGN_OR_RETURN(v1::SavedShard saved,
                        writer->WriteDense(d.spec, d.updates, d.values_and_slots));
    std::vector<float>().swap(d.values_and_slots);  // written: its memory goes back now
    bytes += saved.bytes();
    *response->add_shards() = std::move(saved);
  }
  for (ShardCut::Table& t : cut.tables) {
    v1::SavedShard saved;
    if (t.marked != nullptr) {
      // A stripe at a time: its rows as they were at the mark, the counts packed with the ticks
      // (of an incremental mark, the rows changed since the last, and the keys removed). Each
      // writing thread takes its stripes into buffers of its own.
      struct Buffers {
        EmbeddingTable::RowsCopy run;
        std::vector<int64_t> removed;
      };
      absl::Mutex buffers_mu;
      std::map<std::thread::id, Buffers> buffers;  // nodes stay put as others are added
      const auto take = [&](int stripe) -> absl::StatusOr<CheckpointWriter::TableRun> {
        Buffers* b;
        {
          absl::MutexLock lock(&buffers_mu);
          b = &buffers[std::this_thread::get_id()];
        }
        EmbeddingTable::RowsCopy& run = b->run;
        run.keys.clear();
        run.counts.clear();
        run.last.clear();
        run.rows.clear();
        b->removed.clear();
        t.marked->TakeStripeCut(stripe, &run, t.delta ? &b->removed : nullptr);
        for (size_t i = 0; i < run.counts.size(); ++i) {
          run.counts[i] = PackRowCount(run.counts[i], run.last[i]);
        }
        return CheckpointWriter::TableRun{run.keys, run.counts, run.rows, b->removed};
      };
      PS_ASSIGN_OR_RETURN(
          saved, writer->WriteTableRuns(t.spec, t.stride, EmbeddingTable::kNumStripes, take,
                                        t.delta, pool));
      t.marked = nullptr;
    } else {
      PS_ASSIGN_OR_RETURN(saved, writer->WriteTable(t.spec, std::move(t.rows.keys), t.rows.rows,
                                                    t.rows.counts, t.stride));
      t.rows = EmbeddingTable::RowsCopy();  // written: its memory goes back now
    }
    if (!t.sketch.empty()) {
      PS_RETURN_IF_ERROR(writer->WriteTableSketch(t.sketch, t.virtual_shards, &saved));
    }
    bytes += saved.bytes();
    *response->add_shards() = std::move(saved);
  }
  PS_RETURN_IF_ERROR(writer->Finish());
  response->set_bytes(bytes);
  response->set_micros(absl::ToInt64Microseconds(cut.held + (absl::Now() - start)));
  response->set_cut_micros(absl::ToInt64Microseconds(cut.held));
  return absl::OkStatus();
}

absl::StatusOr<int32_t> RestoreShardSet(const ShardSet& shards, absl::Mutex* apply_barrier,
                                        const std::vector<RestoreLink>& chain, int64_t step,
                                        ThreadPool* pool) {
  if (chain.empty()) return absl::InvalidArgumentError("a restore of no checkpoint");
  // Read and verify everything first; apply only when all of it is good.
  CheckpointReaders readers;
  std::vector<DenseContents> dense;
  for (const std::shared_ptr<DenseShard>& shard : shards.dense) {
    // Dense partitions are whole in every checkpoint: the last one's.
    PS_ASSIGN_OR_RETURN(DenseContents d, ReadDense(*shard, chain.back(), readers));
    dense.push_back(std::move(d));
  }
  std::vector<TableContents> tables;
  for (const auto& [name, table] : shards.tables) {
    PS_ASSIGN_OR_RETURN(TableContents t, ReadTable(name, *table, chain, step, readers, pool));
    tables.push_back(std::move(t));
  }
  absl::MutexLock barrier(apply_barrier);
  int32_t restored = 0;
  for (size_t i = 0; i < dense.size(); ++i) {
    PS_RETURN_IF_ERROR(shards.dense[i]->Restore(dense[i].values_and_slots, dense[i].updates));
    ++restored;
  }
  for (size_t i = 0; i < tables.size(); ++i) {
    EmbeddingTable& table = *shards.tables[i].second;
    const TableContents& rows = tables[i];
    // The checkpoint's rows, and no others: a row created since would survive otherwise.
    if (rows.staged != nullptr) {
      PS_RETURN_IF_ERROR(table.AdoptRows(*rows.staged));
    } else {
      table.Clear();
      PS_RETURN_IF_ERROR(table.InsertRows(rows.keys.data(), rows.data.data(), rows.t.data(),
                                          rows.last.data(), static_cast<int64_t>(rows.keys.size()),
                                          pool));
    }
    for (const std::vector<uint16_t>& sketch : tables[i].sketches) {
      PS_RETURN_IF_ERROR(table.MergeAdmissionSketch(sketch));  // sizes checked when read
    }
    ++restored;
  }
  return restored;
}

}  // namespace pscluster
