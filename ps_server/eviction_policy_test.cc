#include "ps_server/eviction_policy.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

// An index of rows 0..n-1 with keys 1000 + row (inserted in `order`), counts and last ticks.
struct Stripe {
  RowIndex index;
  std::vector<uint32_t> last;
  Stripe(const std::vector<uint32_t>& counts, std::vector<uint32_t> last_push,
         const std::vector<uint32_t>& order)
      : last(std::move(last_push)) {
    for (uint32_t row : order) index.Insert(1000 + row, row)->count = counts[row];
  }
};

std::vector<int64_t> Keys(const std::vector<RowIndex::Entry>& entries) {
  std::vector<int64_t> keys;
  for (const RowIndex::Entry& e : entries) keys.push_back(e.key);
  std::sort(keys.begin(), keys.end());
  return keys;
}

std::vector<uint32_t> Iota(uint32_t n, bool reversed = false) {
  std::vector<uint32_t> v(n);
  for (uint32_t i = 0; i < n; ++i) v[i] = reversed ? n - 1 - i : i;
  return v;
}

TEST(EvictionPolicyTest, ARowExpiresPastTheTtlOnly) {
  EXPECT_FALSE(EvictionPolicy().Expired(0, 1000000));
  const EvictionPolicy p(/*ttl=*/10, 0, false);
  EXPECT_TRUE(p.Expired(5, 16));
  EXPECT_FALSE(p.Expired(5, 15));
  EXPECT_FALSE(p.Expired(20, 5)) << "a clock behind the row's push";
  Stripe s({0, 0, 0}, {1, 10, 20}, Iota(3));
  EXPECT_EQ(Keys(EvictionPolicy(5, 0, false).ExpiredRows(s.index, s.last.data(), 20)),
            (std::vector<int64_t>{1000, 1001}));
}

TEST(EvictionPolicyTest, ASweepIsDueEveryQuarterTtlAfterARestoreAndOverCapacity) {
  EXPECT_FALSE(EvictionPolicy(0, 4, false).SweepDue(100, 0, 50)) << "no TTL, nothing to sweep";
  const EvictionPolicy p(/*ttl=*/8, /*capacity=*/4, false);
  EXPECT_FALSE(p.SweepDue(4, 10, 11));
  EXPECT_TRUE(p.SweepDue(4, 10, 12));
  EXPECT_TRUE(p.SweepDue(4, 10, 3)) << "the clock went back";
  EXPECT_TRUE(p.SweepDue(5, 10, 10)) << "over capacity";
}

TEST(EvictionPolicyTest, NothingGoesUpToTheCapacity) {
  Stripe s(std::vector<uint32_t>(16, 0), Iota(16), Iota(16));
  EXPECT_TRUE(EvictionPolicy(0, 16, false).Victims(s.index, s.last.data(), 20).empty());
  EXPECT_TRUE(EvictionPolicy().Victims(s.index, s.last.data(), 20).empty());
}

TEST(EvictionPolicyTest, LruEvictsTheLeastRecentlyPushedDownToFifteenSixteenths) {
  // 20 rows, capacity 16: 15 stay. Row r last pushed at tick r; counts favour the old rows.
  std::vector<uint32_t> counts(20);
  for (uint32_t r = 0; r < 20; ++r) counts[r] = 100 - r;
  Stripe s(counts, Iota(20), Iota(20));
  EXPECT_EQ(Keys(EvictionPolicy(0, 16, false).Victims(s.index, s.last.data(), 20)),
            (std::vector<int64_t>{1000, 1001, 1002, 1003, 1004}));
  // Equal ticks: fewer updates go first.
  Stripe same(counts, std::vector<uint32_t>(20, 7), Iota(20));
  EXPECT_EQ(Keys(EvictionPolicy(0, 16, false).Victims(same.index, same.last.data(), 20)),
            (std::vector<int64_t>{1015, 1016, 1017, 1018, 1019}));
}

TEST(EvictionPolicyTest, LfuEvictsTheLeastUpdatedButNotRowsPushedNow) {
  // Rows 0-4 have no updates but were pushed at the current tick (new rows): they stay; of the
  // others, the five least updated go.
  std::vector<uint32_t> counts(20), last(20, 3);
  for (uint32_t r = 0; r < 20; ++r) counts[r] = r < 5 ? 0 : r;
  for (uint32_t r = 0; r < 5; ++r) last[r] = 9;
  Stripe s(counts, last, Iota(20));
  EXPECT_EQ(Keys(EvictionPolicy(0, 16, true).Victims(s.index, s.last.data(), /*now=*/9)),
            (std::vector<int64_t>{1005, 1006, 1007, 1008, 1009}));
}

TEST(EvictionPolicyTest, TiesGoByTheKeysHashWhateverTheOrderInMemory) {
  // Every row alike: the choice is by the hash of the key, the same for any insertion order.
  const std::vector<uint32_t> counts(40, 1), last(40, 2);
  Stripe a(counts, last, Iota(40)), b(counts, last, Iota(40, /*reversed=*/true));
  const EvictionPolicy p(0, 32, false);
  const std::vector<int64_t> from_a = Keys(p.Victims(a.index, a.last.data(), 5));
  EXPECT_EQ(from_a.size(), 10u);
  EXPECT_EQ(from_a, Keys(p.Victims(b.index, b.last.data(), 5)));
}

}  // namespace
}  // namespace pscluster
