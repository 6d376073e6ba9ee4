#include "ps_server/row_index.h"

#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(RowIndexTest, EmptyIndexFindsNothing) {
  RowIndex index;
  EXPECT_EQ(index.size(), 0u);
  for (int64_t key : {int64_t{0}, int64_t{-1}, std::numeric_limits<int64_t>::min(),
                      std::numeric_limits<int64_t>::max()}) {
    EXPECT_EQ(index.Find(key), RowIndex::kNoRow) << key;
  }
}

TEST(RowIndexTest, FindsEveryInsertedKeyThroughGrowth) {
  RowIndex index;
  std::map<int64_t, uint32_t> expected;
  // Keys that a default slot could be confused with (0), the extremes, and random ones.
  std::vector<int64_t> keys = {0, -1, 1, std::numeric_limits<int64_t>::min(),
                               std::numeric_limits<int64_t>::max()};
  std::mt19937_64 rng(11);
  while (keys.size() < 100000) keys.push_back(static_cast<int64_t>(rng()));
  for (int64_t key : keys) {
    if (expected.count(key) != 0) continue;
    ASSERT_EQ(index.Find(key), RowIndex::kNoRow) << key;
    const uint32_t row = static_cast<uint32_t>(expected.size());
    index.Insert(key, row);
    expected[key] = row;
    ASSERT_EQ(index.Find(key), row) << key;
  }
  EXPECT_EQ(index.size(), expected.size());
  for (const auto& [key, row] : expected) ASSERT_EQ(index.Find(key), row) << key;
  // Keys never inserted are still absent after many growths.
  for (int i = 0; i < 1000; ++i) {
    const int64_t key = static_cast<int64_t>(rng());
    if (expected.count(key) == 0) {
      ASSERT_EQ(index.Find(key), RowIndex::kNoRow) << key;
    }
  }
  std::map<int64_t, uint32_t> visited;
  index.ForEach([&](const RowIndex::Entry& entry) {
    EXPECT_TRUE(visited.emplace(entry.key, entry.row).second)
        << "key " << entry.key << " visited twice";
  });
  EXPECT_EQ(visited, expected);
}

TEST(RowIndexTest, ConsecutiveKeysThatCollideStayDistinct) {
  // Consecutive keys and keys 2^k apart: patterns that a weak hash would pile into one run.
  RowIndex index;
  uint32_t row = 0;
  for (int64_t key = 0; key < 5000; ++key) index.Insert(key, row++);
  for (int shift = 13; shift < 63; ++shift) index.Insert(int64_t{1} << shift, row++);
  row = 0;
  for (int64_t key = 0; key < 5000; ++key) ASSERT_EQ(index.Find(key), row++) << key;
  for (int shift = 13; shift < 63; ++shift) ASSERT_EQ(index.Find(int64_t{1} << shift), row++);
  EXPECT_EQ(index.Find(5000), RowIndex::kNoRow);
}

TEST(RowIndexTest, CountsStartAtZeroSurviveGrowthAndSaturate) {
  RowIndex index;
  RowIndex::Entry* first = index.Insert(42, 0);
  EXPECT_EQ(first->count, 0u);
  EXPECT_EQ(RowIndex::CountUpdate(first), 1u);
  EXPECT_EQ(RowIndex::CountUpdate(first), 2u);
  // Many inserts move every entry; the count moves with its key.
  for (int64_t key = 1000; key < 21000; ++key) {
    index.Insert(key, static_cast<uint32_t>(key));
  }
  RowIndex::Entry* moved = index.FindEntry(42);
  ASSERT_NE(moved, nullptr);
  EXPECT_EQ(moved->row, 0u);
  EXPECT_EQ(moved->count, 2u);
  EXPECT_EQ(index.FindEntry(1000)->count, 0u);
  EXPECT_EQ(index.FindEntry(7), nullptr);
  moved->count = RowIndex::kMaxCount - 1;
  EXPECT_EQ(RowIndex::CountUpdate(moved), RowIndex::kMaxCount);
  EXPECT_EQ(RowIndex::CountUpdate(moved), RowIndex::kMaxCount);
}

// Random inserts and erases against a std::map: every key still there is found with its row and
// count, every erased one is gone, through growth and long probe runs (keys drawn from a small
// range, so runs wrap around the end of the slots too).
TEST(RowIndexTest, EraseKeepsEveryOtherKeyFindable) {
  RowIndex index;
  std::map<int64_t, uint32_t> expected;
  std::mt19937_64 rng(5);
  uint32_t next_row = 0;
  for (int round = 0; round < 20000; ++round) {
    const int64_t key = static_cast<int64_t>(rng() % 3000) - 1500;
    if (rng() % 3 != 0) {
      if (expected.count(key) == 0) {
        RowIndex::Entry* entry = index.Insert(key, next_row);
        entry->count = next_row % 7;
        expected[key] = next_row++;
      }
    } else {
      EXPECT_EQ(index.Erase(key), expected.erase(key) == 1) << key;
    }
    if (round % 997 == 0) {
      ASSERT_EQ(index.size(), expected.size());
      for (const auto& [k, row] : expected) {
        const RowIndex::Entry* entry = index.FindEntry(k);
        ASSERT_NE(entry, nullptr) << k;
        EXPECT_EQ(entry->row, row);
        EXPECT_EQ(entry->count, row % 7);
      }
    }
  }
  for (int64_t key = -1500; key < 1500; ++key) {
    EXPECT_EQ(index.Find(key) != RowIndex::kNoRow, expected.count(key) == 1) << key;
  }
  // Erasing everything leaves an empty index that still takes keys.
  for (const auto& [k, row] : expected) EXPECT_TRUE(index.Erase(k));
  EXPECT_EQ(index.size(), 0u);
  EXPECT_FALSE(index.Erase(7));
  index.Insert(7, 1);
  EXPECT_EQ(index.Find(7), 1u);
}

}  // namespace
}  // namespace pscluster
