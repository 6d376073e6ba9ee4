#include "model/data/dataset.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Three examples of two dense features; example 1 has no sparse ids.
Dataset ThreeExamples() {
  Dataset data;
  data.num_examples = 3;
  data.dense_dim = 2;
  data.num_classes = 0;
  data.dense = {0, 1, 10, 11, 20, 21};
  data.sparse_offsets = {0, 2, 2, 3};
  data.sparse_ids = {100, 101, 300};
  data.labels = {1, 0, 1};
  return data;
}

TEST(ValidateDatasetTest, AcceptsConsistentData) {
  EXPECT_TRUE(ValidateDataset(ThreeExamples()).ok());
  EXPECT_TRUE(ValidateDataset(Dataset()).ok());
}

TEST(ValidateDatasetTest, NamesTheInconsistentField) {
  Dataset data = ThreeExamples();
  data.dense.pop_back();
  absl::Status s = ValidateDataset(data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("dense has 5 values"));

  data = ThreeExamples();
  data.sparse_offsets = {0, 2, 1, 3};
  s = ValidateDataset(data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("decreases at example 1"));

  data = ThreeExamples();
  data.sparse_ids.push_back(7);
  s = ValidateDataset(data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("sparse_offsets ends at 3 but sparse_ids has 4"));

  data = ThreeExamples();
  data.labels[2] = 0.5f;
  s = ValidateDataset(data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("label of example 2 is 0.5"));

  data = ThreeExamples();
  data.num_classes = 10;
  data.labels[0] = 10;
  s = ValidateDataset(data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("[0, 10)"));

  data = ThreeExamples();
  data.image = ImageLayout{1, 2, 1};
  EXPECT_TRUE(ValidateDataset(data).ok());
  data.image = ImageLayout{2, 2, 1};
  s = ValidateDataset(data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("image layout 2x2x1 (height x width x channels) does not "
                                     "hold dense_dim = 2 features"));
}

TEST(SelectExamplesTest, GathersRowsIdsAndLabelsInOrder) {
  const Dataset data = ThreeExamples();
  Dataset out;
  SelectExamples(data, {2, 1, 0, 2}, &out);
  EXPECT_EQ(out.num_examples, 4);
  EXPECT_EQ(out.dense_dim, 2);
  EXPECT_THAT(out.dense, ElementsAre(20, 21, 10, 11, 0, 1, 20, 21));
  EXPECT_THAT(out.sparse_offsets, ElementsAre(0, 1, 1, 3, 4));
  EXPECT_THAT(out.sparse_ids, ElementsAre(300, 100, 101, 300));
  EXPECT_THAT(out.labels, ElementsAre(1, 0, 1, 1));
  EXPECT_TRUE(ValidateDataset(out).ok());

  // Reusing the output replaces its contents.
  SelectExamples(data, {1}, &out);
  EXPECT_EQ(out.num_examples, 1);
  EXPECT_THAT(out.dense, ElementsAre(10, 11));
  EXPECT_THAT(out.sparse_offsets, ElementsAre(0, 0));
  EXPECT_TRUE(out.sparse_ids.empty());
}

TEST(SelectExamplesTest, KeepsDataWithoutSparseFeaturesWithout) {
  Dataset data = ThreeExamples();
  data.sparse_offsets.clear();
  data.sparse_ids.clear();
  data.image = ImageLayout{1, 1, 2};
  Dataset out;
  SelectExamples(data, {0}, &out);
  EXPECT_FALSE(out.has_sparse());
  EXPECT_EQ(out.image, data.image);
  EXPECT_TRUE(ValidateDataset(out).ok());
}

}  // namespace
}  // namespace pscluster
