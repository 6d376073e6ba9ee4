#include "model/data/feature_hash.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(CategoricalIdTest, IsStableNonNegativeAndDependsOnTheField) {
  const int64_t id = CategoricalId(0, "68fd1e64", 0);
  EXPECT_GE(id, 0);
  EXPECT_LT(id, kCategoricalIdLimit);
  EXPECT_EQ(id, CategoricalId(0, "68fd1e64", 0));
  EXPECT_NE(id, CategoricalId(1, "68fd1e64", 0));
  EXPECT_NE(id, CategoricalId(0, "68fd1e65", 0));
  // A fixed function of the bytes: this value must not change between builds, or ids in old
  // checkpoints would stop meaning the same strings.
  EXPECT_EQ(CategoricalId(3, "abc", 0), 1725248882938389423);
  EXPECT_EQ(CategoricalId(3, "abc", 1000), 3231);
  for (int field = 0; field < 26; ++field) {
    const int64_t bucketed = CategoricalId(field, "68fd1e64", 1000);
    EXPECT_GE(bucketed, field * 1000);
    EXPECT_LT(bucketed, (field + 1) * 1000);
  }
}

TEST(CategoricalIdTest, DistinctValuesGetDistinctIds) {
  std::set<int64_t> ids;
  for (int i = 0; i < 10000; ++i) ids.insert(CategoricalId(5, absl::StrCat(i), 0));
  EXPECT_EQ(ids.size(), 10000u);
}

}  // namespace
}  // namespace pscluster
