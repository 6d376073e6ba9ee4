#include "sharding/sparse_hash.h"

#include <cstdint>
#include <vector>

namespace pscluster {

std::vector<int32_t> AssignVirtualShards(int32_t num_virtual_shards, int32_t num_ps) {
  std::vector<int32_t> shard_to_ps;
  if (num_virtual_shards <= 0 || num_ps <= 0) return shard_to_ps;
  shard_to_ps.reserve(num_virtual_shards);
  for (int32_t v = 0; v < num_virtual_shards; ++v) shard_to_ps.push_back(v % num_ps);
  return shard_to_ps;
}

}  // namespace pscluster
