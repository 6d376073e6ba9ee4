#include "chief/step_gate.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using Result = StepGate::Result;

TEST(StepGateTest, CloseWaitsForTheStepsUnderWayAndHoldsNewOnes) {
  FakeClock clock;
  StepGate gate(&clock);
  ASSERT_EQ(gate.Pass(0, clock.Now()), Result::kPassed);
  ASSERT_EQ(gate.Pass(1, clock.Now()), Result::kPassed);
  EXPECT_THAT(gate.inside(), ElementsAre(0, 1));
  // Both are inside a step: no boundary yet (the fake clock jumps to the deadline).
  EXPECT_FALSE(gate.Close(clock.Now() + absl::Seconds(1)));
  // Worker 0 comes back for its next step: held, and no longer inside one.
  EXPECT_EQ(gate.Pass(0, clock.Now() + absl::Seconds(1)), Result::kTimedOut);
  EXPECT_THAT(gate.inside(), ElementsAre(1));
  // Worker 1 finishes training: the cut is there.
  gate.Leave(1);
  EXPECT_TRUE(gate.Close(clock.Now()));
  EXPECT_THAT(gate.inside(), IsEmpty());
  gate.Open();
  EXPECT_EQ(gate.Pass(0, clock.Now()), Result::kPassed);
  EXPECT_THAT(gate.inside(), ElementsAre(0));
}

// A pipelined worker asks for its next step while the last one's pushes are in flight: it stays
// inside the gate (no cut while it pushes), goes on at once while the gate is open, and is told
// to drain while it is closed; once it has drained it is out, and the cut is there.
TEST(StepGateTest, AWorkerWithPushesInFlightStaysInsideAndDrainsWhenClosed) {
  FakeClock clock;
  StepGate gate(&clock);
  ASSERT_EQ(gate.Pass(0, clock.Now()), Result::kPassed);
  ASSERT_EQ(gate.Pass(0, clock.Now(), /*pushes_in_flight=*/1), Result::kPassed);
  EXPECT_THAT(gate.inside(), ElementsAre(0));
  EXPECT_FALSE(gate.Close(clock.Now() + absl::Seconds(1)));
  EXPECT_TRUE(gate.closed());
  EXPECT_EQ(gate.Pass(0, clock.Now() + absl::Seconds(1), 1), Result::kDrain);
  EXPECT_THAT(gate.inside(), ElementsAre(0));  // still pushing: no cut yet
  EXPECT_EQ(gate.Pass(0, clock.Now() + absl::Seconds(1), 0), Result::kTimedOut);
  EXPECT_THAT(gate.inside(), IsEmpty());
  EXPECT_TRUE(gate.Close(clock.Now()));
}

}  // namespace
}  // namespace pscluster
