// Checkpoint I/O of one ps task's shards: writes the dense shards and embedding tables it is
// given into a checkpoint (storage/checkpoint.h) and reads them back, re-cut to this task's
// partitions. ParameterStore keeps the catalog, the fencing and the sync settling, and hands
// these functions a snapshot of its catalog; they know nothing of requests in flight beyond the
// barrier that stops pushes from being applied.
#ifndef PSCLUSTER_PS_SERVER_SHARD_CHECKPOINTER_H_
#define PSCLUSTER_PS_SERVER_SHARD_CHECKPOINTER_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ps_service.pb.h"
#include "ps_server/dense_shard.h"
#include "ps_server/embedding_table.h"
#include "storage/crash_points.h"

namespace pscluster {

class ThreadPool;

// The shards of a ps task at one moment: what a save writes and what a restore fills.
struct ShardSet {
  std::vector<std::shared_ptr<DenseShard>> dense;
  std::vector<std::pair<std::string, std::shared_ptr<EmbeddingTable>>> tables;  // by name
};

// Every shard's values, slots and rows at one moment: dense shards and vocabulary tables
// copied out, hashed tables marked (EmbeddingTable::MarkCut: nothing copied, rows changed
// since kept aside in the table until their stripe is written), so pushes go on meanwhile.
struct ShardCut {
  struct Dense {
    v1::DenseShardSpec spec;
    int64_t updates = 0;
    std::vector<float> values_and_slots;
  };
  struct Table {
    v1::TableSpec spec;
    int64_t stride = 0;
    // A hashed table, marked: written stripe by stripe from it (one run each). Its last copy
    // lets the mark go (EmbeddingTable::DropCut). `delta`: an incremental mark (the rows
    // changed since the last cut, and the keys removed).
    std::shared_ptr<EmbeddingTable> marked;
    bool delta = false;
    // A vocabulary table, copied: its counts PackRowCount'ed (storage/checkpoint.h).
    EmbeddingTable::RowsCopy rows;
    std::vector<uint16_t> sketch;         // empty: no admission
    std::vector<int32_t> virtual_shards;  // owned when cut (with a sketch)
  };
  std::vector<Dense> dense;
  std::vector<Table> tables;
  absl::Duration held;  // how long pushes waited for the copies
};

// Memory for the next cut of `shards`' vocabulary tables (the ones a cut copies), by table
// name: made and faulted in for the rows they hold now and a sixteenth more, with nothing
// held, so that the cut only copies.
using PreparedCut = std::map<std::string, EmbeddingTable::RowsCopy>;
PreparedCut PrepareCut(const ShardSet& shards);

// How a cut marks the hashed tables (EmbeddingTable::MarkCut): `delta`, an incremental cut
// (each table's rows changed since the last cut); `track_changes`, the tables record their
// changes from this cut on, so that the next can be incremental.
struct CutOptions {
  bool delta = false;
  bool track_changes = false;
};

// Cuts every shard while holding `apply_barrier` (no push is applied meanwhile: one
// consistent cut): copies the dense shards and vocabulary tables, each of those into its
// memory of `prepared` (may be null; what is used is taken out of it), and marks the hashed
// tables. The cut must then be written (WriteShardCut), which lets the marks go. For a delta,
// FAILED_PRECONDITION naming the table, nothing cut, when a hashed table has not recorded
// every change since the last cut (EmbeddingTable::ChangesTracked).
absl::StatusOr<ShardCut> CutShardSet(const ShardSet& shards, absl::Mutex* apply_barrier,
                                     PreparedCut* prepared = nullptr,
                                     const CutOptions& options = CutOptions());

// Writes `cut` to `checkpoint_path` as ps task `ps_index`'s part, letting each shard's copy go
// once written and taking each marked table's stripes one at a time (one run each, sorted
// alone; with `pool`, not owned, in ranges of stripes on its threads and the caller's,
// CheckpointWriter::WriteTableRuns), and fills `response` (shards, bytes, time). Every mark is
// let go when `cut` goes, also on an error.
absl::Status WriteShardCut(ShardCut cut, const std::string& checkpoint_path, int32_t ps_index,
                           CrashPoints* crash_points, v1::SaveShardsResponse* response,
                           ThreadPool* pool = nullptr);

// One checkpoint of a restore: where it is and its manifest's shard list.
struct RestoreLink {
  std::string checkpoint_path;
  const google::protobuf::RepeatedPtrField<v1::SavedShard>* saved = nullptr;  // not owned
};

// Reads every saved part of `chain` (a checkpoint and those it builds on, oldest first: the
// request's chain, then the request's own) that overlaps `shards` and checks it (shapes,
// optimizers, dims, vocabulary sizes, sizes, coverage of every dense row held here); only
// when all of it is good, holding `apply_barrier`, replaces each dense shard's values (from the
// last checkpoint) and each table's rows (the full checkpoint's, then each delta's: removed
// keys out, changed rows over) and merges the admission sketches (the last checkpoint's), a
// table's stripes on `pool`'s threads too when it is given (not owned). `step` is the
// checkpoint's (RestoreShardsRequest.step). Returns how many shards it restored. On an error
// nothing has changed, but for a failure while applying.
absl::StatusOr<int32_t> RestoreShardSet(const ShardSet& shards, absl::Mutex* apply_barrier,
                                        const std::vector<RestoreLink>& chain, int64_t step,
                                        ThreadPool* pool = nullptr);

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_SHARD_CHECKPOINTER_H_
