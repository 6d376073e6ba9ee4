#include "common/mutex_checks.h"

#include <cstdlib>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

// Takes two mutexes in one order, then in the other: a lock-order cycle, which deadlock
// detection reports although no deadlock happens here.
void LockInBothOrders() {
  absl::Mutex a, b;
  {
    absl::MutexLock la(&a);
    absl::MutexLock lb(&b);
  }
  {
    absl::MutexLock lb(&b);
    absl::MutexLock la(&a);
  }
}

TEST(MutexChecksTest, OffUnlessAsked) {
  unsetenv("PSCLUSTER_MUTEX_DEADLOCK_DETECTION");
  EXPECT_STREQ(SetMutexChecksFromEnvironment(), "off");
  LockInBothOrders();  // not reported
  setenv("PSCLUSTER_MUTEX_DEADLOCK_DETECTION", "yes", 1);
  EXPECT_STREQ(SetMutexChecksFromEnvironment(), "off");
  LockInBothOrders();
  // As the tests run (.bazelrc), for whatever runs after this test in the binary.
  setenv("PSCLUSTER_MUTEX_DEADLOCK_DETECTION", "abort", 1);
  EXPECT_STREQ(SetMutexChecksFromEnvironment(), "abort");
}

TEST(MutexChecksDeathTest, AbortStopsAtALockOrderCycle) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        setenv("PSCLUSTER_MUTEX_DEADLOCK_DETECTION", "abort", 1);
        SetMutexChecksFromEnvironment();
        LockInBothOrders();
      },
      "deadlock");
}

}  // namespace
}  // namespace pscluster
