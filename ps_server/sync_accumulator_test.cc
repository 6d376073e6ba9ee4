#include "ps_server/sync_accumulator.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

// Records what is applied.
struct Applied {
  std::vector<std::vector<float>> means;
  DenseAccumulator::ApplyFn fn(int64_t n) {
    return [this, n](const float* mean) { means.emplace_back(mean, mean + n); };
  }
};

TEST(DenseAccumulatorTest, AveragesReplicasOnceThenDropsStale) {
  DenseAccumulator acc(2, 3);
  Applied applied;
  const auto apply = applied.fn(2);
  const float g0[] = {1, 2}, g1[] = {3, 4}, g2[] = {5, 9};
  EXPECT_EQ(acc.Add(0, 0, g0, apply), AccumulateOutcome::kAccumulated);
  EXPECT_EQ(acc.Add(0, 0, g1, apply), AccumulateOutcome::kDuplicate);  // same worker again
  EXPECT_EQ(acc.Add(0, 1, g1, apply), AccumulateOutcome::kAccumulated);
  EXPECT_EQ(acc.Add(0, 2, g2, apply), AccumulateOutcome::kComplete);
  EXPECT_EQ(acc.step(), 1);
  // Complete but pending: a pull for step 0 itself does not apply it, a later one does, once.
  EXPECT_FALSE(acc.Settle(0, apply));
  EXPECT_THAT(applied.means, IsEmpty());
  EXPECT_TRUE(acc.Settle(1, apply));
  EXPECT_FALSE(acc.Settle(-1, apply));
  ASSERT_EQ(applied.means.size(), 1u);
  EXPECT_THAT(applied.means[0], ElementsAre(3.0f, 5.0f));
  // A backup worker's gradient of step 0 arrives late: dropped, never applied.
  EXPECT_EQ(acc.Add(0, 3, g2, apply), AccumulateOutcome::kStale);
  EXPECT_EQ(acc.Add(1, 0, g0, apply), AccumulateOutcome::kAccumulated);
}

TEST(DenseAccumulatorTest, TheNextStepsFirstGradientAppliesThePendingStep) {
  DenseAccumulator acc(1, 1);
  Applied applied;
  const auto apply = applied.fn(1);
  const float a[] = {10}, b[] = {2};
  EXPECT_EQ(acc.Add(0, 0, a, apply), AccumulateOutcome::kComplete);
  EXPECT_THAT(applied.means, IsEmpty());
  EXPECT_EQ(acc.Add(1, 0, b, apply), AccumulateOutcome::kComplete);
  ASSERT_EQ(applied.means.size(), 1u);  // step 0's, before step 1's gradient was taken
  EXPECT_THAT(applied.means[0], ElementsAre(10.0f));
  EXPECT_TRUE(acc.Settle(-1, apply));
  EXPECT_THAT(applied.means[1], ElementsAre(2.0f));
}

TEST(DenseAccumulatorTest, SetStepStartsOverAndNewerStepsAreDropped) {
  DenseAccumulator acc(1, 2);
  Applied applied;
  const auto apply = applied.fn(1);
  const float a[] = {10}, b[] = {2}, c[] = {4};
  EXPECT_EQ(acc.Add(7, 0, a, apply), AccumulateOutcome::kAhead);  // step 0 is current
  EXPECT_EQ(acc.Add(0, 0, a, apply), AccumulateOutcome::kAccumulated);
  // A recovery sets the step (to a checkpoint's): the part of the old step is gone.
  acc.SetStep(5);
  EXPECT_EQ(acc.Add(6, 1, b, apply), AccumulateOutcome::kAhead);
  EXPECT_EQ(acc.Add(5, 1, b, apply), AccumulateOutcome::kAccumulated);
  EXPECT_EQ(acc.Add(5, 0, c, apply), AccumulateOutcome::kComplete);
  EXPECT_EQ(acc.step(), 6);
  // SetStep also drops a pending step.
  acc.SetStep(5);
  EXPECT_FALSE(acc.Settle(-1, apply));
  EXPECT_THAT(applied.means, IsEmpty());
}

TEST(SparseAccumulatorTest, AveragesPerKeyOverTheGradientsThatHaveIt) {
  SparseAccumulator acc(1, 2);
  std::vector<int64_t> keys;
  std::vector<float> mean;
  const SparseAccumulator::ApplyFn apply = [&](int64_t, const int64_t* k, int64_t n,
                                               const float* m) {
    keys.assign(k, k + n);
    mean.assign(m, m + n);
  };
  const int64_t k0[] = {7, 8, 7};  // key 7 twice in one gradient: summed, counted once
  const float g0[] = {1, 10, 3};
  const int64_t k1[] = {7};
  const float g1[] = {6};
  EXPECT_EQ(acc.Add(0, 0, k0, 3, g0, apply), AccumulateOutcome::kAccumulated);
  EXPECT_EQ(acc.Add(0, 1, k1, 1, g1, apply), AccumulateOutcome::kComplete);
  EXPECT_TRUE(keys.empty());  // pending
  EXPECT_FALSE(acc.Settle(0, apply));
  EXPECT_TRUE(acc.Settle(1, apply));
  ASSERT_EQ(keys.size(), 2u);
  for (size_t i = 0; i < keys.size(); ++i) {
    // Key 7: (1 + 3 + 6) / 2 gradients; key 8: 10 / 1 gradient.
    EXPECT_FLOAT_EQ(mean[i], keys[i] == 7 ? 5.0f : 10.0f) << keys[i];
  }
  EXPECT_EQ(acc.Add(0, 2, k1, 1, g1, apply), AccumulateOutcome::kStale);
  EXPECT_EQ(acc.Add(2, 2, k1, 1, g1, apply), AccumulateOutcome::kAhead);
  acc.SetStep(2);
  EXPECT_EQ(acc.Add(2, 2, k1, 1, g1, apply), AccumulateOutcome::kAccumulated);
}

}  // namespace
}  // namespace pscluster
