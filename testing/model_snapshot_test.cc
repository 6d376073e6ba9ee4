#include "testing/model_snapshot.h"

#include <cmath>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

ModelSnapshot TwoPartsAndARow() {
  ModelSnapshot m;
  m.step = 120;
  m.dense["layer/kernel/0"] = {0.25f, -1.5f, 3.0f, 0.0f};
  m.dense_updates["layer/kernel/0"] = 120;
  m.dense["layer/bias/0"] = {0.125f, 0.5f};
  m.dense_updates["layer/bias/0"] = 120;
  m.rows[{"emb", 42}] = {1.0f, 2.0f, 0.1f, 0.2f};
  m.row_updates[{"emb", 42}] = 7;
  return m;
}

TEST(CompareModelsTest, TheSameModelIsEqual) {
  EXPECT_TRUE(CompareModels(TwoPartsAndARow(), TwoPartsAndARow()).ok());
}

// One unit in the last place of one value, dense or in a row, is a difference, named.
TEST(CompareModelsTest, OneUlpInOneValueIsADifference) {
  ModelSnapshot changed = TwoPartsAndARow();
  float& v = changed.dense["layer/kernel/0"][1];
  v = std::nextafter(v, 0.0f);
  absl::Status s = CompareModels(TwoPartsAndARow(), changed);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("differ in 1 places"));
  EXPECT_THAT(s.message(), HasSubstr("dense layer/kernel/0: 1 values differ, first [1] = "));
  EXPECT_THAT(s.message(), HasSubstr("expected -1.5 (0xbfc00000)"));

  changed = TwoPartsAndARow();
  float& r = changed.rows[{"emb", 42}][3];
  r = std::nextafter(r, 1.0f);
  s = CompareModels(TwoPartsAndARow(), changed);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("row emb[42]: [3] = "));
}

TEST(CompareModelsTest, StepsUpdateCountsAndMissingPartsDiffer) {
  ModelSnapshot changed = TwoPartsAndARow();
  changed.step = 119;
  changed.dense_updates["layer/bias/0"] = 119;
  changed.row_updates[{"emb", 42}] = 6;
  changed.dense.erase("layer/kernel/0");
  absl::Status s = CompareModels(TwoPartsAndARow(), changed);
  EXPECT_THAT(s.message(), HasSubstr("differ in 4 places"));
  EXPECT_THAT(s.message(), HasSubstr("the step is 119, expected 120"));
  EXPECT_THAT(s.message(), HasSubstr("dense layer/kernel/0 is missing"));
  EXPECT_THAT(s.message(), HasSubstr("dense layer/bias/0 has 119 updates, expected 120"));
  EXPECT_THAT(s.message(), HasSubstr("row emb[42] has 6 updates, expected 7"));
}

// A row only pulled (never updated) may be extra; a row that was updated may not.
TEST(CompareModelsTest, ExtraRowsOnlyIfNeverUpdated) {
  ModelSnapshot extra = TwoPartsAndARow();
  extra.rows[{"emb", 7}] = {0.5f, 0.5f, 0.1f, 0.1f};
  extra.row_updates[{"emb", 7}] = 0;
  EXPECT_TRUE(CompareModels(TwoPartsAndARow(), extra).ok());
  extra.row_updates[{"emb", 7}] = 1;
  absl::Status s = CompareModels(TwoPartsAndARow(), extra);
  EXPECT_THAT(s.message(), HasSubstr("row emb[7] was updated 1 times and is not in the expected"));
}

}  // namespace
}  // namespace pscluster
