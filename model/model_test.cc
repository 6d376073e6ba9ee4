#include "model/model.h"

#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

v1::ModelConfig Parse(const std::string& text) {
  v1::ModelConfig c;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &c)) << text;
  return c;
}

// A small random problem for a config: parameters, rows, a batch with sparse ids.
struct Problem {
  std::vector<std::vector<float>> params;
  std::vector<std::vector<float>> rows;
  std::vector<float> dense, labels;
  std::vector<int64_t> offsets, ids;
  Batch batch;
  SparseInput sparse;
};

Problem MakeProblem(const Model& model, int batch, int classes, bool binary, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  Problem p;
  for (int64_t n : model.dense_sizes()) {
    p.params.emplace_back(n);
    for (float& v : p.params.back()) v = u(rng) * 0.7f;
  }
  const int input_dim = model.config().input_dim();
  p.dense.resize(batch * input_dim);
  for (float& v : p.dense) v = u(rng);
  p.offsets.push_back(0);
  for (int b = 0; b < batch; ++b) {
    const int n = b % 4;  // 0..3 ids, including an empty bag
    for (int j = 0; j < n; ++j) p.ids.push_back((b * 7 + j * 3) % 5);  // repeats across bags
    if (b == 1) p.ids.push_back(p.ids.back());  // a duplicate id inside one bag
    p.offsets.push_back(p.ids.size());
    p.labels.push_back(binary ? static_cast<float>(b % 2) : static_cast<float>(b % classes));
  }
  p.batch.size = batch;
  p.batch.dense = p.dense.data();
  p.batch.sparse_offsets = p.offsets.data();
  p.batch.sparse_ids = p.ids.data();
  p.batch.labels = p.labels.data();
  Model::PrepareSparse(p.batch, &p.sparse);
  for (int dim : model.table_dims()) {
    p.rows.emplace_back(p.sparse.unique_ids.size() * dim);
    for (float& v : p.rows.back()) v = u(rng) * 0.7f;
  }
  return p;
}

double Loss(Model& model, Problem& p) {
  std::vector<const float*> params, rows;
  for (auto& v : p.params) params.push_back(v.data());
  for (auto& v : p.rows) rows.push_back(v.data());
  StepResult r;
  EXPECT_TRUE(model.Compute(p.batch, p.sparse, params, rows, false, &r).ok());
  return r.loss;
}

// Checks every analytic gradient against a central finite difference of the loss.
void CheckGradients(const std::string& config_text, bool binary) {
  v1::ModelConfig config = Parse(config_text);
  std::unique_ptr<Kernels> kernels = NewCpuKernels();
  auto model = Model::Create(config, kernels.get(), 8);
  ASSERT_TRUE(model.ok()) << model.status();
  const int classes = config.layers(config.layers_size() - 1).units();
  Problem p = MakeProblem(**model, 6, classes, binary, 42);
  std::vector<const float*> params, rows;
  for (auto& v : p.params) params.push_back(v.data());
  for (auto& v : p.rows) rows.push_back(v.data());
  StepResult r;
  ASSERT_TRUE((*model)->Compute(p.batch, p.sparse, params, rows, true, &r).ok());
  // Small enough that no ReLU input crosses its kink at 0, large enough for float precision.
  const float eps = 2e-3f;
  auto check = [&](std::vector<float>& values, const std::vector<float>& grads,
                   const std::string& what) {
    ASSERT_EQ(values.size(), grads.size()) << what;
    for (size_t i = 0; i < values.size(); ++i) {
      const float saved = values[i];
      values[i] = saved + eps;
      const double up = Loss(**model, p);
      values[i] = saved - eps;
      const double down = Loss(**model, p);
      values[i] = saved;
      const double numeric = (up - down) / (2 * eps);
      ASSERT_NEAR(grads[i], numeric, 2e-3 + 2e-2 * std::abs(numeric)) << what << "[" << i << "]";
    }
  };
  for (size_t v = 0; v < p.params.size(); ++v) {
    check(p.params[v], r.dense_grads[v], (*model)->dense_variables()[v]);
  }
  for (size_t t = 0; t < p.rows.size(); ++t) {
    check(p.rows[t], r.row_grads[t], (*model)->tables()[t]);
  }
}

TEST(ModelGradientTest, DenseLayersWithEveryActivation) {
  for (const char* act : {"LINEAR", "RELU", "SIGMOID", "TANH"}) {
    SCOPED_TRACE(act);
    CheckGradients(std::string(R"pb(input_dim: 5
                                    layers { name: "h" units: 4 activation:)pb") +
                       act + R"pb(}
                                  layers { name: "out" units: 3 }
      loss: SOFTMAX_CROSS_ENTROPY)pb",
                   false);
  }
}

TEST(ModelGradientTest, EmbeddingBagsSumMeanAndWideWithSigmoidLoss) {
  CheckGradients(R"pb(input_dim: 3
                      embeddings { name: "deep" table: "deep_t" dim: 4 combiner: MEAN }
                      embeddings { name: "sum" table: "sum_t" dim: 2 combiner: SUM }
                      embeddings { name: "wide" table: "wide_t" dim: 1 combiner: SUM wide: true }
                      layers { name: "h" units: 5 activation: TANH }
                      layers { name: "logit" units: 1 }
                      loss: SIGMOID_CROSS_ENTROPY)pb",
                 true);
}

TEST(ModelTest, SpecNamesEveryVariable) {
  auto spec = ModelSpecFromConfig(Parse(R"pb(input_dim: 784
                                             seed: 5
                                             layers { name: "hidden" units: 256 activation: RELU }
                                             layers { name: "logits" units: 10 }
                                             optimizer { adam { learning_rate: 0.001 } })pb"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->variables_size(), 4);
  EXPECT_EQ(spec->variables(0).name(), "hidden/kernel");
  EXPECT_EQ(spec->variables(0).shape().dims(0), 784);
  EXPECT_EQ(spec->variables(0).initializer().kind(), v1::InitializerSpec::GLOROT_UNIFORM);
  EXPECT_EQ(spec->variables(0).initializer().seed(), 5u);
  EXPECT_EQ(spec->variables(3).name(), "logits/bias");
  EXPECT_TRUE(spec->variables(3).optimizer().has_adam());
}

// An embedding layer's admission and eviction go to its table's spec, and only there.
TEST(ModelTest, TablesGetTheirLayersAdmissionAndEviction) {
  auto spec = ModelSpecFromConfig(Parse(R"pb(input_dim: 2
                                             embeddings {
                                               name: "e1"
                                               table: "t1"
                                               dim: 4
                                               admission { min_count: 3 probability: 0.1 }
                                               eviction { ttl_steps: 100 max_rows: 5000 }
                                             }
                                             embeddings { name: "e2" table: "t2" dim: 4 }
                                             layers { name: "out" units: 1 }
                                             loss: SIGMOID_CROSS_ENTROPY
                                             optimizer { sgd { learning_rate: 0.1 } })pb"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->tables_size(), 2);
  EXPECT_EQ(spec->tables(0).admission().min_count(), 3);
  EXPECT_EQ(spec->tables(0).admission().probability(), 0.1);
  EXPECT_EQ(spec->tables(0).eviction().ttl_steps(), 100);
  EXPECT_EQ(spec->tables(0).eviction().max_rows(), 5000);
  EXPECT_FALSE(spec->tables(1).has_admission());
  EXPECT_FALSE(spec->tables(1).has_eviction());
}

TEST(ModelTest, RefusesConfigsThatCannotBeBuilt) {
  auto expect = [](const std::string& text, const std::string& substr) {
    auto spec = ModelSpecFromConfig(Parse(text));
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(substr));
  };
  expect("input_dim: 4", "has no dense layers");
  expect(R"pb(input_dim: 4
              layers { name: "a" units: 3 activation: RELU })pb",
         "the last layer, a, must be linear");
  expect(R"pb(input_dim: 4
              layers { name: "a" units: 0 })pb",
         "layer a has 0 units");
  expect(R"pb(input_dim: 4
              layers { name: "a" units: 2 }
              loss: SIGMOID_CROSS_ENTROPY)pb",
         "needs 1 output unit");
  expect(R"pb(input_dim: 4
              layers { name: "a" units: 2 }
              layers { name: "a" units: 2 })pb",
         "name a is used twice");
}

TEST(ModelTest, RefusesOutOfRangeLabels) {
  std::unique_ptr<Kernels> kernels = NewCpuKernels();
  auto model = Model::Create(Parse(R"pb(input_dim: 2
                                        layers { name: "o" units: 3 })pb"),
                             kernels.get(), 4);
  ASSERT_TRUE(model.ok());
  Problem p = MakeProblem(**model, 2, 3, false, 1);
  p.labels[1] = 3;
  std::vector<const float*> params;
  for (auto& v : p.params) params.push_back(v.data());
  StepResult r;
  absl::Status s = (*model)->Compute(p.batch, p.sparse, params, {}, true, &r);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("label 3 of example 1 is out of range"));
}

}  // namespace
}  // namespace pscluster
