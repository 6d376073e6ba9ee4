#ifndef PSCLUSTER_SHARDING_PARTITIONER_H_
#define PSCLUSTER_SHARDING_PARTITIONER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/model.pb.h"

namespace pscluster {

// The most partitions PartitionRows splits one tensor into. A larger count is almost always a
// misconfigured max_partition_bytes, and is refused rather than allocated.
constexpr int64_t kMaxPartitionsPerTensor = int64_t{1} << 20;

// Rows [begin, end) of a tensor's first dimension.
struct RowRange {
  int64_t begin;
  int64_t end;
};

inline bool operator==(const RowRange& a, const RowRange& b) {
  return a.begin == b.begin && a.end == b.end;
}
inline bool operator!=(const RowRange& a, const RowRange& b) { return !(a == b); }

// The geometry of dense partitions, in one place for the client, the ps tasks, restore and
// psctl. A partition holds rows [row_begin, row_end) of its variable's first dimension (a
// scalar is one row of one element); each row holds RowElements(shape) values, and the
// partition's values are a contiguous range of the variable's row-major values.

// "[3, 4]" (the shape's dimensions), as errors and psctl show a shape.
std::string ShapeString(const v1::TensorShape& shape);

// Elements per row of a variable of `shape`: the product of the dimensions after the first
// (1 for a scalar or a vector). Negative dimensions count as 0.
int64_t RowElements(const v1::TensorShape& shape);

// The rows of a partition.
inline RowRange RowsOf(const v1::DensePartition& partition) {
  return {partition.row_begin(), partition.row_end()};
}

// A partition's elements within its variable's row-major values: [begin, begin + size).
struct ElementRange {
  int64_t begin;
  int64_t size;
};
inline ElementRange ElementsOf(const v1::DensePartition& partition, int64_t row_elements) {
  return {partition.row_begin() * row_elements,
          (partition.row_end() - partition.row_begin()) * row_elements};
}

// Splits a tensor of `shape` along its first dimension into the fewest partitions such that
// each holds at most `max_partition_bytes` bytes, where a row takes
// product(dims[1:]) * bytes_per_element bytes (TensorFlow's variable_axis_size_partitioner).
//
// The partition count is n = ceil(rows / max(1, floor(max_partition_bytes / row_bytes))).
// ceil(total_bytes / max_partition_bytes) is only a lower bound: 5 rows of 10 bytes under a
// 25-byte limit need 3 partitions (2 + 2 + 1 rows), since 2 partitions would hold 3 rows.
// n never exceeds the row count: a single row larger than the limit is a partition alone.
// Rows are split as evenly as possible; the first (rows % n) partitions get one extra row
// (TensorFlow's rule), so partition sizes differ by at most one row.
//
// Exactly one partition comes back when max_partition_bytes == 0 (never split), when a row
// takes 0 bytes, or when the shape has no rows ({0, 0}). A scalar (no dims) is one row of one
// element: {0, 1}. The ranges are contiguous, in order, and cover [0, rows).
//
// Returns INVALID_ARGUMENT, naming the value, if a dimension, bytes_per_element or
// max_partition_bytes is negative, if the size in bytes of a row or of the whole tensor
// overflows int64, or if more than kMaxPartitionsPerTensor partitions would be needed.
//
// Pure and deterministic; thread-safe.
absl::StatusOr<std::vector<RowRange>> PartitionRows(const v1::TensorShape& shape,
                                                    int64_t bytes_per_element,
                                                    int64_t max_partition_bytes);

// Copies the rows two partitions of one tensor share, for restoring a checkpoint into another
// partitioning. `from` holds rows [from_rows.begin, from_rows.end) of the tensor as `planes`
// consecutive planes (the values, then each optimizer slot), each plane
// (from_rows.end - from_rows.begin) * row_elements floats; `to` holds to_rows the same way. In
// every plane, the rows in both ranges are copied from `from` to their place in `to`. Returns
// how many rows that is (0 when the ranges do not meet; nothing is written then).
// REQUIRES: from and to hold `planes` planes of their ranges; row_elements >= 0; planes >= 1.
int64_t CopyOverlappingRows(const float* from, RowRange from_rows, float* to, RowRange to_rows,
                            int64_t row_elements, int planes);

// Bytes taken by one row of `shape` (one slice along the first dimension):
// product(dims[1:]) * bytes_per_element, or bytes_per_element for a scalar.
//
// Returns INVALID_ARGUMENT, naming the value, if a dimension or bytes_per_element is negative,
// or if the size in bytes of a row or of the whole tensor overflows int64.
//
// Pure and deterministic; thread-safe.
absl::StatusOr<int64_t> BytesPerRow(const v1::TensorShape& shape, int64_t bytes_per_element);

}  // namespace pscluster

#endif  // PSCLUSTER_SHARDING_PARTITIONER_H_
