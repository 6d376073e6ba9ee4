#ifndef PSCLUSTER_SHARDING_SPARSE_HASH_H_
#define PSCLUSTER_SHARDING_SPARSE_HASH_H_

#include <cstdint>
#include <vector>

namespace pscluster {

// Number of virtual shards that sparse keys hash into when PlacementOptions leaves
// num_virtual_shards at 0.
constexpr int32_t kDefaultNumVirtualShards = 1024;

// Returns the virtual shard, in [0, num_virtual_shards), that owns embedding key `key`.
//
// The key is mixed with the splitmix64 function (golden-ratio increment, then the
// Stafford variant-13 finalizer) and reduced modulo num_virtual_shards. The mapping is fixed
// by this contract, never by std::hash, so every process, build and platform agrees on it;
// changing it would move every key of a running cluster.
//
// REQUIRES: num_virtual_shards > 0. Returns 0 otherwise.
// Pure; thread-safe.
int32_t VirtualShardOfKey(int64_t key, int32_t num_virtual_shards);

// Returns, for each virtual shard v in [0, num_virtual_shards), the ps task that owns it:
// v % num_ps. Keys never change virtual shard, so a change in the number of ps tasks moves
// whole virtual shards (and all their keys) between tasks, never splits one.
//
// REQUIRES: num_virtual_shards > 0 and num_ps > 0. Returns an empty vector otherwise.
// Pure; thread-safe.
std::vector<int32_t> AssignVirtualShards(int32_t num_virtual_shards, int32_t num_ps);

}  // namespace pscluster

#endif  // PSCLUSTER_SHARDING_SPARSE_HASH_H_
