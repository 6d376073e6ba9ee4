#include "chief/sync_coordinator.h"

#include <thread>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

SyncCoordinatorOptions Sync(int workers, int aggregate) {
  SyncCoordinatorOptions o;
  o.num_workers = workers;
  o.replicas_to_aggregate = aggregate;
  return o;
}

TEST(SyncCoordinatorTest, StepAdvancesOnceEnoughDistinctWorkersReport) {
  FakeClock clock;
  SyncCoordinator sync(Sync(3, 3), &clock);
  SyncCoordinator::Token t = sync.AcquireToken(0, -1, 0, clock.Now());
  ASSERT_TRUE(t.granted);
  EXPECT_EQ(t.step, 0);
  EXPECT_TRUE(sync.ReportStep(0, 0, 0));
  // A repeated report of the same worker does not count twice.
  EXPECT_FALSE(sync.ReportStep(0, 0, 0));
  EXPECT_TRUE(sync.ReportStep(1, 0, 0));
  EXPECT_EQ(sync.global_step(), 0);
  EXPECT_EQ(sync.waiting_for(), std::vector<int>{2});
  // Worker 0 must wait for step 1: its deadline passes on the fake clock.
  EXPECT_FALSE(sync.AcquireToken(0, 0, 0, clock.Now() + absl::Seconds(1)).granted);
  EXPECT_TRUE(sync.ReportStep(2, 0, 0));
  EXPECT_EQ(sync.global_step(), 1);
  t = sync.AcquireToken(0, 0, 0, clock.Now());
  ASSERT_TRUE(t.granted);
  EXPECT_EQ(t.step, 1);
}

TEST(SyncCoordinatorTest, ATokenRequestAfterTheStepCountsAsItsReport) {
  FakeClock clock;
  SyncCoordinator sync(Sync(2, 2), &clock);
  sync.SetGlobalStep(7);  // a restarted chief; worker 1's report of step 7 went to the old one
  EXPECT_TRUE(sync.ReportStep(0, 7, 0));
  SyncCoordinator::Token t = sync.AcquireToken(1, 7, 0, clock.Now());
  ASSERT_TRUE(t.granted);
  EXPECT_EQ(t.step, 8);
}

TEST(SyncCoordinatorTest, BackupWorkersLateReportsAreDroppedAndCounted) {
  FakeClock clock;
  SyncCoordinator sync(Sync(3, 2), &clock);
  EXPECT_TRUE(sync.ReportStep(0, 0, 0));
  EXPECT_TRUE(sync.ReportStep(1, 0, 0));
  EXPECT_EQ(sync.global_step(), 1);
  EXPECT_FALSE(sync.ReportStep(2, 0, 0));  // the slow one, too late
  EXPECT_EQ(sync.dropped_per_worker().at(2), 1);
  // The late worker gets the current step next, not the one it missed.
  SyncCoordinator::Token t = sync.AcquireToken(2, 0, 0, clock.Now());
  ASSERT_TRUE(t.granted);
  EXPECT_EQ(t.step, 1);
}

// A recovery restores the ps tasks to the checkpoint of step 5 while the workers are at step
// 9: the next token of every worker is step 5, and what they report meanwhile (computed before
// the rewind) does not count.
TEST(SyncCoordinatorTest, ARewindSendsEveryWorkerBackToTheCheckpointStep) {
  FakeClock clock;
  SyncCoordinator sync(Sync(2, 2), &clock);
  sync.SetGlobalStep(9);
  EXPECT_TRUE(sync.ReportStep(0, 9, 0));
  EXPECT_FALSE(sync.ReportStep(1, 10, 0));              // ahead of the global step: never counts
  ASSERT_FALSE(sync.PauseAtStepBoundary(clock.Now()));  // step 9 is half done
  sync.Rewind(5);
  EXPECT_FALSE(sync.AcquireToken(0, 9, 0, clock.Now() + absl::Seconds(1)).granted);  // paused
  sync.Resume();
  // Worker 1 finished step 9 of the abandoned run: neither its report nor its implicit report
  // (a token request with last step == 9) counts, for step 5 or anything.
  EXPECT_FALSE(sync.ReportStep(1, 5, 0));
  EXPECT_EQ(sync.global_step(), 5);
  SyncCoordinator::Token t = sync.AcquireToken(1, 9, 0, clock.Now());
  ASSERT_TRUE(t.granted);
  EXPECT_EQ(t.step, 5);
  EXPECT_EQ(t.generation, 1);
  // The answer may be lost on the way (the worker's deadline passed): asking again with the
  // old generation gets the same token.
  t = sync.AcquireToken(1, 9, 0, clock.Now());
  ASSERT_TRUE(t.granted);
  EXPECT_EQ(t.step, 5);
  // Worker 1's step 5 failed (a ps task still unreachable): asking again in generation 1 with
  // the last step it had done in generation 0 gets step 5 again.
  t = sync.AcquireToken(1, 9, 1, clock.Now());
  ASSERT_TRUE(t.granted);
  EXPECT_EQ(t.step, 5);
  // A worker that had done step 4 (or nothing, after its own restart) also gets 5.
  t = sync.AcquireToken(0, -1, 0, clock.Now());
  ASSERT_TRUE(t.granted);
  EXPECT_EQ(t.step, 5);
  // From here on, the usual rules, in generation 1.
  EXPECT_TRUE(sync.ReportStep(0, 5, 1));
  EXPECT_FALSE(sync.AcquireToken(0, 5, 1, clock.Now() + absl::Seconds(1)).granted);
  EXPECT_TRUE(sync.ReportStep(1, 5, 1));
  t = sync.AcquireToken(0, 5, 1, clock.Now());
  ASSERT_TRUE(t.granted);
  EXPECT_EQ(t.step, 6);
}

// A checkpoint's cut waits until no worker holds a token of the current step: a step that
// workers have started but nobody has reported yet is not a boundary.
TEST(SyncCoordinatorTest, AStepWithTokensOutIsNotABoundary) {
  FakeClock clock;
  SyncCoordinator sync(Sync(2, 2), &clock);
  ASSERT_TRUE(sync.AcquireToken(0, -1, 0, clock.Now()).granted);  // worker 0 starts step 0
  EXPECT_FALSE(sync.PauseAtStepBoundary(clock.Now() + absl::Seconds(1)));
  // Paused: worker 1 gets no token; the step closes with both reports and the cut is there.
  EXPECT_FALSE(sync.AcquireToken(1, -1, 0, clock.Now() + absl::Seconds(1)).granted);
  sync.Resume();
  ASSERT_TRUE(sync.AcquireToken(1, -1, 0, clock.Now()).granted);
  EXPECT_TRUE(sync.ReportStep(0, 0, 0));
  EXPECT_TRUE(sync.ReportStep(1, 0, 0));
  EXPECT_TRUE(sync.PauseAtStepBoundary(clock.Now()));
  EXPECT_EQ(sync.global_step(), 1);
}

// Checkpoints every N steps cut exactly at step N: the coordinator stops granting tokens by
// itself when the step is reached.
TEST(SyncCoordinatorTest, PauseAtStepStopsExactlyThere) {
  FakeClock clock;
  SyncCoordinator sync(Sync(1, 1), &clock);
  sync.PauseAtStep(2);
  for (int64_t step = 0; step < 2; ++step) {
    SyncCoordinator::Token t = sync.AcquireToken(0, step - 1, 0, clock.Now());
    ASSERT_TRUE(t.granted);
    EXPECT_EQ(t.step, step);
    EXPECT_TRUE(sync.ReportStep(0, step, 0));
  }
  EXPECT_TRUE(sync.AwaitStep(2, clock.Now()));
  EXPECT_FALSE(sync.AcquireToken(0, 1, 0, clock.Now() + absl::Seconds(1)).granted);
  EXPECT_TRUE(sync.PauseAtStepBoundary(clock.Now()));
  EXPECT_EQ(sync.global_step(), 2);
  sync.Resume();
  EXPECT_TRUE(sync.AcquireToken(0, 1, 0, clock.Now()).granted);
  EXPECT_FALSE(sync.AwaitStep(3, clock.Now() + absl::Seconds(1)));
}

TEST(SyncCoordinatorTest, PauseHoldsTokensAndWaitsForTheStepBoundary) {
  FakeClock clock;
  SyncCoordinator sync(Sync(2, 2), &clock);
  sync.ReportStep(0, 0, 0);  // step 0 half done: not a boundary
  EXPECT_FALSE(sync.PauseAtStepBoundary(clock.Now() + absl::Seconds(1)));
  sync.ReportStep(1, 0, 0);  // step 0 closes
  EXPECT_TRUE(sync.PauseAtStepBoundary(clock.Now()));
  EXPECT_FALSE(sync.AcquireToken(0, 0, 0, clock.Now() + absl::Seconds(1)).granted);
  sync.Resume();
  EXPECT_TRUE(sync.AcquireToken(0, 0, 0, clock.Now()).granted);
}

TEST(SyncCoordinatorTest, AWaiterWakesWhenTheStepCloses) {
  SyncCoordinator sync(Sync(2, 2), Clock::Real());
  sync.ReportStep(0, 0, 0);
  std::thread waiter([&] {
    SyncCoordinator::Token t = sync.AcquireToken(0, 0, 0, absl::Now() + absl::Seconds(30));
    EXPECT_TRUE(t.granted);
    EXPECT_EQ(t.step, 1);
  });
  sync.ReportStep(1, 0, 0);
  waiter.join();
}

TEST(SyncCoordinatorTest, FinishingWorkersEndTheWaitWhenTooFewRemain) {
  FakeClock clock;
  SyncCoordinator sync(Sync(2, 2), &clock);
  sync.ReportStep(0, 0, 0);
  sync.WorkerFinished(1);
  SyncCoordinator::Token t = sync.AcquireToken(0, 0, 0, clock.Now());
  EXPECT_TRUE(t.finished);
}

TEST(SyncCoordinatorTest, ALateWorkerStillGetsTheOpenStepAfterTheOtherFinished) {
  FakeClock clock;
  SyncCoordinator sync(Sync(2, 2), &clock);
  // Step 0 is open; worker 0 does it and runs out of data before worker 1 asks for its token.
  sync.ReportStep(0, 0, 0);
  sync.WorkerFinished(0);
  SyncCoordinator::Token t = sync.AcquireToken(1, -1, 0, clock.Now());
  ASSERT_TRUE(t.granted);
  EXPECT_FALSE(t.finished);
  EXPECT_EQ(t.step, 0);
  EXPECT_TRUE(sync.ReportStep(1, 0, 0));
  EXPECT_EQ(sync.global_step(), 1);
  EXPECT_TRUE(sync.AcquireToken(1, 0, 0, clock.Now()).finished);
}

TEST(SyncCoordinatorTest, SspKeepsTheFastestWithinTheBound) {
  FakeClock clock;
  SyncCoordinatorOptions o;
  o.num_workers = 2;
  o.staleness = 2;
  SyncCoordinator ssp(o, &clock);
  // Worker 0 may run steps 0, 1, 2 while worker 1 has done none.
  for (int64_t done = -1; done < 2; ++done) {
    SyncCoordinator::Token t = ssp.AcquireToken(0, done, 0, clock.Now());
    ASSERT_TRUE(t.granted) << done;
    EXPECT_EQ(t.step, done + 1);
    ssp.ReportStep(0, done + 1, 0);
  }
  EXPECT_FALSE(ssp.AcquireToken(0, 2, 0, clock.Now() + absl::Seconds(1)).granted);
  EXPECT_EQ(ssp.waiting_for(), std::vector<int>{1});
  EXPECT_EQ(ssp.max_lead(), 2);
  ssp.ReportStep(1, 0, 0);
  EXPECT_TRUE(ssp.AcquireToken(0, 2, 0, clock.Now()).granted);
  // With k = 0 every step is a barrier.
  o.staleness = 0;
  SyncCoordinator barrier(o, &clock);
  EXPECT_TRUE(barrier.AcquireToken(0, -1, 0, clock.Now()).granted);
  barrier.ReportStep(0, 0, 0);
  EXPECT_FALSE(barrier.AcquireToken(0, 0, 0, clock.Now()).granted);
  barrier.ReportStep(1, 0, 0);
  EXPECT_TRUE(barrier.AcquireToken(0, 0, 0, clock.Now()).granted);
}

}  // namespace
}  // namespace pscluster
