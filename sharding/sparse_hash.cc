#include "sharding/sparse_hash.h"

#include <cstdint>
#include <vector>

namespace pscluster {
namespace {

// splitmix64 (Steele, Lea, Flood 2014): well mixed even for sequential keys, which raw ids
// usually are. The increment keeps key 0 from mapping to hash 0.
uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

int32_t VirtualShardOfKey(int64_t key, int32_t num_virtual_shards) {
  if (num_virtual_shards <= 0) return 0;
  // Two's-complement conversion: defined in C++17 and the same on every platform.
  const uint64_t hash = SplitMix64(static_cast<uint64_t>(key));
  return static_cast<int32_t>(hash % static_cast<uint64_t>(num_virtual_shards));
}

std::vector<int32_t> AssignVirtualShards(int32_t num_virtual_shards, int32_t num_ps) {
  std::vector<int32_t> shard_to_ps;
  if (num_virtual_shards <= 0 || num_ps <= 0) return shard_to_ps;
  shard_to_ps.reserve(num_virtual_shards);
  for (int32_t v = 0; v < num_virtual_shards; ++v) shard_to_ps.push_back(v % num_ps);
  return shard_to_ps;
}

}  // namespace pscluster
