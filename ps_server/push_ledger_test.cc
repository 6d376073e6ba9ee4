#include "ps_server/push_ledger.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

v1::RequestId Id(uint64_t client, uint64_t seq) {
  v1::RequestId id;
  id.set_client(client);
  id.set_seq(seq);
  return id;
}

TEST(PushLedgerTest, ARecordedPushIsADuplicateWithItsOutcome) {
  PushLedger ledger(8, 8);
  PushOutcome outcome;
  ASSERT_EQ(ledger.Begin(Id(7, 1), &outcome), PushLedger::Claim::kNew);
  ledger.Record(Id(7, 1), PushOutcome{3, 1});
  ASSERT_EQ(ledger.Begin(Id(7, 1), &outcome), PushLedger::Claim::kDuplicate);
  EXPECT_EQ(outcome.accepted, 3);
  EXPECT_EQ(outcome.dropped_stale, 1);
  // Another sequence number, or another client with the same one, is new.
  EXPECT_EQ(ledger.Begin(Id(7, 2), &outcome), PushLedger::Claim::kNew);
  EXPECT_EQ(ledger.Begin(Id(8, 1), &outcome), PushLedger::Claim::kNew);
}

TEST(PushLedgerTest, AReleasedPushMayBeAppliedByItsRetry) {
  PushLedger ledger(8, 8);
  PushOutcome outcome;
  ASSERT_EQ(ledger.Begin(Id(7, 1), &outcome), PushLedger::Claim::kNew);
  ledger.Release(Id(7, 1));  // refused before anything changed
  EXPECT_EQ(ledger.Begin(Id(7, 1), &outcome), PushLedger::Claim::kNew);
}

// A push released after part of it was applied (issue 37: a forward some of whose stripes
// waited in vain) is kept with those stripes: the next attempt learns them, a retry waiting on
// the first attempt is let go to claim it, and a further partial release adds to them.
TEST(PushLedgerTest, APartlyAppliedPushTellsItsRetryWhatWasApplied) {
  PushLedger ledger(8, 8);
  PushOutcome outcome;
  uint64_t stripes = 99;
  ASSERT_EQ(ledger.Begin(Id(7, 1), &outcome, nullptr, &stripes), PushLedger::Claim::kNew);
  EXPECT_EQ(stripes, 0u);
  PushLedger::Claim claim = PushLedger::Claim::kDuplicate;
  uint64_t retry_stripes = 0;
  std::thread retry([&] { claim = ledger.Begin(Id(7, 1), &outcome, nullptr, &retry_stripes); });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ledger.Release(Id(7, 1), 0b101);
  retry.join();
  EXPECT_EQ(claim, PushLedger::Claim::kNew);
  EXPECT_EQ(retry_stripes, 0b101u);
  ledger.Release(Id(7, 1), 0b010);
  ASSERT_EQ(ledger.Begin(Id(7, 1), &outcome, nullptr, &stripes), PushLedger::Claim::kNew);
  EXPECT_EQ(stripes, 0b111u);
  ledger.Record(Id(7, 1), PushOutcome{4, 0});
  EXPECT_EQ(ledger.Begin(Id(7, 1), &outcome, nullptr, &stripes), PushLedger::Claim::kDuplicate);
  EXPECT_EQ(outcome.accepted, 4);
}

TEST(PushLedgerTest, NoIdIsNeverRemembered) {
  PushLedger ledger(8, 8);
  PushOutcome outcome;
  EXPECT_EQ(ledger.Begin(Id(0, 1), &outcome), PushLedger::Claim::kNew);
  ledger.Record(Id(0, 1), PushOutcome{1, 0});
  EXPECT_EQ(ledger.Begin(Id(0, 1), &outcome), PushLedger::Claim::kNew);
  EXPECT_EQ(ledger.size(), 0);
}

// A retry that arrives while the first attempt is still being applied waits for it and gets
// its outcome: it is never applied a second time.
TEST(PushLedgerTest, ARetryWaitsForTheAttemptInProgress) {
  PushLedger ledger(8, 8);
  PushOutcome outcome;
  ASSERT_EQ(ledger.Begin(Id(7, 1), &outcome), PushLedger::Claim::kNew);
  std::atomic<bool> returned{false};
  PushLedger::Claim claim = PushLedger::Claim::kNew;
  PushOutcome retry_outcome;
  std::thread retry([&] {
    claim = ledger.Begin(Id(7, 1), &retry_outcome);
    returned = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load());
  ledger.Record(Id(7, 1), PushOutcome{2, 0});
  retry.join();
  EXPECT_EQ(claim, PushLedger::Claim::kDuplicate);
  EXPECT_EQ(retry_outcome.accepted, 2);
}

TEST(PushLedgerTest, IdsOlderThanTheWindowAreRefused) {
  PushLedger ledger(/*ids_per_client=*/4, 8);
  PushOutcome outcome;
  for (uint64_t seq = 1; seq <= 10; ++seq) {
    ASSERT_EQ(ledger.Begin(Id(7, seq), &outcome), PushLedger::Claim::kNew);
    ledger.Record(Id(7, seq), PushOutcome{1, 0});
  }
  EXPECT_EQ(ledger.size(), 4);
  EXPECT_EQ(ledger.Begin(Id(7, 3), &outcome), PushLedger::Claim::kTooOld);
  EXPECT_EQ(ledger.Begin(Id(7, 10), &outcome), PushLedger::Claim::kDuplicate);
}

// Rebuild (issue 37): a new backup's ledger from its primary's tells the same pushes apart:
// done ones are duplicates, ids below a client's floor too old, others new; an id the backup
// knows already keeps what it had.
TEST(PushLedgerTest, ACopiedLedgerTellsThePushesAsItsOriginalDoes) {
  PushLedger original(/*ids_per_client=*/4, 8);
  PushOutcome outcome;
  for (uint64_t seq = 1; seq <= 10; ++seq) {
    ASSERT_EQ(original.Begin(Id(7, seq), &outcome), PushLedger::Claim::kNew);
    original.Record(Id(7, seq), PushOutcome{static_cast<int32_t>(seq), 0});
  }
  ASSERT_EQ(original.Begin(Id(9, 1), &outcome), PushLedger::Claim::kNew);  // being applied
  google::protobuf::RepeatedPtrField<v1::LedgerEntry> entries;
  google::protobuf::RepeatedPtrField<v1::RequestId> floors;
  original.ExportDone(&entries, &floors);
  EXPECT_EQ(entries.size(), 4);  // 7-7 .. 7-10; 9-1 is not done
  ASSERT_EQ(floors.size(), 1);
  EXPECT_EQ(floors[0].seq(), 7u);

  PushLedger copy(/*ids_per_client=*/4, 8);
  ASSERT_EQ(copy.Begin(Id(7, 2), &outcome), PushLedger::Claim::kNew);  // below the floor, done
  copy.Record(Id(7, 2), PushOutcome{2, 0});
  ASSERT_EQ(copy.Begin(Id(7, 9), &outcome), PushLedger::Claim::kNew);  // known, done otherwise
  copy.Record(Id(7, 9), PushOutcome{99, 0});
  copy.ImportDone(entries, floors);
  EXPECT_EQ(copy.Begin(Id(7, 2), &outcome), PushLedger::Claim::kTooOld);
  EXPECT_EQ(copy.Begin(Id(7, 6), &outcome), PushLedger::Claim::kTooOld);
  ASSERT_EQ(copy.Begin(Id(7, 8), &outcome), PushLedger::Claim::kDuplicate);
  EXPECT_EQ(outcome.accepted, 8);
  ASSERT_EQ(copy.Begin(Id(7, 9), &outcome), PushLedger::Claim::kDuplicate);
  EXPECT_EQ(outcome.accepted, 99);
  EXPECT_EQ(copy.Begin(Id(9, 1), &outcome), PushLedger::Claim::kNew);
  EXPECT_EQ(copy.Begin(Id(7, 11), &outcome), PushLedger::Claim::kNew);
}

// A table push a forward applied part of (released with its stripes) stays partial when a
// dense copy's ledger names it (that copy holds none of its rows), and is done once the
// ledger of table copies names it (they hold all of it): a retry then applies nothing again.
TEST(PushLedgerTest, ATableCopysLedgerMakesAPartlyAppliedPushDone) {
  PushLedger ledger(8, 8);
  PushOutcome outcome;
  ASSERT_EQ(ledger.Begin(Id(7, 3), &outcome), PushLedger::Claim::kNew);
  ledger.Release(Id(7, 3), /*applied_stripes=*/0b1000);
  google::protobuf::RepeatedPtrField<v1::LedgerEntry> entries;
  v1::LedgerEntry* entry = entries.Add();
  *entry->mutable_id() = Id(7, 3);
  entry->set_accepted(30);
  ledger.ImportDone(entries, {});
  uint64_t stripes = 0;
  ASSERT_EQ(ledger.Begin(Id(7, 3), &outcome, nullptr, &stripes), PushLedger::Claim::kNew);
  EXPECT_EQ(stripes, 0b1000u);
  ledger.Release(Id(7, 3), stripes);
  ledger.ImportDone(entries, {}, /*over_partial=*/true);
  ASSERT_EQ(ledger.Begin(Id(7, 3), &outcome, nullptr, &stripes), PushLedger::Claim::kDuplicate);
  EXPECT_EQ(outcome.accepted, 30);
}

// A copy for a new backup exports only what it holds: pushes recorded with the number their
// apply took at or above the copy's (applied after it) are left out; pushes with no number
// (applied where nothing is numbered) go as before.
TEST(PushLedgerTest, AnExportLeavesOutWhatWasAppliedAfterTheCopy) {
  PushLedger ledger(8, 8);
  PushOutcome outcome;
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    ASSERT_EQ(ledger.Begin(Id(7, seq), &outcome), PushLedger::Claim::kNew);
  }
  ledger.Record(Id(7, 1), PushOutcome{1, 0}, nullptr, /*applied_as=*/10);
  ledger.Record(Id(7, 2), PushOutcome{1, 0}, nullptr, /*applied_as=*/11);  // after the copy
  ledger.Record(Id(7, 3), PushOutcome{1, 0});                              // not numbered
  ledger.Record(Id(7, 4), PushOutcome{1, 0}, nullptr, /*applied_as=*/12);  // after the copy
  google::protobuf::RepeatedPtrField<v1::LedgerEntry> entries;
  google::protobuf::RepeatedPtrField<v1::RequestId> floors;
  ledger.ExportDone(&entries, &floors, /*applied_below=*/11);
  ASSERT_EQ(entries.size(), 2);
  EXPECT_EQ(entries[0].id().seq(), 1u);
  EXPECT_EQ(entries[1].id().seq(), 3u);
  entries.Clear();
  ledger.ExportDone(&entries, &floors);  // no copy: every done push
  EXPECT_EQ(entries.size(), 4);
}

TEST(PushLedgerTest, TheLeastRecentlySeenClientIsForgottenFirst) {
  PushLedger ledger(8, /*max_clients=*/2);
  PushOutcome outcome;
  for (uint64_t client : {1, 2}) {
    ASSERT_EQ(ledger.Begin(Id(client, 1), &outcome), PushLedger::Claim::kNew);
    ledger.Record(Id(client, 1), PushOutcome{1, 0});
  }
  ASSERT_EQ(ledger.Begin(Id(1, 1), &outcome), PushLedger::Claim::kDuplicate);  // 1 seen again
  ASSERT_EQ(ledger.Begin(Id(3, 1), &outcome), PushLedger::Claim::kNew);        // 2 forgotten
  ledger.Record(Id(3, 1), PushOutcome{1, 0});
  EXPECT_EQ(ledger.Begin(Id(1, 1), &outcome), PushLedger::Claim::kDuplicate);
  EXPECT_EQ(ledger.Begin(Id(2, 1), &outcome), PushLedger::Claim::kNew);
}

}  // namespace
}  // namespace pscluster
