#include "common/chief_epoch.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(ChiefEpochTest, TheRefusalIsRecognizedWithContextAddedAndNothingElseIs) {
  const absl::Status refused = SupersededChiefError("RestoreShards", 7, 9);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(refused.message(),
            "RestoreShards from chief epoch 7 refused: this task follows chief epoch 9 "
            "(a newer chief)");
  EXPECT_TRUE(IsSupersededChief(refused));
  EXPECT_TRUE(IsSupersededChief(absl::FailedPreconditionError(
      absl::StrCat("cannot re-create the shards: ps:1: ", refused.message()))));
  EXPECT_FALSE(IsSupersededChief(absl::UnavailableError(refused.message())));
  EXPECT_FALSE(IsSupersededChief(absl::FailedPreconditionError("shard held until restored")));
  EXPECT_FALSE(IsSupersededChief(absl::OkStatus()));
}

}  // namespace
}  // namespace pscluster
