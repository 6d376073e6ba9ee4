#include "ps_server/vocabulary_rows.h"

#include <algorithm>
#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

// Every owned id has a row of its own, inside the range of its stripe; ForEachCreated finds
// exactly the ids whose rows were created, by key.
void CheckLayout(int64_t vocabulary, int32_t num_shards, const std::vector<int32_t>& owned_shards,
                 int num_stripes) {
  std::vector<bool> owned(static_cast<size_t>(num_shards), false);
  for (int32_t v : owned_shards) owned[static_cast<size_t>(v)] = true;
  VocabularyRows rows;
  ASSERT_TRUE(rows.Allocate(vocabulary, owned, /*stride=*/3, num_stripes));
  EXPECT_TRUE(rows.usable());
  const int64_t per_shard = (vocabulary + num_shards - 1) / num_shards;
  EXPECT_EQ(rows.size(), static_cast<int64_t>(owned_shards.size()) * per_shard);
  EXPECT_EQ(rows.FirstRow(0), 0);
  EXPECT_EQ(rows.EndRow(num_stripes - 1), rows.size());
  std::set<int64_t> used;
  std::vector<std::pair<int, int64_t>> created;  // (stripe, key)
  for (int64_t key = 0; key < vocabulary; ++key) {
    if (!owned[static_cast<size_t>(rows.Shard(key))]) continue;
    const int64_t row = rows.Row(key);
    const int s = rows.StripeOf(key);
    ASSERT_GE(row, rows.FirstRow(s)) << key;
    ASSERT_LT(row, rows.EndRow(s)) << key;
    ASSERT_TRUE(used.insert(row).second) << "key " << key << " shares row " << row;
    if (key % 3 == 0) {
      rows.Count(row) = 1;
      rows.Values(row)[2] = static_cast<float>(key);  // the last float of the row is its own
      created.emplace_back(s, key);
    }
  }
  std::vector<std::pair<int, int64_t>> found;
  for (int s = 0; s < num_stripes; ++s) {
    rows.ForEachCreated(s, [&](int64_t key, int64_t row) {
      EXPECT_EQ(rows.Values(row)[2], static_cast<float>(key));
      found.emplace_back(s, key);
    });
  }
  std::sort(created.begin(), created.end());
  std::sort(found.begin(), found.end());
  EXPECT_EQ(found, created);
  for (int s = 0; s < num_stripes; ++s) rows.ClearStripe(s);
  int64_t left = 0;
  for (int s = 0; s < num_stripes; ++s) rows.ForEachCreated(s, [&](int64_t, int64_t) { ++left; });
  EXPECT_EQ(left, 0);
}

TEST(VocabularyRowsTest, PowerOfTwoShardsEveryOneOwned) {
  CheckLayout(1000, 8, {0, 1, 2, 3, 4, 5, 6, 7}, 4);
}

TEST(VocabularyRowsTest, SomeShardsOfANonPowerOfTwoAndMoreStripesThanShards) {
  CheckLayout(1001, 6, {1, 4, 5}, 8);
}

TEST(VocabularyRowsTest, ATaskOwningNothingHasNoRows) {
  VocabularyRows rows;
  EXPECT_TRUE(rows.usable());  // none laid out yet: a hashed table's
  EXPECT_TRUE(rows.Allocate(100, std::vector<bool>(4, false), 2, 4));
  EXPECT_EQ(rows.size(), 0);
  EXPECT_TRUE(rows.usable());
}

}  // namespace
}  // namespace pscluster
