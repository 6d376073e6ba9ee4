// Checkpoint I/O of one ps task's shards: writes the dense shards and embedding tables it is
// given into a checkpoint (storage/checkpoint.h) and reads them back, re-cut to this task's
// partitions. ParameterStore keeps the catalog, the fencing and the sync settling, and hands
// these functions a snapshot of its catalog; they know nothing of requests in flight beyond the
// barrier that stops pushes from being applied.
#ifndef PSCLUSTER_PS_SERVER_SHARD_CHECKPOINTER_H_
#define PSCLUSTER_PS_SERVER_SHARD_CHECKPOINTER_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/ps_service.pb.h"
#include "ps_server/dense_shard.h"
#include "ps_server/embedding_table.h"
#include "storage/crash_points.h"

namespace pscluster {

// The shards of a ps task at one moment: what a save writes and what a restore fills.
struct ShardSet {
  std::vector<std::shared_ptr<DenseShard>> dense;
  std::vector<std::pair<std::string, std::shared_ptr<EmbeddingTable>>> tables;  // by name
};

// Copies every shard's values, slots and rows while holding `apply_barrier` (no push is applied
// meanwhile: the copies are one consistent cut), then writes them to `checkpoint_path` as ps
// task `ps_index`'s part, and fills `response` (shards, bytes, time).
absl::Status SaveShardSet(const ShardSet& shards, absl::Mutex* apply_barrier,
                          const std::string& checkpoint_path, int32_t ps_index,
                          CrashPoints* crash_points, v1::SaveShardsResponse* response);

// Reads every saved part of `request` that overlaps `shards` from `checkpoint_path` and checks
// it (shapes, optimizers, dims, vocabulary sizes, sizes, coverage of every dense row held
// here); only when all of it is good, holding `apply_barrier`, replaces each dense shard's
// values and each table's rows (and merges the admission sketches). Returns how many shards it
// restored. On an error nothing has changed, but for a failure while applying.
absl::StatusOr<int32_t> RestoreShardSet(const ShardSet& shards, absl::Mutex* apply_barrier,
                                        const std::string& checkpoint_path,
                                        const v1::RestoreShardsRequest& request);

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_SHARD_CHECKPOINTER_H_
