#ifndef PSCLUSTER_TESTING_MODEL_SNAPSHOT_H_
#define PSCLUSTER_TESTING_MODEL_SNAPSHOT_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pscluster {

// Everything a committed checkpoint holds of the model, whatever the number of ps tasks that
// wrote it: every dense partition's values and optimizer slots with its update count, and
// every table row's values and slots with its update count. Two runs that must end with the
// same model (sync training, disturbed and undisturbed) are compared through it bit for bit.
struct ModelSnapshot {
  int64_t step = -1;
  // "name/partition" -> values then slots.
  std::map<std::string, std::vector<float>> dense;
  std::map<std::string, int64_t> dense_updates;
  // (table, key) -> values then slots.
  std::map<std::tuple<std::string, int64_t>, std::vector<float>> rows;
  std::map<std::tuple<std::string, int64_t>, int64_t> row_updates;
};

// Reads every shard of the committed checkpoint at `checkpoint` (each checked against its
// checksum). NOT_FOUND / DATA_LOSS as storage/checkpoint.h says.
absl::StatusOr<ModelSnapshot> ReadModelSnapshot(const std::string& checkpoint);

// OK when `actual` is `expected` bit for bit: the same step, the same dense partitions with the
// same values, slots and update counts, and every row of `expected` in `actual` with the same
// values, slots and update count. `actual` may hold more rows only when none of them was ever
// updated (a pull creates rows in tables without eviction, and an evaluation pulls). Otherwise
// FAILED_PRECONDITION saying how many values differ and naming the first ones, with both
// values and their bits.
absl::Status CompareModels(const ModelSnapshot& expected, const ModelSnapshot& actual);

}  // namespace pscluster

#endif  // PSCLUSTER_TESTING_MODEL_SNAPSHOT_H_
