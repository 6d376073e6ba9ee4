#include "model/data/feature_hash.h"

#include "common/hash.h"
#include "glog/logging.h"
#include "model/data/seeded_random.h"

namespace pscluster {

int64_t CategoricalId(int field, absl::string_view value, int64_t hash_buckets) {
  DCHECK_GE(field, 0);
  DCHECK_GE(hash_buckets, 0);
  const uint64_t hash = CombineSeeds(static_cast<uint64_t>(field), Fnv1a64(value));
  if (hash_buckets == 0) {
    return static_cast<int64_t>(hash & static_cast<uint64_t>(kCategoricalIdLimit - 1));
  }
  return field * hash_buckets + static_cast<int64_t>(hash % static_cast<uint64_t>(hash_buckets));
}

}  // namespace pscluster
