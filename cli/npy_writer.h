#ifndef PSCLUSTER_CLI_NPY_WRITER_H_
#define PSCLUSTER_CLI_NPY_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace pscluster {

// NumPy's .npy format, version 1.0, for float32 arrays in C order:
//   "\x93NUMPY", major 1, minor 0, the header length (uint16 little-endian), the header
//   "{'descr': '<f4', 'fortran_order': False, 'shape': (64, 16), }" padded with spaces and
//   ended by '\n' so that the data starts at a multiple of 64 bytes, then the elements as
//   little-endian float32. A 1-D shape is written "(n,)" and a scalar "()".

// The bytes before the data (magic, version, length, padded header) for an array of `shape`.
std::string NpyHeader(const std::vector<int64_t>& shape);

// The whole file's content. REQUIRES: n == product(shape) (1 for a scalar).
std::string EncodeNpy(const std::vector<int64_t>& shape, const float* data, int64_t n);

// Writes EncodeNpy(...) to `path` through a temporary file renamed into place, so a reader
// never sees half a file. INVALID_ARGUMENT when n does not match the shape; a status naming
// the path (e.g. NOT_FOUND for a missing directory, PERMISSION_DENIED) when it cannot be
// written.
absl::Status WriteNpyFile(const std::string& path, const std::vector<int64_t>& shape,
                          const float* data, int64_t n);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_NPY_WRITER_H_
