#include "chief/step_gate.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(StepGateTest, CloseWaitsForTheStepsUnderWayAndHoldsNewOnes) {
  FakeClock clock;
  StepGate gate(&clock);
  ASSERT_TRUE(gate.Pass(0, clock.Now()));
  ASSERT_TRUE(gate.Pass(1, clock.Now()));
  EXPECT_THAT(gate.inside(), ElementsAre(0, 1));
  // Both are inside a step: no boundary yet (the fake clock jumps to the deadline).
  EXPECT_FALSE(gate.Close(clock.Now() + absl::Seconds(1)));
  // Worker 0 comes back for its next step: held, and no longer inside one.
  EXPECT_FALSE(gate.Pass(0, clock.Now() + absl::Seconds(1)));
  EXPECT_THAT(gate.inside(), ElementsAre(1));
  // Worker 1 finishes training: the cut is there.
  gate.Leave(1);
  EXPECT_TRUE(gate.Close(clock.Now()));
  EXPECT_THAT(gate.inside(), IsEmpty());
  gate.Open();
  EXPECT_TRUE(gate.Pass(0, clock.Now()));
  EXPECT_THAT(gate.inside(), ElementsAre(0));
}

}  // namespace
}  // namespace pscluster
