#include "storage/crash_points.h"

#include <signal.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

TEST(CrashPointsTest, BadSpecsAreRefusedNamingTheKnownPoints) {
  auto unknown = CrashPoints::Parse("save_somewhere");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unknown crash point \"save_somewhere\"; expected one of save_opened"));
  for (const char* bad : {"save_midway@0", "save_midway@x", "save_midway@"}) {
    auto r = CrashPoints::Parse(bad);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("whole number >= 1")) << bad;
  }
  auto none = CrashPoints::Parse("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  auto ok = CrashPoints::Parse("manifest_before_rename@3");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ((*ok)->point(), "manifest_before_rename");
}

TEST(CrashPointsDeathTest, DiesOfSigkillOnTheNthVisitOfItsPointOnly) {
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  EXPECT_EXIT(
      {
        auto c = CrashPoints::Parse("save_midway@2");
        (*c)->Reach("save_done");    // another point: nothing
        (*c)->Reach("save_midway");  // first visit: nothing
        (*c)->Reach("save_done");
        (*c)->Reach("save_midway");  // second: dies
        std::exit(0);
      },
      ::testing::KilledBySignal(SIGKILL), "crash point save_midway@2 reached");
  auto c = CrashPoints::Parse("save_midway@2");
  (*c)->Reach("save_midway");  // once is survivable
  MaybeCrash(nullptr, "save_midway");
}

TEST(CrashPointsTest, ForTestCallsItsFunctionOnTheNthVisitInsteadOfDying) {
  int calls = 0;
  auto c = CrashPoints::ForTest(kCrashRecoveryCreated, 2, [&calls] { ++calls; });
  c->Reach(kCrashRecoveryRestored);
  c->Reach(kCrashRecoveryCreated);
  EXPECT_EQ(calls, 0);
  c->Reach(kCrashRecoveryCreated);
  EXPECT_EQ(calls, 1);
  c->Reach(kCrashRecoveryCreated);  // only the n-th visit
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace pscluster
