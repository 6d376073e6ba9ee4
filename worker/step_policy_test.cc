#include "worker/step_policy.h"

#include "gtest/gtest.h"

namespace pscluster {
namespace {

StepGrant Grant(int64_t step, int64_t generation = 0) {
  StepGrant g;
  g.step = step;
  g.generation = generation;
  return g;
}

TEST(StepPolicyTest, SyncTheGlobalStepPicksTheBatchAndTheEnd) {
  auto p = NewStepPolicy(v1::SYNC, /*batches_per_epoch=*/4, /*epochs=*/2, /*max_steps=*/0);
  EXPECT_FALSE(p->allows_overlap());
  EXPECT_TRUE(p->report_every_step());
  StepPlan plan = p->Plan(Grant(5));
  EXPECT_FALSE(plan.end);
  EXPECT_EQ(plan.tag, 5);
  EXPECT_EQ(plan.pull_step, 5);
  EXPECT_EQ(plan.epoch, 1);
  EXPECT_EQ(plan.batch, 1);
  p->Done(plan);
  EXPECT_EQ(p->last_done(), 5);
  EXPECT_EQ(p->steps_done(), 6);
  EXPECT_TRUE(p->Plan(Grant(8)).end);  // 2 epochs of 4 batches
  StepGrant finished = Grant(6);
  finished.finished = true;
  EXPECT_TRUE(p->Plan(finished).end);
}

// A recovery sends the global step back: a new generation, and the worker's position follows.
TEST(StepPolicyTest, SyncANewGenerationResetsThePosition) {
  auto p = NewStepPolicy(v1::SYNC, 10, 5, 0);
  for (int64_t s = 0; s < 7; ++s) p->Done(p->Plan(Grant(s)));
  EXPECT_EQ(p->last_done(), 6);
  StepPlan back = p->Plan(Grant(4, /*generation=*/1));
  EXPECT_TRUE(back.new_generation);
  EXPECT_EQ(back.tag, 4);
  EXPECT_EQ(back.batch, 4);  // the same batch as the first time
  EXPECT_EQ(p->last_done(), 3);
  EXPECT_EQ(p->generation(), 1);
  p->Done(back);
  EXPECT_FALSE(p->Plan(Grant(5, 1)).new_generation);
}

TEST(StepPolicyTest, AsyncWalksItsOwnEpochsAndNumbersItsSteps) {
  auto p = NewStepPolicy(v1::ASYNC, 3, 2, 0);
  EXPECT_TRUE(p->allows_overlap());
  EXPECT_FALSE(p->report_every_step());
  for (int64_t s = 0; s < 6; ++s) {
    // The gate's step is whatever; the worker numbers its own.
    StepPlan plan = p->Plan(Grant(100 + s));
    ASSERT_FALSE(plan.end) << s;
    EXPECT_EQ(plan.tag, s);
    EXPECT_EQ(plan.pull_step, -1);
    EXPECT_EQ(plan.epoch, s / 3);
    EXPECT_EQ(plan.batch, s % 3);
    p->Done(plan);
  }
  EXPECT_TRUE(p->Plan(Grant(0)).end);
  EXPECT_EQ(p->steps_done(), 6);
}

TEST(StepPolicyTest, SspTagsWithTheChiefsStepAndStopsAtMaxSteps) {
  auto p = NewStepPolicy(v1::SSP, 100, 1, /*max_steps=*/2);
  EXPECT_TRUE(p->report_every_step());
  StepPlan plan = p->Plan(Grant(0));
  EXPECT_EQ(plan.tag, 0);
  p->Done(plan);
  plan = p->Plan(Grant(1));
  EXPECT_EQ(plan.tag, 1);
  EXPECT_EQ(plan.batch, 1);
  p->Done(plan);
  EXPECT_EQ(p->last_done(), 1);
  EXPECT_TRUE(p->Plan(Grant(2)).end);
}

}  // namespace
}  // namespace pscluster
