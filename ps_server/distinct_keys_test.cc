#include "ps_server/distinct_keys.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(FirstOccurrenceIndexTest, RecordsTheFirstPositionOfEachKey) {
  FirstOccurrenceIndex index;
  index.Reset(100);
  for (int64_t k = 0; k < 100; ++k) EXPECT_EQ(index.FindOrInsert(k * 7919, k), k);
  for (int64_t k = 0; k < 100; ++k) EXPECT_EQ(index.FindOrInsert(k * 7919, 1000 + k), k);
  index.Reset(4);
  EXPECT_EQ(index.FindOrInsert(7919, 3), 3) << "Reset forgets";
}

TEST(DistinctKeysTest, SumsRepeatsInOrderOfPositionAndLeavesSinglesInPlace) {
  // Keys at positions 0..5 (the part's order: 5, 0, 2, 3, 1, 4), rows of 2 floats.
  const std::vector<int64_t> keys = {10, 20, 10, 30, 10, 20};
  const std::vector<float> grads = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  const std::vector<int64_t> order = {5, 0, 2, 3, 1, 4};
  DistinctKeys d;
  ASSERT_EQ(d.List(keys.data(), grads.data(), order.data(), 6, /*dim=*/2), 3);
  EXPECT_EQ(d.keys[0], 20);  // first in the part's order
  EXPECT_EQ(d.keys[1], 10);
  EXPECT_EQ(d.keys[2], 30);
  // 20: positions 5 then 1; 10: positions 0, 2, 4 in that order; 30 once, not copied.
  EXPECT_EQ(d.grads[0][0], 11 + 3);
  EXPECT_EQ(d.grads[0][1], 12 + 4);
  EXPECT_EQ(d.grads[1][0], 1 + 5 + 9);
  EXPECT_EQ(d.grads[1][1], 2 + 6 + 10);
  EXPECT_EQ(d.grads[2], grads.data() + 3 * 2);
  EXPECT_EQ(grads[0], 1) << "the request's rows are not written";

  // Reused for a part of another dim: nothing left of the first.
  const std::vector<int64_t> more = {5, 5};
  const std::vector<float> g3 = {1, 1, 1, 2, 2, 2};
  const std::vector<int64_t> in_order = {0, 1};
  ASSERT_EQ(d.List(more.data(), g3.data(), in_order.data(), 2, /*dim=*/3), 1);
  EXPECT_EQ(d.grads[0][2], 3);
}

}  // namespace
}  // namespace pscluster
