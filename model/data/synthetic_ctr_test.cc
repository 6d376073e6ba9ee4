#include "model/data/synthetic_ctr.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/data/dataset.h"
#include "model/data/metrics.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

SyntheticCtrOptions SmallOptions() {
  SyntheticCtrOptions options;
  options.num_examples = 2000;
  options.ids_per_field = 1000;
  options.seed = 17;
  return options;
}

TEST(SyntheticCtrTest, HasTheRequestedShape) {
  const SyntheticCtrOptions options = SmallOptions();
  absl::StatusOr<Dataset> data = GenerateSyntheticCtr(options);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(ValidateDataset(*data).ok()) << ValidateDataset(*data);
  EXPECT_EQ(data->num_examples, 2000);
  EXPECT_EQ(data->dense_dim, 13);
  EXPECT_EQ(data->num_classes, 0);
  ASSERT_TRUE(data->has_sparse());
  for (int64_t i = 0; i < data->num_examples; ++i) {
    ASSERT_EQ(data->sparse_offsets[i + 1] - data->sparse_offsets[i], 8);
    for (int f = 0; f < 8; ++f) {
      const int64_t id = data->sparse_ids[data->sparse_offsets[i] + f];
      ASSERT_GE(id, f * options.ids_per_field);
      ASSERT_LT(id, (f + 1) * options.ids_per_field);
    }
  }
}

TEST(SyntheticCtrTest, IsDeterministicForASeed) {
  const SyntheticCtrOptions options = SmallOptions();
  absl::StatusOr<Dataset> a = GenerateSyntheticCtr(options);
  absl::StatusOr<Dataset> b = GenerateSyntheticCtr(options);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->dense, b->dense);
  EXPECT_EQ(a->sparse_ids, b->sparse_ids);
  EXPECT_EQ(a->labels, b->labels);

  SyntheticCtrOptions other = options;
  other.seed = 18;
  absl::StatusOr<Dataset> c = GenerateSyntheticCtr(other);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(a->dense, c->dense);
  EXPECT_NE(a->sparse_ids, c->sparse_ids);
}

TEST(SyntheticCtrTest, IsPinnedAcrossRuns) {
  // Values of this implementation, pinned so that a change to the generator (which would
  // silently change every experiment's data) fails here first.
  const SyntheticCtrOptions options = SmallOptions();
  absl::StatusOr<Dataset> data = GenerateSyntheticCtr(options);
  ASSERT_TRUE(data.ok());
  const std::vector<int64_t> first_ids(data->sparse_ids.begin(), data->sparse_ids.begin() + 8);
  EXPECT_EQ(first_ids, std::vector<int64_t>({422, 1218, 2736, 3805, 4870, 5105, 6454, 7024}));
  int64_t clicks = 0;
  for (const float label : data->labels) clicks += label == 1.0f;
  EXPECT_EQ(clicks, 631);
}

TEST(SyntheticCtrTest, SmallerDataIsAPrefixOfBigger) {
  SyntheticCtrOptions options = SmallOptions();
  absl::StatusOr<Dataset> big = GenerateSyntheticCtr(options);
  options.num_examples = 100;
  absl::StatusOr<Dataset> small = GenerateSyntheticCtr(options);
  ASSERT_TRUE(big.ok() && small.ok());
  EXPECT_TRUE(std::equal(small->dense.begin(), small->dense.end(), big->dense.begin()));
  EXPECT_TRUE(
      std::equal(small->sparse_ids.begin(), small->sparse_ids.end(), big->sparse_ids.begin()));
  EXPECT_TRUE(std::equal(small->labels.begin(), small->labels.end(), big->labels.begin()));
}

TEST(SyntheticCtrTest, StreamsShareTheModelButNotTheExamples) {
  SyntheticCtrOptions train = SmallOptions();
  SyntheticCtrOptions test = train;
  test.example_stream = 1;
  absl::StatusOr<PlantedCtrModel> model_train = PlantedCtrModel::Create(train);
  absl::StatusOr<PlantedCtrModel> model_test = PlantedCtrModel::Create(test);
  ASSERT_TRUE(model_train.ok() && model_test.ok());
  EXPECT_EQ(model_train->dense_weights(), model_test->dense_weights());
  EXPECT_EQ(model_train->IdWeight(1234), model_test->IdWeight(1234));
  EXPECT_EQ(model_train->IdOfRank(3, 0), model_test->IdOfRank(3, 0));
  absl::StatusOr<Dataset> a = GenerateSyntheticCtr(train);
  absl::StatusOr<Dataset> b = GenerateSyntheticCtr(test);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(a->dense, b->dense);
}

TEST(SyntheticCtrTest, IdsAreSkewedTowardsHotOnes) {
  const SyntheticCtrOptions options = SmallOptions();
  absl::StatusOr<PlantedCtrModel> model = PlantedCtrModel::Create(options);
  absl::StatusOr<Dataset> data = GenerateSyntheticCtr(options);
  ASSERT_TRUE(model.ok() && data.ok());
  std::map<int64_t, int> field0_counts;
  for (int64_t i = 0; i < data->num_examples; ++i) {
    ++field0_counts[data->sparse_ids[data->sparse_offsets[i]]];
  }
  // The hottest id is drawn about 10% of the time; a uniform draw would give 0.1%.
  const int hottest = field0_counts[model->IdOfRank(0, 0)];
  EXPECT_GT(hottest, data->num_examples / 20);
  for (const auto& [id, count] : field0_counts) EXPECT_LE(count, hottest) << id;
  // Many of the 1000 ids are never drawn in 2000 examples.
  EXPECT_LT(field0_counts.size(), 700u);

  // The ranks of a field map to distinct ids.
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < options.ids_per_field; ++r) ids.push_back(model->IdOfRank(2, r));
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());
  EXPECT_EQ(ids.front(), 2 * options.ids_per_field);
  EXPECT_EQ(ids.back(), 3 * options.ids_per_field - 1);
}

TEST(SyntheticCtrTest, PlantedModelScoresWellAboveChance) {
  SyntheticCtrOptions options = SmallOptions();
  options.num_examples = 20000;
  options.example_stream = 1;
  absl::StatusOr<PlantedCtrModel> model = PlantedCtrModel::Create(options);
  absl::StatusOr<Dataset> data = GenerateSyntheticCtr(options);
  ASSERT_TRUE(model.ok() && data.ok());
  const double auc = Auc(model->PredictAll(*data), data->labels);
  EXPECT_GT(auc, 0.75);
  std::cout << "planted model AUC " << auc << "\n";
  double clicks = 0;
  for (const float label : data->labels) clicks += label;
  const double rate = clicks / data->num_examples;
  EXPECT_GT(rate, 0.2);
  EXPECT_LT(rate, 0.45);

  // A model planted by another seed knows next to nothing about these labels (only chance
  // alignment of its random weights with the true ones).
  SyntheticCtrOptions wrong = options;
  wrong.seed = options.seed + 1;
  absl::StatusOr<PlantedCtrModel> unrelated = PlantedCtrModel::Create(wrong);
  ASSERT_TRUE(unrelated.ok());
  const double unrelated_auc = Auc(unrelated->PredictAll(*data), data->labels);
  std::cout << "unrelated model AUC " << unrelated_auc << "\n";
  EXPECT_GT(auc - unrelated_auc, 0.15);
}

TEST(SyntheticCtrTest, NoFieldsMeansNoSparseFeatures) {
  SyntheticCtrOptions options = SmallOptions();
  options.num_fields = 0;
  absl::StatusOr<Dataset> data = GenerateSyntheticCtr(options);
  ASSERT_TRUE(data.ok());
  EXPECT_FALSE(data->has_sparse());
  EXPECT_TRUE(ValidateDataset(*data).ok());
}

TEST(SyntheticCtrTest, RejectsBadOptionsNamingTheField) {
  SyntheticCtrOptions options;
  options.num_examples = -5;
  absl::StatusOr<Dataset> data = GenerateSyntheticCtr(options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("SyntheticCtrOptions.num_examples is -5"));

  options = SyntheticCtrOptions();
  options.ids_per_field = 0;
  data = GenerateSyntheticCtr(options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("SyntheticCtrOptions.ids_per_field is 0"));

  options = SyntheticCtrOptions();
  options.ids_per_field = int64_t{1} << 62;
  data = GenerateSyntheticCtr(options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("fits in int64"));

  options = SyntheticCtrOptions();
  options.zipf_exponent = -1;
  data = GenerateSyntheticCtr(options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("SyntheticCtrOptions.zipf_exponent is -1"));
}

}  // namespace
}  // namespace pscluster
