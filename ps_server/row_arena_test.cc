#include "ps_server/row_arena.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

// Row r holds r * 1000 + i in float i, exactly representable for the sizes used here.
void FillRow(RowArena* arena, uint64_t r) {
  float* row = arena->Row(r);
  for (int64_t i = 0; i < arena->stride(); ++i) row[i] = static_cast<float>(r * 1000 + i % 1000);
}

bool RowHolds(const RowArena& arena, uint64_t r) {
  const float* row = arena.Row(r);
  for (int64_t i = 0; i < arena.stride(); ++i) {
    if (row[i] != static_cast<float>(r * 1000 + i % 1000)) return false;
  }
  return true;
}

TEST(RowArenaTest, BlocksHoldAPowerOfTwoOfRowsInAtMost64KiB) {
  EXPECT_EQ(RowArena(16).rows_per_block(), 1024u);  // 64-byte rows: 64 KiB blocks
  EXPECT_EQ(RowArena(24).rows_per_block(), 512u);   // 96-byte rows: 48 KiB blocks
  EXPECT_EQ(RowArena(1).rows_per_block(), 16384u);
  EXPECT_EQ(RowArena(20000).rows_per_block(), 1u);  // an 80 KB row: one a block
}

TEST(RowArenaTest, RowsStartAtZeroAndKeepTheirValuesAsTheArenaGrows) {
  for (int64_t stride : {1, 16, 24, 20000}) {
    SCOPED_TRACE(stride);
    RowArena arena(stride);
    const uint64_t rows = stride == 20000 ? 40 : 3 * arena.rows_per_block() + 5;
    for (uint64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(arena.AddRow(), r);
      ASSERT_EQ(arena.size(), r + 1);
      const float* row = arena.Row(r);
      for (int64_t i = 0; i < stride; ++i) ASSERT_EQ(row[i], 0.0f) << "row " << r;
      FillRow(&arena, r);
    }
    for (uint64_t r = 0; r < rows; ++r) ASSERT_TRUE(RowHolds(arena, r)) << "row " << r;
  }
}

TEST(RowArenaTest, ASmallStripeTakesLittleMemoryAndFullBlocksDoNotMove) {
  RowArena arena(16);  // 64-byte rows
  for (int r = 0; r < 10; ++r) arena.AddRow();
  EXPECT_EQ(arena.bytes_reserved(), 16u * 64);  // the first block starts at 16 rows
  for (int r = 10; r < 17; ++r) arena.AddRow();
  EXPECT_EQ(arena.bytes_reserved(), 32u * 64);  // and doubles
  while (arena.size() < 1024) arena.AddRow();
  EXPECT_EQ(arena.bytes_reserved(), 64u * 1024);
  const float* first = arena.Row(0);
  const float* last = arena.Row(1023);
  arena.AddRow();
  EXPECT_EQ(arena.bytes_reserved(), 2u * 64 * 1024);
  EXPECT_EQ(arena.Row(0), first);
  EXPECT_EQ(arena.Row(1023), last);
}

TEST(RowArenaTest, RemoveLastRowGivesTheNumberBackAndClearEmpties) {
  RowArena arena(8);
  for (int r = 0; r < 3000; ++r) {
    arena.AddRow();
    FillRow(&arena, r);
  }
  arena.RemoveLastRow();
  EXPECT_EQ(arena.size(), 2999u);
  EXPECT_EQ(arena.AddRow(), 2999u);
  for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(arena.Row(2999)[i], 0.0f);
  arena.Clear();
  EXPECT_EQ(arena.size(), 0u);
  EXPECT_EQ(arena.bytes_reserved(), 0u);
  EXPECT_EQ(arena.stride(), 8);
  EXPECT_EQ(arena.AddRow(), 0u);
  FillRow(&arena, 0);
  EXPECT_TRUE(RowHolds(arena, 0));
}

}  // namespace
}  // namespace pscluster
