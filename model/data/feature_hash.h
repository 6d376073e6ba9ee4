#ifndef PSCLUSTER_MODEL_DATA_FEATURE_HASH_H_
#define PSCLUSTER_MODEL_DATA_FEATURE_HASH_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace pscluster {

// Categorical values (strings) as sparse feature ids, the same way for every reader (Criteo
// categoricals, CSV string columns) and for the synthetic data planted on them.
//
// The hash of (field, value) is CombineSeeds(field, FNV-1a-64(value)) (model/data/
// seeded_random.h): a fixed function of the bytes, the same on every run, build and platform
// (unlike absl::Hash), so that ids written into a checkpoint still mean the same values in a
// later run. The field takes part, so one string in two fields gives two unrelated ids.

// Ids without buckets are below this: 62 bits, never negative.
constexpr int64_t kCategoricalIdLimit = int64_t{1} << 62;

// The sparse id of `value` in field `field` (0-based):
//   hash_buckets == 0: the hash masked to 62 bits, in [0, 2^62); two fields meet only by a
//     64-bit hash collision.
//   hash_buckets > 0: field * hash_buckets + hash % hash_buckets: field f owns the ids
//     [f * hash_buckets, (f + 1) * hash_buckets), so fields never share an id, and values of
//     one field collide when they are many more than hash_buckets.
// REQUIRES: field >= 0; hash_buckets >= 0 and (field + 1) * hash_buckets fits in int64 (the
// readers check this for their field count up front).
// Thread-safe (a pure function).
int64_t CategoricalId(int field, absl::string_view value, int64_t hash_buckets);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_FEATURE_HASH_H_
