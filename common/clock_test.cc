#include "common/clock.h"

#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(FakeClockTest, MovesOnlyWhenAdvanced) {
  FakeClock clock;
  const absl::Time t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(absl::Seconds(5));
  EXPECT_EQ(clock.Now(), t0 + absl::Seconds(5));
}

TEST(FakeClockTest, AwaitReturnsAtOnceWhenConditionHoldsOrDeadlinePassed) {
  FakeClock clock;
  absl::Mutex mu;
  bool ready = true;
  absl::MutexLock lock(&mu);
  EXPECT_TRUE(clock.AwaitWithDeadline(&mu, absl::Condition(&ready), clock.Now()));
  ready = false;
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&ready), clock.Now()));
  // An unsatisfiable wait jumps the clock to its deadline.
  const absl::Time deadline = clock.Now() + absl::Minutes(3);
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&ready), deadline));
  EXPECT_EQ(clock.Now(), deadline);
}

}  // namespace
}  // namespace pscluster
