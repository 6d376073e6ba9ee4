#ifndef PSCLUSTER_SHARDING_SPARSE_HASH_H_
#define PSCLUSTER_SHARDING_SPARSE_HASH_H_

#include <cstdint>
#include <vector>

#include "common/hash.h"

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
// Pure; thread-safe. Inline: clients route, and the ps checks, every key of a request with it.
inline int32_t VirtualShardOfKey(int64_t key, int32_t num_virtual_shards) {
  if (num_virtual_shards <= 0) return 0;
  // Two's-complement conversion: defined in C++17 and the same on every platform.
  const uint64_t hash = SplitMix64(static_cast<uint64_t>(key));
  const uint64_t n = static_cast<uint64_t>(num_virtual_shards);
  // The same remainder, without a division, for the usual power-of-two count.
  return static_cast<int32_t>((n & (n - 1)) == 0 ? hash & (n - 1) : hash % n);
}

// Returns the virtual shard that owns key `key` of a table with `vocabulary_size`
// (TableSpec.vocabulary_size): VirtualShardOfKey for a hashed table (0), and for a vocabulary
// table key mod num_virtual_shards, so that ids next to each other, which a frequency-sorted
// vocabulary makes the hottest, land on different shards. A key outside [0, vocabulary_size)
// still maps to some shard (its two's-complement value mod the count); the ps task refuses it.
//
// REQUIRES: num_virtual_shards > 0. Returns 0 otherwise.
// Pure; thread-safe.
inline int32_t VirtualShardOfTableKey(int64_t key, int64_t vocabulary_size,
                                      int32_t num_virtual_shards) {
  if (vocabulary_size <= 0) return VirtualShardOfKey(key, num_virtual_shards);
  if (num_virtual_shards <= 0) return 0;
  const uint64_t n = static_cast<uint64_t>(num_virtual_shards);
  const uint64_t k = static_cast<uint64_t>(key);
  return static_cast<int32_t>((n & (n - 1)) == 0 ? k & (n - 1) : k % n);
}

// Returns, for each virtual shard v in [0, num_virtual_shards), the ps task that owns it:
// v % num_ps. Keys never change virtual shard, so a change in the number of ps tasks moves
// whole virtual shards (and all their keys) between tasks, never splits one.
//
// REQUIRES: num_virtual_shards > 0 and num_ps > 0. Returns an empty vector otherwise.
// Pure; thread-safe.
std::vector<int32_t> AssignVirtualShards(int32_t num_virtual_shards, int32_t num_ps);

}  // namespace pscluster

#endif  // PSCLUSTER_SHARDING_SPARSE_HASH_H_
