#ifndef PSCLUSTER_SHARDING_PLACEMENT_H_
#define PSCLUSTER_SHARDING_PLACEMENT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/model.pb.h"
#include "sharding/sparse_hash.h"

namespace pscluster {

// Decides which ps task holds each dense variable partition and each sparse virtual shard.
// Every process that calls this with the same inputs gets the same Placement, version
// included, so the chief, workers and ps tasks can each compute it rather than ship it.
//
// Dense variables are float32 (4 bytes per element; a dtype left at DT_INVALID counts as
// DT_FLOAT32) and are split by PartitionRows(shape, 4, options.max_partition_bytes); a variable
// of at least options.split_bytes bytes (0: kDefaultSplitBytes; negative: never) that this
// leaves in fewer partitions than ps tasks is instead split into min(num_ps, rows) partitions of
// ceil(rows / that) rows, so that every ps task holds a share of it (as ps-lite does).
// Partitions are placed in model order, variable by variable, partition by partition:
//   ROUND_ROBIN:  the k-th partition overall goes to ps k % num_ps (TensorFlow's
//                 replica_device_setter).
//   GREEDY_BYTES: each goes to the ps holding the fewest dense bytes so far, the lowest index
//                 on ties (TensorFlow's GreedyLoadBalancingStrategy).
// Tables are listed in `tables` with their dim, in model order; their rows are spread over the
// ps tasks by virtual shard: virtual_shard_to_ps = AssignVirtualShards(n, num_ps), with
// n = options.num_virtual_shards, or kDefaultNumVirtualShards when that is 0.
//
// With options.replication 2, every dense partition and virtual shard also gets a backup ps
// task (DensePartition.backup_ps_task, virtual_shard_to_backup_ps): BackupOf(its primary, how
// many items of the same kind that primary held before it, num_ps).
//
// The result's `options` are the given options with num_virtual_shards resolved to n and
// split_bytes to its value, and
// `version` is PlacementVersion() of the result.
//
// Returns INVALID_ARGUMENT, naming the offending value, if num_ps < 1; if replication is not 0,
// 1 or 2, or is 2 with fewer than 2 ps tasks; if a variable or table
// name is empty or used twice (variables and tables share one namespace); if a variable has a
// negative dimension, a dtype other than DT_FLOAT32, or needs too many partitions (see
// PartitionRows); if a table's dim is < 1; if max_partition_bytes or num_virtual_shards is
// negative; or if the strategy is not a known value.
//
// Pure and deterministic; thread-safe.
// Variables of at least this many bytes are spread over every ps task by default.
constexpr int64_t kDefaultSplitBytes = 256 << 10;

absl::StatusOr<v1::Placement> ComputePlacement(const v1::ModelSpec& model, int32_t num_ps,
                                               const v1::PlacementOptions& options);

// The backup of the `index`-th item (dense partition or virtual shard, counted per kind) whose
// primary is ps task `primary`, among `num_ps` tasks: (primary + 1 + index % (num_ps - 1)) %
// num_ps. Never the primary; a task's items have their backups spread in turn over every other
// task, so that when it dies its load moves to all of them, not to one partner; and with
// primaries spread evenly, so are the backups. REQUIRES: num_ps >= 2, 0 <= primary < num_ps,
// index >= 0.
inline int32_t BackupOf(int32_t primary, int64_t index, int32_t num_ps) {
  return static_cast<int32_t>((primary + 1 + index % (num_ps - 1)) % num_ps);
}

// A fingerprint of everything in `placement` except its `version` field: FNV-1a 64 over the
// fields, one by one, in a fixed order and encoding (integers as 8 little-endian bytes,
// strings length-prefixed), masked to be positive (and never 0). Unlike hashing
// SerializeAsString(), whose byte order protobuf does not promise, it is the same for every
// build. A process can compare it with placement.version() to check a placement it received.
//
// Pure and deterministic; thread-safe.
int64_t PlacementVersion(const v1::Placement& placement);

// A human-readable, column-aligned listing of `placement`: one line per dense partition
// (variable, partition, rows, ps task, bytes), then the tables, then how many virtual shards
// and dense bytes each ps task holds. For logs and the CLI; the format may change.
std::string PlacementDebugString(const v1::Placement& placement);

// The partitions of `variable` in `placement`, in partition order. The pointers point into
// `placement` and are valid until it is modified or destroyed.
//
// Returns NOT_FOUND, naming the variable, if `placement` has no partition of it.
// Thread-safe as long as no one modifies `placement`.
absl::StatusOr<std::vector<const v1::DensePartition*>> PartitionsOf(const v1::Placement& placement,
                                                                    absl::string_view variable);

// The ps task that holds sparse key `key` of a table with `vocabulary_size`
// (TableSpec.vocabulary_size; 0 for a hashed table): placement.virtual_shard_to_ps(
// VirtualShardOfTableKey(key, vocabulary_size, placement.virtual_shard_to_ps_size())).
//
// Returns -1 if `placement` has no virtual shards (for example, a default-constructed one).
// Thread-safe as long as no one modifies `placement`.
inline int32_t PsOfKey(const v1::Placement& placement, int64_t key, int64_t vocabulary_size = 0) {
  const int32_t num_virtual_shards = placement.virtual_shard_to_ps_size();
  if (num_virtual_shards == 0) return -1;
  return placement.virtual_shard_to_ps(
      VirtualShardOfTableKey(key, vocabulary_size, num_virtual_shards));
}

// The virtual shards each ps task owns: result[ps], in increasing order, for ps in
// [0, placement.num_ps()). Owners outside that range are left out.
std::vector<std::vector<int32_t>> VirtualShardsByPs(const v1::Placement& placement);

}  // namespace pscluster

#endif  // PSCLUSTER_SHARDING_PLACEMENT_H_
