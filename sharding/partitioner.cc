#include "sharding/partitioner.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace pscluster {

std::string ShapeString(const v1::TensorShape& shape) {
  return absl::StrCat("[", absl::StrJoin(shape.dims(), ", "), "]");
}

namespace {

// Checks the shape and returns {rows, bytes per row}; a scalar is one row.
absl::StatusOr<std::pair<int64_t, int64_t>> RowsAndRowBytes(const v1::TensorShape& shape,
                                                            int64_t bytes_per_element) {
  if (bytes_per_element < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("bytes_per_element must be >= 0, got ", bytes_per_element));
  }
  for (int i = 0; i < shape.dims_size(); ++i) {
    if (shape.dims(i) < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dimension ", i, " of shape ", ShapeString(shape), " is negative (", shape.dims(i), ")"));
    }
  }
  const int64_t rows = shape.dims_size() == 0 ? 1 : shape.dims(0);
  int64_t row_bytes = bytes_per_element;
  int64_t total_bytes = 0;
  bool overflow = false;
  for (int i = 1; i < shape.dims_size() && !overflow; ++i) {
    overflow = __builtin_mul_overflow(row_bytes, shape.dims(i), &row_bytes);
  }
  if (!overflow) overflow = __builtin_mul_overflow(row_bytes, rows, &total_bytes);
  // A zero dimension makes the tensor empty even when the product of the others overflows;
  // such a shape is rejected too rather than special-cased.
  if (overflow) {
    return absl::InvalidArgumentError(absl::StrCat("shape ", ShapeString(shape), " with ",
                                                   bytes_per_element,
                                                   " bytes per element overflows int64 bytes"));
  }
  return std::make_pair(rows, row_bytes);
}

}  // namespace

int64_t CopyOverlappingRows(const float* from, RowRange from_rows, float* to, RowRange to_rows,
                            int64_t row_elements, int planes) {
  const int64_t begin = std::max(from_rows.begin, to_rows.begin);
  const int64_t end = std::min(from_rows.end, to_rows.end);
  if (begin >= end) return 0;
  const int64_t from_plane = (from_rows.end - from_rows.begin) * row_elements;
  const int64_t to_plane = (to_rows.end - to_rows.begin) * row_elements;
  for (int p = 0; p < planes; ++p) {
    std::copy_n(from + p * from_plane + (begin - from_rows.begin) * row_elements,
                (end - begin) * row_elements,
                to + p * to_plane + (begin - to_rows.begin) * row_elements);
  }
  return end - begin;
}

int64_t RowElements(const v1::TensorShape& shape) {
  int64_t n = 1;
  for (int i = 1; i < shape.dims_size(); ++i) n *= std::max<int64_t>(0, shape.dims(i));
  return n;
}

absl::StatusOr<int64_t> BytesPerRow(const v1::TensorShape& shape, int64_t bytes_per_element) {
  PS_ASSIGN_OR_RETURN(const auto rows_and_row_bytes, RowsAndRowBytes(shape, bytes_per_element));
  return rows_and_row_bytes.second;
}

absl::StatusOr<std::vector<RowRange>> PartitionRows(const v1::TensorShape& shape,
                                                    int64_t bytes_per_element,
                                                    int64_t max_partition_bytes) {
  if (max_partition_bytes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_partition_bytes must be >= 0 (0 means never split), got ", max_partition_bytes));
  }
  PS_ASSIGN_OR_RETURN(const auto rows_and_row_bytes, RowsAndRowBytes(shape, bytes_per_element));
  const auto [rows, row_bytes] = rows_and_row_bytes;

  int64_t num_partitions = 1;
  if (max_partition_bytes > 0 && row_bytes > 0 && rows > 0) {
    const int64_t max_rows_per_partition = std::max<int64_t>(1, max_partition_bytes / row_bytes);
    num_partitions = rows / max_rows_per_partition + (rows % max_rows_per_partition != 0);
  }
  if (num_partitions > kMaxPartitionsPerTensor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", ShapeString(shape), " with ", row_bytes, " bytes per row would need ",
        num_partitions, " partitions of at most ", max_partition_bytes, " bytes, more than ",
        kMaxPartitionsPerTensor, "; raise max_partition_bytes"));
  }

  const int64_t base_rows = rows / num_partitions;
  const int64_t longer_partitions = rows % num_partitions;
  std::vector<RowRange> ranges;
  ranges.reserve(num_partitions);
  int64_t begin = 0;
  for (int64_t p = 0; p < num_partitions; ++p) {
    const int64_t end = begin + base_rows + (p < longer_partitions ? 1 : 0);
    ranges.push_back(RowRange{begin, end});
    begin = end;
  }
  return ranges;
}

}  // namespace pscluster
