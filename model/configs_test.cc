// Every model config a user can pick (configs/*.pbtxt) loads, builds into the variables and
// tables its comment describes, and runs a training step on the CPU kernels with a finite
// loss and a gradient for every parameter.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/proto_file.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "model/model.h"

namespace pscluster {
namespace {

std::string ConfigDir() { return absl::StrCat(std::getenv("TEST_SRCDIR"), "/pscluster/configs"); }

struct Expected {
  int64_t trainable = 0;          // parameters the optimizer updates
  int64_t moving_statistics = 0;  // batch normalization's moving means and variances
  std::vector<std::pair<std::string, int64_t>> tables;  // name, dim
};

// What each config's comment says it is (and a new config must say it here).
const std::map<std::string, Expected>& ExpectedShapes() {
  static const auto* const expected = new std::map<std::string, Expected>{
      // 784*10 + 10.
      {"softmax_regression.pbtxt", {7850, 0, {}}},
      // 784*256 + 256 + 256*256 + 256 + 256*10 + 10.
      {"mlp.pbtxt", {269322, 0, {}}},
      // conv 3*3*1*32 + 32; 26*26*32 flattened into 128 units: 21632*128 + 128; 128*10 + 10.
      {"cnn.pbtxt", {2770634, 0, {}}},
      // "272,186 parameters (and 1,568 moving statistics)".
      {"resnet20.pbtxt", {272186, 1568, {}}},
      // 13 dense + 16-dim mean embedding -> two ReLU layers -> a logit; a 1-dim wide table.
      {"wide_deep.pbtxt", {-1, 0, {{"deep_emb", 16}, {"wide_emb", 1}}}},
      {"wide_deep_ctr.pbtxt", {-1, 0, {{"deep_emb", 16}, {"wide_emb", 1}}}},
  };
  return *expected;
}

TEST(ConfigsTest, EveryConfigBuildsAndTrainsAStep) {
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(ConfigDir())) {
    const std::string file = entry.path().filename().string();
    if (entry.path().extension() != ".pbtxt") continue;
    SCOPED_TRACE(file);
    ++seen;
    auto expected = ExpectedShapes().find(file);
    ASSERT_NE(expected, ExpectedShapes().end()) << "a config this test does not know";
    v1::ModelConfig config;
    ASSERT_TRUE(ReadProtoFile(entry.path().string(), &config).ok());
    absl::StatusOr<v1::ModelSpec> spec = ModelSpecFromConfig(config);
    ASSERT_TRUE(spec.ok()) << spec.status();
    int64_t trainable = 0, moving = 0;
    for (const v1::VariableSpec& v : spec->variables()) {
      int64_t n = 1;
      for (int64_t d : v.shape().dims()) n *= d;
      (v.name().find("/moving_") != std::string::npos ? moving : trainable) += n;
    }
    if (expected->second.trainable >= 0) EXPECT_EQ(trainable, expected->second.trainable);
    EXPECT_EQ(moving, expected->second.moving_statistics);
    ASSERT_EQ(spec->tables_size(), static_cast<int>(expected->second.tables.size()));
    for (int t = 0; t < spec->tables_size(); ++t) {
      EXPECT_EQ(spec->tables(t).name(), expected->second.tables[t].first);
      EXPECT_EQ(spec->tables(t).dim(), expected->second.tables[t].second);
    }

    // One training step of two examples on the CPU.
    std::unique_ptr<Kernels> kernels = NewCpuKernels();
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(config, kernels.get(), 2);
    ASSERT_TRUE(model.ok()) << model.status();
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0, 0.05f);
    std::vector<std::vector<float>> params;
    for (int64_t n : (*model)->dense_sizes()) {
      params.emplace_back(n);
      for (float& v : params.back()) v = normal(rng);
    }
    std::vector<float> dense(2 * config.input_dim());
    for (float& v : dense) v = std::abs(normal(rng)) * 10;
    std::vector<int64_t> offsets = {0, 3, 5}, ids = {11, 12, 13, 11, 14};
    std::vector<float> labels = {1, 0};
    Batch batch;
    batch.size = 2;
    batch.dense = dense.data();
    batch.labels = labels.data();
    if (spec->tables_size() > 0) {
      batch.sparse_offsets = offsets.data();
      batch.sparse_ids = ids.data();
    }
    SparseInput sparse;
    Model::PrepareSparse(batch, &sparse);
    std::vector<std::vector<float>> rows;
    for (int dim : (*model)->table_dims()) {
      rows.emplace_back(sparse.unique_ids.size() * dim);
      for (float& v : rows.back()) v = normal(rng);
    }
    std::vector<const float*> param_ptrs, row_ptrs;
    for (auto& p : params) param_ptrs.push_back(p.data());
    for (auto& r : rows) row_ptrs.push_back(r.data());
    StepResult result;
    ASSERT_TRUE(
        (*model)->Compute(batch, sparse, param_ptrs, row_ptrs, /*backward=*/true, &result).ok());
    EXPECT_TRUE(std::isfinite(result.loss));
    EXPECT_GT(result.loss, 0);
    ASSERT_EQ(result.dense_grads.size(), params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(result.dense_grads[i].size(), params[i].size()) << (*model)->dense_variables()[i];
      for (float g : result.dense_grads[i]) ASSERT_TRUE(std::isfinite(g));
    }
    ASSERT_EQ(result.row_grads.size(), rows.size());
    for (size_t t = 0; t < rows.size(); ++t) EXPECT_EQ(result.row_grads[t].size(), rows[t].size());
  }
  EXPECT_EQ(seen, static_cast<int>(ExpectedShapes().size())) << "configs missing from configs/";
}

}  // namespace
}  // namespace pscluster
