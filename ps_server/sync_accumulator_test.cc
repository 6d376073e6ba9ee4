#include "ps_server/sync_accumulator.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;

TEST(DenseAccumulatorTest, AveragesReplicasOnceThenDropsStale) {
  DenseAccumulator acc(2, 3);
  std::vector<float> mean;
  const float g0[] = {1, 2}, g1[] = {3, 4}, g2[] = {5, 9};
  EXPECT_EQ(acc.Add(0, 0, g0, &mean), AccumulateOutcome::kAccumulated);
  EXPECT_EQ(acc.Add(0, 0, g1, &mean), AccumulateOutcome::kDuplicate);  // same worker again
  EXPECT_EQ(acc.Add(0, 1, g1, &mean), AccumulateOutcome::kAccumulated);
  EXPECT_EQ(acc.Add(0, 2, g2, &mean), AccumulateOutcome::kComplete);
  EXPECT_THAT(mean, ElementsAre(3.0f, 5.0f));
  EXPECT_EQ(acc.step(), 1);
  // A backup worker's gradient of step 0 arrives late: dropped, never applied.
  EXPECT_EQ(acc.Add(0, 3, g2, &mean), AccumulateOutcome::kStale);
  EXPECT_EQ(acc.Add(1, 0, g0, &mean), AccumulateOutcome::kAccumulated);
}

TEST(DenseAccumulatorTest, SetStepStartsOverAndNewerStepsAreDropped) {
  DenseAccumulator acc(1, 2);
  std::vector<float> mean;
  const float a[] = {10}, b[] = {2}, c[] = {4};
  EXPECT_EQ(acc.Add(7, 0, a, &mean), AccumulateOutcome::kAhead);  // step 0 is current
  EXPECT_EQ(acc.Add(0, 0, a, &mean), AccumulateOutcome::kAccumulated);
  // A recovery sets the step (to a checkpoint's): the part of the old step is gone.
  acc.SetStep(5);
  EXPECT_EQ(acc.Add(6, 1, b, &mean), AccumulateOutcome::kAhead);
  EXPECT_EQ(acc.Add(5, 1, b, &mean), AccumulateOutcome::kAccumulated);
  EXPECT_EQ(acc.Add(5, 0, c, &mean), AccumulateOutcome::kComplete);
  EXPECT_THAT(mean, ElementsAre(3.0f));
  EXPECT_EQ(acc.step(), 6);
}

TEST(SparseAccumulatorTest, AveragesPerKeyOverTheGradientsThatHaveIt) {
  SparseAccumulator acc(1, 2);
  std::vector<int64_t> keys;
  std::vector<float> mean;
  const int64_t k0[] = {7, 8, 7};  // key 7 twice in one gradient: summed, counted once
  const float g0[] = {1, 10, 3};
  const int64_t k1[] = {7};
  const float g1[] = {6};
  EXPECT_EQ(acc.Add(0, 0, k0, 3, g0, &keys, &mean), AccumulateOutcome::kAccumulated);
  EXPECT_EQ(acc.Add(0, 1, k1, 1, g1, &keys, &mean), AccumulateOutcome::kComplete);
  ASSERT_EQ(keys.size(), 2u);
  for (size_t i = 0; i < keys.size(); ++i) {
    // Key 7: (1 + 3 + 6) / 2 gradients; key 8: 10 / 1 gradient.
    EXPECT_FLOAT_EQ(mean[i], keys[i] == 7 ? 5.0f : 10.0f) << keys[i];
  }
  EXPECT_EQ(acc.Add(0, 2, k1, 1, g1, &keys, &mean), AccumulateOutcome::kStale);
  EXPECT_EQ(acc.Add(2, 2, k1, 1, g1, &keys, &mean), AccumulateOutcome::kAhead);
  acc.SetStep(2);
  EXPECT_EQ(acc.Add(2, 2, k1, 1, g1, &keys, &mean), AccumulateOutcome::kAccumulated);
}

}  // namespace
}  // namespace pscluster
