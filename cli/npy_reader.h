#ifndef PSCLUSTER_CLI_NPY_READER_H_
#define PSCLUSTER_CLI_NPY_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace pscluster {

// A float32 array read back from a .npy file.
struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> values;
  // The header dictionary as written, and where the data starts.
  std::string header;
  size_t data_offset = 0;
};

// For tests: parses a .npy v1.0 file of little-endian float32 in C order, independently of
// NpyHeader (it reads the header dictionary's keys, not a fixed layout). INVALID_ARGUMENT
// naming what is wrong (magic, version, dtype, order, shape, size).
absl::StatusOr<NpyArray> ParseNpy(const std::string& content);
absl::StatusOr<NpyArray> ReadNpyFile(const std::string& path);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_NPY_READER_H_
