#include "sharding/partitioner.h"

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/tensor.pb.h"

namespace pscluster {

// Defined where argument-dependent lookup finds it, for gMock's failure messages.
void PrintTo(const RowRange& range, std::ostream* os) {
  *os << "[" << range.begin << ", " << range.end << ")";
}

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

v1::TensorShape Shape(std::initializer_list<int64_t> dims) {
  v1::TensorShape shape;
  for (int64_t dim : dims) shape.add_dims(dim);
  return shape;
}

std::vector<RowRange> Partition(std::initializer_list<int64_t> dims, int64_t bytes_per_element,
                                int64_t max_partition_bytes) {
  absl::StatusOr<std::vector<RowRange>> ranges =
      PartitionRows(Shape(dims), bytes_per_element, max_partition_bytes);
  EXPECT_TRUE(ranges.ok()) << ranges.status();
  return ranges.ok() ? *ranges : std::vector<RowRange>{};
}

TEST(PartitionRowsTest, EvenSplit) {
  // 8 rows of 4 floats = 16 bytes a row, 128 bytes in all; 32 bytes hold 2 rows.
  EXPECT_THAT(Partition({8, 4}, 4, 32),
              ElementsAre(RowRange{0, 2}, RowRange{2, 4}, RowRange{4, 6}, RowRange{6, 8}));
}

TEST(PartitionRowsTest, UnevenSplitGivesFirstPartitionsTheExtraRows) {
  // 10 rows of 4 bytes under a 12-byte limit: 3 rows a partition at most, so 4 partitions;
  // 10 % 4 = 2, so the first two get 3 rows and the last two get 2.
  EXPECT_THAT(Partition({10, 1}, 4, 12),
              ElementsAre(RowRange{0, 3}, RowRange{3, 6}, RowRange{6, 8}, RowRange{8, 10}));
}

TEST(PartitionRowsTest, ExactByteLimitIsOnePartition) {
  // 8 x 4 floats = 128 bytes.
  EXPECT_THAT(Partition({8, 4}, 4, 128), ElementsAre(RowRange{0, 8}));
  EXPECT_THAT(Partition({8, 4}, 4, 127), ElementsAre(RowRange{0, 4}, RowRange{4, 8}));
  EXPECT_THAT(Partition({8, 4}, 4, 64), ElementsAre(RowRange{0, 4}, RowRange{4, 8}));
}

TEST(PartitionRowsTest, UsesMorePartitionsThanTotalOverMaxWhenRowsDoNotFit) {
  // ceil(50 / 25) = 2 partitions would hold 3 + 2 rows = 30 bytes > 25; 3 are needed.
  EXPECT_THAT(Partition({5, 10}, 1, 25),
              ElementsAre(RowRange{0, 2}, RowRange{2, 4}, RowRange{4, 5}));
}

TEST(PartitionRowsTest, SingleHugeRowIsOnePartition) {
  EXPECT_THAT(Partition({1, 1000}, 4, 100), ElementsAre(RowRange{0, 1}));
}

TEST(PartitionRowsTest, RowsLargerThanLimitAreOnePartitionEach) {
  EXPECT_THAT(Partition({3, 1000}, 4, 100),
              ElementsAre(RowRange{0, 1}, RowRange{1, 2}, RowRange{2, 3}));
}

TEST(PartitionRowsTest, ZeroMaxMeansNeverSplit) {
  EXPECT_THAT(Partition({1000000, 1000}, 4, 0), ElementsAre(RowRange{0, 1000000}));
}

TEST(PartitionRowsTest, ScalarIsOneRow) {
  EXPECT_THAT(Partition({}, 4, 1), ElementsAre(RowRange{0, 1}));
  EXPECT_THAT(Partition({}, 4, 0), ElementsAre(RowRange{0, 1}));
}

TEST(PartitionRowsTest, EmptyShapesAreOnePartition) {
  EXPECT_THAT(Partition({0, 16}, 4, 8), ElementsAre(RowRange{0, 0}));
  EXPECT_THAT(Partition({0}, 4, 8), ElementsAre(RowRange{0, 0}));
  // Rows of zero bytes: nothing to split.
  EXPECT_THAT(Partition({7, 0}, 4, 8), ElementsAre(RowRange{0, 7}));
  EXPECT_THAT(Partition({7, 3}, 0, 8), ElementsAre(RowRange{0, 7}));
}

TEST(PartitionRowsTest, VectorSplitsByElement) {
  EXPECT_THAT(Partition({5}, 4, 8), ElementsAre(RowRange{0, 2}, RowRange{2, 4}, RowRange{4, 5}));
}

// For many shapes and limits: the ranges cover [0, rows) in order, each fits the limit (or is
// one row), sizes differ by at most one row with the longer ones first, and one partition
// fewer could not fit.
TEST(PartitionRowsTest, InvariantsHoldOverManyShapes) {
  for (int64_t rows = 1; rows <= 40; ++rows) {
    for (int64_t cols = 1; cols <= 5; ++cols) {
      for (int64_t max_bytes = 1; max_bytes <= 200; max_bytes += 7) {
        SCOPED_TRACE(testing::Message()
                     << "rows=" << rows << " cols=" << cols << " max_bytes=" << max_bytes);
        const int64_t row_bytes = cols * 4;
        const std::vector<RowRange> ranges = Partition({rows, cols}, 4, max_bytes);
        ASSERT_FALSE(ranges.empty());
        const int64_t n = static_cast<int64_t>(ranges.size());
        ASSERT_LE(n, rows);
        EXPECT_EQ(ranges.front().begin, 0);
        EXPECT_EQ(ranges.back().end, rows);
        for (int64_t p = 0; p < n; ++p) {
          const int64_t size = ranges[p].end - ranges[p].begin;
          if (p > 0) {
            EXPECT_EQ(ranges[p].begin, ranges[p - 1].end);
          }
          EXPECT_GE(size, 1);
          EXPECT_TRUE(size * row_bytes <= max_bytes || size == 1);
          EXPECT_EQ(size, rows / n + (p < rows % n ? 1 : 0));
        }
        if (n > 1) {
          // With n - 1 partitions the largest would hold ceil(rows / (n - 1)) rows.
          const int64_t largest = (rows + n - 2) / (n - 1);
          EXPECT_GT(largest * row_bytes, max_bytes);
        }
      }
    }
  }
}

TEST(PartitionRowsTest, NegativeDimensionIsInvalid) {
  absl::StatusOr<std::vector<RowRange>> ranges = PartitionRows(Shape({3, -2}), 4, 100);
  EXPECT_EQ(ranges.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ranges.status().message(), HasSubstr("dimension 1 of shape [3, -2] is negative"));

  ranges = PartitionRows(Shape({-1}), 4, 100);
  EXPECT_EQ(ranges.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ranges.status().message(), HasSubstr("(-1)"));
}

TEST(PartitionRowsTest, NegativeBytesPerElementIsInvalid) {
  absl::StatusOr<std::vector<RowRange>> ranges = PartitionRows(Shape({3}), -4, 100);
  EXPECT_EQ(ranges.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ranges.status().message(), HasSubstr("bytes_per_element must be >= 0, got -4"));
}

TEST(PartitionRowsTest, NegativeMaxPartitionBytesIsInvalid) {
  absl::StatusOr<std::vector<RowRange>> ranges = PartitionRows(Shape({3}), 4, -1);
  EXPECT_EQ(ranges.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ranges.status().message(), HasSubstr("max_partition_bytes must be >= 0"));
  EXPECT_THAT(ranges.status().message(), HasSubstr("got -1"));
}

TEST(PartitionRowsTest, OverflowingSizeIsInvalid) {
  const int64_t big = int64_t{1} << 40;
  absl::StatusOr<std::vector<RowRange>> ranges = PartitionRows(Shape({big, big}), 4, 0);
  EXPECT_EQ(ranges.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ranges.status().message(), HasSubstr("overflows int64"));

  ranges = PartitionRows(Shape({std::numeric_limits<int64_t>::max()}), 2, 0);
  EXPECT_EQ(ranges.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ranges.status().message(), HasSubstr("overflows int64"));
}

TEST(PartitionRowsTest, TooManyPartitionsIsInvalid) {
  absl::StatusOr<std::vector<RowRange>> ranges =
      PartitionRows(Shape({kMaxPartitionsPerTensor + 1}), 4, 4);
  EXPECT_EQ(ranges.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ranges.status().message(), HasSubstr("raise max_partition_bytes"));

  EXPECT_TRUE(PartitionRows(Shape({kMaxPartitionsPerTensor}), 4, 4).ok());
}

TEST(BytesPerRowTest, MultipliesInnerDimensions) {
  EXPECT_EQ(BytesPerRow(Shape({10, 3, 5}), 4).value(), 60);
  EXPECT_EQ(BytesPerRow(Shape({10}), 4).value(), 4);
  EXPECT_EQ(BytesPerRow(Shape({}), 4).value(), 4);
  EXPECT_EQ(BytesPerRow(Shape({0, 7}), 4).value(), 28);
}

TEST(BytesPerRowTest, NegativeDimensionIsInvalid) {
  absl::StatusOr<int64_t> bytes = BytesPerRow(Shape({2, -7}), 4);
  EXPECT_EQ(bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bytes.status().message(), HasSubstr("(-7)"));
}

// Rows of one tensor (rows of 2 elements) saved as [2, 6) with a slot plane, restored into
// [4, 9): rows 4 and 5 of both planes land at their place; nothing else is written.
TEST(CopyOverlappingRowsTest, CopiesTheSharedRowsOfEveryPlane) {
  std::vector<float> from(2 * 4 * 2);  // 2 planes x 4 rows x 2 elements
  for (size_t i = 0; i < from.size(); ++i) from[i] = static_cast<float>(i);
  std::vector<float> to(2 * 5 * 2, -1.0f);  // 2 planes x 5 rows x 2 elements
  EXPECT_EQ(CopyOverlappingRows(from.data(), RowRange{2, 6}, to.data(), RowRange{4, 9}, 2, 2), 2);
  // Plane 0: rows 4, 5 are from's rows 2, 3 (elements 4..7); plane 1 likewise, 8 further on.
  EXPECT_THAT(to, ::testing::ElementsAre(4, 5, 6, 7, -1, -1, -1, -1, -1, -1,  //
                                         12, 13, 14, 15, -1, -1, -1, -1, -1, -1));
  // Ranges that do not meet copy nothing.
  std::vector<float> untouched(10, -1.0f);
  EXPECT_EQ(
      CopyOverlappingRows(from.data(), RowRange{2, 6}, untouched.data(), RowRange{6, 11}, 2, 1), 0);
  EXPECT_THAT(untouched, ::testing::Each(-1.0f));
  // The whole tensor from two partitions, values only.
  std::vector<float> whole(6 * 2, -1.0f);
  std::vector<float> a = {0, 1, 2, 3, 4, 5}, b = {6, 7, 8, 9, 10, 11};
  EXPECT_EQ(CopyOverlappingRows(a.data(), RowRange{0, 3}, whole.data(), RowRange{0, 6}, 2, 1), 3);
  EXPECT_EQ(CopyOverlappingRows(b.data(), RowRange{3, 6}, whole.data(), RowRange{0, 6}, 2, 1), 3);
  EXPECT_THAT(whole, ::testing::ElementsAre(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11));
}

TEST(PartitionGeometryTest, APartitionIsAContiguousRangeOfItsVariablesValues) {
  v1::TensorShape matrix;
  matrix.add_dims(10);
  matrix.add_dims(3);
  matrix.add_dims(2);
  EXPECT_EQ(RowElements(matrix), 6);
  EXPECT_EQ(RowElements(v1::TensorShape()), 1);  // a scalar: one row of one element
  v1::TensorShape vector;
  vector.add_dims(7);
  EXPECT_EQ(RowElements(vector), 1);

  v1::DensePartition p;
  p.set_row_begin(4);
  p.set_row_end(7);
  EXPECT_EQ(RowsOf(p), (RowRange{4, 7}));
  const ElementRange e = ElementsOf(p, RowElements(matrix));
  EXPECT_EQ(e.begin, 24);
  EXPECT_EQ(e.size, 18);
  // The partitions PartitionRows makes cover the values exactly, in order.
  absl::StatusOr<std::vector<RowRange>> parts = PartitionRows(matrix, 4, 50);
  ASSERT_TRUE(parts.ok()) << parts.status();
  int64_t next = 0;
  for (const RowRange& r : *parts) {
    v1::DensePartition q;
    q.set_row_begin(r.begin);
    q.set_row_end(r.end);
    EXPECT_EQ(ElementsOf(q, RowElements(matrix)).begin, next);
    next += ElementsOf(q, RowElements(matrix)).size;
  }
  EXPECT_EQ(next, 60);
}

}  // namespace
}  // namespace pscluster
