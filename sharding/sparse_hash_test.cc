#include "sharding/sparse_hash.h"

#include <cstdint>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;

// A fixed key set: sequential ids (as raw ids usually are) followed by ids spread over the
// whole int64 range, negative ones included.
std::vector<int64_t> TestKeys(int count) {
  std::vector<int64_t> keys;
  keys.reserve(count);
  for (int i = 0; i < count / 2; ++i) keys.push_back(i);
  uint64_t x = 0x12345678u;
  while (static_cast<int>(keys.size()) < count) {
    // A 64-bit LCG (Knuth's MMIX constants): deterministic and platform-independent.
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    keys.push_back(static_cast<int64_t>(x));
  }
  return keys;
}

// Values of splitmix64 computed independently (Python), so that any change of the mixer,
// which would move every key of a running cluster, fails here.
TEST(VirtualShardOfKeyTest, MatchesPinnedSplitMix64Values) {
  EXPECT_EQ(VirtualShardOfKey(0, 1024), 431);  // splitmix64(0) = 0xe220a8397b1dcdaf
  EXPECT_EQ(VirtualShardOfKey(1, 1024), 193);
  EXPECT_EQ(VirtualShardOfKey(2, 1024), 718);
  EXPECT_EQ(VirtualShardOfKey(42, 1024), 661);
  EXPECT_EQ(VirtualShardOfKey(-1, 1024), 32);
  EXPECT_EQ(VirtualShardOfKey(123456789, 1024), 633);
  EXPECT_EQ(VirtualShardOfKey(std::numeric_limits<int64_t>::min(), 1024), 987);
  EXPECT_EQ(VirtualShardOfKey(std::numeric_limits<int64_t>::max(), 1024), 679);
  EXPECT_EQ(VirtualShardOfKey(0, 7), 2);
  EXPECT_EQ(VirtualShardOfKey(42, 7), 5);
  // Powers of two take a mask instead of a division: the same remainders.
  EXPECT_EQ(VirtualShardOfKey(0, 64), 47);
  EXPECT_EQ(VirtualShardOfKey(0, 65536), 52655);
  EXPECT_EQ(VirtualShardOfKey(0, 1 << 30), 991808943);
  EXPECT_EQ(VirtualShardOfKey(0, 1000), 535);
}

TEST(VirtualShardOfKeyTest, OneShardTakesEverything) {
  for (int64_t key : TestKeys(1000)) EXPECT_EQ(VirtualShardOfKey(key, 1), 0);
}

TEST(VirtualShardOfKeyTest, NonPositiveShardCountReturnsZero) {
  EXPECT_EQ(VirtualShardOfKey(42, 0), 0);
  EXPECT_EQ(VirtualShardOfKey(42, -5), 0);
}

TEST(VirtualShardOfKeyTest, AllInRangeAndBalancedOver100kKeys) {
  constexpr int kKeys = 100000;
  const std::vector<int64_t> keys = TestKeys(kKeys);
  for (int32_t num_shards : {kDefaultNumVirtualShards, 7, 100}) {
    SCOPED_TRACE(num_shards);
    std::vector<int> counts(num_shards, 0);
    for (int64_t key : keys) {
      const int32_t shard = VirtualShardOfKey(key, num_shards);
      ASSERT_GE(shard, 0);
      ASSERT_LT(shard, num_shards);
      ++counts[shard];
    }
    // About 98 keys a shard with 1024 shards; a binomial count stays within +-50% of the
    // mean (5 standard deviations) for a well-mixed hash.
    const double mean = static_cast<double>(kKeys) / num_shards;
    for (int32_t v = 0; v < num_shards; ++v) {
      EXPECT_GT(counts[v], 0.5 * mean) << "virtual shard " << v;
      EXPECT_LT(counts[v], 1.5 * mean) << "virtual shard " << v;
    }
  }
}

TEST(VirtualShardOfKeyTest, KeysPerPsAreBalancedOver100kKeys) {
  constexpr int kKeys = 100000;
  constexpr int32_t kNumPs = 3;
  const std::vector<int32_t> shard_to_ps = AssignVirtualShards(kDefaultNumVirtualShards, kNumPs);
  std::vector<int> counts(kNumPs, 0);
  for (int64_t key : TestKeys(kKeys)) {
    ++counts[shard_to_ps[VirtualShardOfKey(key, kDefaultNumVirtualShards)]];
  }
  for (int32_t ps = 0; ps < kNumPs; ++ps) {
    EXPECT_NEAR(counts[ps], kKeys / kNumPs, kKeys / kNumPs * 0.05) << "ps " << ps;
  }
}

// A vocabulary table's ids go to shard id mod the count, with masks or division alike; any
// other key still lands in range (the ps refuses it); a hashed table's keys hash as above.
TEST(VirtualShardOfTableKeyTest, VocabularyIdsGoToTheirRemainder) {
  for (const int32_t n : {1024, 1000, 1}) {
    for (int64_t id : {int64_t{0}, int64_t{1}, int64_t{999}, int64_t{1023}, int64_t{123456789}}) {
      EXPECT_EQ(VirtualShardOfTableKey(id, int64_t{1} << 40, n), id % n) << id << " of " << n;
    }
    for (int64_t key : {int64_t{-1}, std::numeric_limits<int64_t>::min()}) {
      const int32_t shard = VirtualShardOfTableKey(key, 10, n);
      EXPECT_GE(shard, 0);
      EXPECT_LT(shard, n);
    }
    for (int64_t key : TestKeys(100)) {
      EXPECT_EQ(VirtualShardOfTableKey(key, 0, n), VirtualShardOfKey(key, n));
    }
  }
  EXPECT_EQ(VirtualShardOfTableKey(5, 10, 0), 0);
  // Consecutive ids, which a frequency-sorted vocabulary makes the hottest, take turns over
  // the ps tasks.
  const std::vector<int32_t> shard_to_ps = AssignVirtualShards(kDefaultNumVirtualShards, 3);
  for (int64_t id = 0; id < 3000; ++id) {
    EXPECT_EQ(shard_to_ps[VirtualShardOfTableKey(id, 3000, kDefaultNumVirtualShards)],
              id % kDefaultNumVirtualShards % 3);
  }
}

TEST(AssignVirtualShardsTest, ShardGoesToShardModNumPs) {
  EXPECT_THAT(AssignVirtualShards(8, 3), ElementsAre(0, 1, 2, 0, 1, 2, 0, 1));
  EXPECT_THAT(AssignVirtualShards(4, 1), ElementsAre(0, 0, 0, 0));
  // More ps tasks than shards: the extra tasks hold no shard.
  EXPECT_THAT(AssignVirtualShards(2, 5), ElementsAre(0, 1));
}

TEST(AssignVirtualShardsTest, InvalidCountsGiveEmptyAssignment) {
  EXPECT_TRUE(AssignVirtualShards(0, 3).empty());
  EXPECT_TRUE(AssignVirtualShards(-1, 3).empty());
  EXPECT_TRUE(AssignVirtualShards(8, 0).empty());
  EXPECT_TRUE(AssignVirtualShards(8, -2).empty());
}

TEST(AssignVirtualShardsTest, GrowingFromTwoToThreePsMovesOnlyWholeVirtualShards) {
  const std::vector<int32_t> before = AssignVirtualShards(kDefaultNumVirtualShards, 2);
  const std::vector<int32_t> after = AssignVirtualShards(kDefaultNumVirtualShards, 3);
  ASSERT_EQ(before.size(), after.size());

  // For every virtual shard, all of its keys share one (old ps, new ps) move.
  std::map<int32_t, std::pair<int32_t, int32_t>> move_of_shard;
  int moved_keys = 0;
  const std::vector<int64_t> keys = TestKeys(100000);
  for (int64_t key : keys) {
    const int32_t shard = VirtualShardOfKey(key, kDefaultNumVirtualShards);
    const std::pair<int32_t, int32_t> move = {before[shard], after[shard]};
    auto [it, inserted] = move_of_shard.emplace(shard, move);
    EXPECT_EQ(it->second, move) << "key " << key << " in virtual shard " << shard;
    if (move.first != move.second) ++moved_keys;
  }
  EXPECT_EQ(move_of_shard.size(), static_cast<size_t>(kDefaultNumVirtualShards));

  // Shard v stays only when v % 2 == v % 3, i.e. v % 6 is 0 or 1: a third of the shards.
  int stayed_shards = 0;
  for (int32_t v = 0; v < kDefaultNumVirtualShards; ++v) {
    EXPECT_EQ(before[v] == after[v], v % 6 == 0 || v % 6 == 1) << "virtual shard " << v;
    if (before[v] == after[v]) ++stayed_shards;
  }
  EXPECT_EQ(stayed_shards, 342);  // 171 shards with v % 6 == 0 and 171 with v % 6 == 1.
  EXPECT_GT(moved_keys, 0);
  EXPECT_LT(moved_keys, static_cast<int>(keys.size()));
}

}  // namespace
}  // namespace pscluster
