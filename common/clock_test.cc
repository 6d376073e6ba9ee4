#include "common/clock.h"

#include <thread>

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

TEST(FakeClockTest, BlockingWaitsEndOnlyWhenAdvancedOrSatisfied) {
  FakeClock clock(absl::UnixEpoch(), FakeClock::Waits::kBlock);
  absl::Mutex mu;
  bool ready = false;
  bool timed_out = false;
  // Ends at the deadline: only when the clock is advanced to it, however long that takes.
  std::thread waiter([&] {
    absl::MutexLock lock(&mu);
    timed_out = !clock.AwaitWithDeadline(&mu, absl::Condition(&ready),
                                         absl::UnixEpoch() + absl::Seconds(10));
  });
  absl::SleepFor(absl::Milliseconds(50));
  clock.Advance(absl::Seconds(9));
  absl::SleepFor(absl::Milliseconds(50));
  {
    absl::MutexLock lock(&mu);
    EXPECT_FALSE(timed_out);
  }
  clock.Advance(absl::Seconds(1));
  waiter.join();
  EXPECT_TRUE(timed_out);
  EXPECT_EQ(clock.Now(), absl::UnixEpoch() + absl::Seconds(10));  // not moved by the wait

  // Ends when another thread makes the condition true, with the clock where it was.
  std::thread satisfied([&] {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(clock.AwaitWithDeadline(&mu, absl::Condition(&ready), absl::InfiniteFuture()));
  });
  absl::SleepFor(absl::Milliseconds(20));
  {
    absl::MutexLock lock(&mu);
    ready = true;
  }
  satisfied.join();

  // kJump from then on: an unsatisfiable wait returns at once.
  clock.set_waits(FakeClock::Waits::kJump);
  absl::MutexLock lock(&mu);
  ready = false;
  EXPECT_FALSE(clock.AwaitWithDeadline(&mu, absl::Condition(&ready), absl::InfiniteFuture()));
}

}  // namespace
}  // namespace pscluster
