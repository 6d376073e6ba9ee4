#include "model/model.h"

#include <cmath>
#include <random>
#include <set>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
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
  // The loss as training sees it (batch normalization with the batch's statistics).
  EXPECT_TRUE(
      model.Compute(p.batch, p.sparse, params, rows, Model::Pass::kTrainingForward, &r).ok());
  return r.loss;
}

// The logits' width of a config.
int Classes(const v1::ModelConfig& config) {
  if (config.layers_size() > 0) return config.layers(config.layers_size() - 1).units();
  return config.network(config.network_size() - 1).dense().units();
}

bool IsMovingStatistic(const std::string& name) {
  return name.find("/moving_") != std::string::npos;
}

// Checks every analytic gradient against a central finite difference of the loss (the moving
// statistics of batch normalization, whose "gradients" are their updates, are checked apart).
void CheckGradients(const std::string& config_text, bool binary, int batch = 6) {
  v1::ModelConfig config = Parse(config_text);
  std::unique_ptr<Kernels> kernels = NewCpuKernels();
  auto model = Model::Create(config, kernels.get(), 8);
  ASSERT_TRUE(model.ok()) << model.status();
  Problem p = MakeProblem(**model, batch, Classes(config), binary, 42);
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
    if (IsMovingStatistic((*model)->dense_variables()[v])) continue;
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

// Convolutions (SAME and VALID, strides 1 and 2, with and without bias, 1x1 without a copy),
// max pooling (disjoint and overlapping windows, padded), batch normalization, a standalone
// activation and flatten.
TEST(ModelGradientTest, ConvolutionPoolingBatchNormAndFlatten) {
  CheckGradients(R"pb(input_dim: 60
                      input_shape { height: 5 width: 6 channels: 2 }
                      network {
                        name: "c1"
                        conv2d { filters: 3 kernel_size: 3 use_bias: true activation: TANH }
                      }
                      network {
                        name: "p1"
                        max_pool { pool_size: 2 padding: SAME }
                      }
                      network {
                        name: "c2"
                        conv2d { filters: 4 kernel_size: 2 stride: 2 padding: VALID }
                      }
                      network {
                        name: "bn"
                        batch_norm { momentum: 0.9 }
                      }
                      network {
                        name: "act"
                        activation { activation: TANH }
                      }
                      network {
                        name: "c3"
                        conv2d { filters: 2 kernel_size: 1 use_bias: true }
                      }
                      network {
                        name: "flat"
                        flatten {}
                      }
                      network {
                        name: "out"
                        dense { units: 3 }
                      }
                      loss: SOFTMAX_CROSS_ENTROPY)pb",
                 false);
}

TEST(ModelGradientTest, OverlappingMaxPoolWithPadding) {
  CheckGradients(R"pb(input_dim: 49
                      input_shape { height: 7 width: 7 channels: 1 }
                      network {
                        name: "c"
                        conv2d { filters: 2 kernel_size: 3 activation: TANH }
                      }
                      network {
                        name: "p"
                        max_pool { pool_size: 3 stride: 2 padding: SAME }
                      }
                      network {
                        name: "f"
                        flatten {}
                      }
                      network {
                        name: "out"
                        dense { units: 1 }
                      }
                      loss: SIGMOID_CROSS_ENTROPY)pb",
                 true);
}

// Average pooling, windows overlapping and partly in the padding (not counted), between a
// convolution and the logits: the one-file layer (model/layers/average_pool.cc).
TEST(ModelGradientTest, OverlappingAveragePoolWithPadding) {
  CheckGradients(R"pb(input_dim: 98
                      input_shape { height: 7 width: 7 channels: 2 }
                      network {
                        name: "c"
                        conv2d { filters: 3 kernel_size: 3 padding: SAME activation: TANH }
                      }
                      network {
                        name: "p"
                        average_pool { pool_size: 3 stride: 2 padding: SAME }
                      }
                      network {
                        name: "f"
                        flatten {}
                      }
                      network {
                        name: "out"
                        dense { units: 3 }
                      }
                      loss: SOFTMAX_CROSS_ENTROPY)pb",
                 false);
}

// A residual network in small: an identity block (the block's input read by its first
// convolution and by the addition) and a projection block (a strided 1x1 convolution on the
// shortcut), then global average pooling.
TEST(ModelGradientTest, ResidualBlocksWithGlobalAveragePooling) {
  CheckGradients(R"pb(input_dim: 72
                      input_shape { height: 6 width: 6 channels: 2 }
                      network {
                        name: "stem"
                        conv2d { filters: 3 kernel_size: 3 }
                      }
                      network {
                        name: "stem_bn"
                        batch_norm {}
                      }
                      network {
                        name: "stem_act"
                        activation { activation: TANH }
                      }
                      network {
                        name: "a1"
                        conv2d { filters: 3 kernel_size: 3 }
                      }
                      network {
                        name: "a1_bn"
                        batch_norm {}
                      }
                      network {
                        name: "a1_act"
                        activation { activation: TANH }
                      }
                      network {
                        name: "a2"
                        conv2d { filters: 3 kernel_size: 3 }
                      }
                      network {
                        name: "a2_bn"
                        batch_norm {}
                      }
                      network {
                        name: "a_add"
                        inputs: [ "a2_bn", "stem_act" ]
                        add { activation: TANH }
                      }
                      network {
                        name: "b1"
                        conv2d { filters: 4 kernel_size: 3 stride: 2 }
                      }
                      network {
                        name: "b1_bn"
                        batch_norm {}
                      }
                      network {
                        name: "b1_act"
                        activation { activation: TANH }
                      }
                      network {
                        name: "b2"
                        conv2d { filters: 4 kernel_size: 3 }
                      }
                      network {
                        name: "shortcut"
                        inputs: "a_add"
                        conv2d { filters: 4 kernel_size: 1 stride: 2 }
                      }
                      network {
                        name: "b_add"
                        inputs: [ "b2", "shortcut" ]
                        add {}
                      }
                      network {
                        name: "gap"
                        global_average_pool {}
                      }
                      network {
                        name: "out"
                        dense { units: 3 }
                      }
                      loss: SOFTMAX_CROSS_ENTROPY)pb",
                 false);
}

// Batch normalization's moving statistics: training pushes the batch's statistics for them
// (the variance with Bessel's correction), which the ps averages in, and evaluation normalizes
// with them.
// Convolutions that keep their forward patches for backward (Model::Create's keep_patches, a GPU
// worker's choice) compute exactly what gathering them again computes, including when a later
// convolution's backward has used the shared buffer in between.
TEST(ModelTest, KeptPatchesGiveTheSameStep) {
  const v1::ModelConfig config = Parse(R"pb(input_dim: 98
                                            input_shape { height: 7 width: 7 channels: 2 }
                                            network {
                                              name: "c1"
                                              conv2d { filters: 4 kernel_size: 3 activation: TANH }
                                            }
                                            network {
                                              name: "c2"
                                              conv2d { filters: 3 kernel_size: 3 stride: 2 }
                                            }
                                            network {
                                              name: "f"
                                              flatten {}
                                            }
                                            network {
                                              name: "out"
                                              dense { units: 3 }
                                            }
                                            loss: SOFTMAX_CROSS_ENTROPY)pb");
  std::unique_ptr<Kernels> kernels = NewCpuKernels();
  auto gathered = Model::Create(config, kernels.get(), 8);
  auto kept = Model::Create(config, kernels.get(), 8, /*keep_patches=*/true);
  ASSERT_TRUE(gathered.ok()) << gathered.status();
  ASSERT_TRUE(kept.ok()) << kept.status();
  Problem p = MakeProblem(**gathered, 6, 3, false, 7);
  std::vector<const float*> params, rows;
  for (auto& v : p.params) params.push_back(v.data());
  StepResult a, b;
  ASSERT_TRUE((*gathered)->Compute(p.batch, p.sparse, params, rows, true, &a).ok());
  ASSERT_TRUE((*kept)->Compute(p.batch, p.sparse, params, rows, true, &b).ok());
  EXPECT_EQ(a.loss, b.loss);
  ASSERT_EQ(a.dense_grads.size(), b.dense_grads.size());
  for (size_t v = 0; v < a.dense_grads.size(); ++v) {
    EXPECT_EQ(a.dense_grads[v], b.dense_grads[v]) << (*gathered)->dense_variables()[v];
  }
}

TEST(ModelTest, BatchNormMovingStatistics) {
  const v1::ModelConfig config = Parse(R"pb(input_dim: 12
                                            input_shape { height: 2 width: 2 channels: 3 }
                                            network {
                                              name: "bn"
                                              batch_norm { momentum: 0.9 }
                                            }
                                            network {
                                              name: "f"
                                              flatten {}
                                            }
                                            network {
                                              name: "out"
                                              dense { units: 2 }
                                            }
                                            loss: SOFTMAX_CROSS_ENTROPY)pb");
  std::unique_ptr<Kernels> kernels = NewCpuKernels();
  auto model = Model::Create(config, kernels.get(), 8);
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_EQ((*model)->dense_variables()[2], "bn/moving_mean");
  ASSERT_EQ((*model)->dense_variables()[3], "bn/moving_variance");
  Problem p = MakeProblem(**model, 5, 2, false, 7);
  std::vector<const float*> params;
  for (auto& v : p.params) params.push_back(v.data());
  StepResult r;
  ASSERT_TRUE((*model)->Compute(p.batch, p.sparse, params, {}, true, &r).ok());
  // The statistics of each channel over 5 examples x 4 positions.
  constexpr int kRows = 20;
  for (int c = 0; c < 3; ++c) {
    double sum = 0, squares = 0;
    for (int i = 0; i < kRows; ++i) sum += p.dense[i * 3 + c];
    const double mean = sum / kRows;
    for (int i = 0; i < kRows; ++i) squares += std::pow(p.dense[i * 3 + c] - mean, 2);
    const double unbiased = squares / (kRows - 1);
    EXPECT_NEAR(r.dense_grads[2][c], mean, 1e-5) << c;
    EXPECT_NEAR(r.dense_grads[3][c], unbiased, 1e-5) << c;
    // Evaluation with moving statistics equal to the batch's (biased) ones normalizes as
    // training does.
    p.params[2][c] = static_cast<float>(mean);
    p.params[3][c] = static_cast<float>(squares / kRows);
  }
  p.params[3][0] = std::abs(p.params[3][0]);
  StepResult eval, train;
  ASSERT_TRUE(
      (*model)->Compute(p.batch, p.sparse, params, {}, Model::Pass::kInference, &eval).ok());
  ASSERT_TRUE(
      (*model)->Compute(p.batch, p.sparse, params, {}, Model::Pass::kTrainingForward, &train).ok());
  EXPECT_NEAR(eval.loss, train.loss, 1e-5);
  // Other moving statistics change the evaluation, not training.
  p.params[2][1] += 0.5f;
  StepResult eval2, train2;
  ASSERT_TRUE(
      (*model)->Compute(p.batch, p.sparse, params, {}, Model::Pass::kInference, &eval2).ok());
  ASSERT_TRUE((*model)
                  ->Compute(p.batch, p.sparse, params, {}, Model::Pass::kTrainingForward, &train2)
                  .ok());
  EXPECT_GT(std::abs(eval2.loss - eval.loss), 1e-4);
  EXPECT_EQ(train2.loss, train.loss);
}

TEST(ModelTest, NetworkSpecShapesAndGroups) {
  const v1::ModelConfig config = Parse(R"pb(input_dim: 784
                                            seed: 3
                                            input_shape { height: 28 width: 28 channels: 1 }
                                            network {
                                              name: "c"
                                              conv2d { filters: 8 kernel_size: 3 }
                                            }
                                            network {
                                              name: "bn"
                                              batch_norm {}
                                            }
                                            network {
                                              name: "gap"
                                              global_average_pool {}
                                            }
                                            network {
                                              name: "out"
                                              dense { units: 10 }
                                            }
                                            optimizer { adam { learning_rate: 0.001 } })pb");
  auto spec = ModelSpecFromConfig(config);
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->variables_size(), 7);
  EXPECT_EQ(spec->variables(0).name(), "c/kernel");
  EXPECT_THAT(spec->variables(0).shape().dims(), testing::ElementsAre(3, 3, 1, 8));
  EXPECT_EQ(spec->variables(0).initializer().kind(), v1::InitializerSpec::HE_NORMAL);
  EXPECT_EQ(spec->variables(0).initializer().seed(), 3u);
  EXPECT_TRUE(spec->variables(0).optimizer().has_adam());
  EXPECT_EQ(spec->variables(1).name(), "bn/gamma");
  EXPECT_EQ(spec->variables(1).initializer().value(), 1.0f);
  EXPECT_EQ(spec->variables(3).name(), "bn/moving_mean");
  EXPECT_EQ(spec->variables(3).optimizer().moving_average().momentum(), 0.99f);
  EXPECT_EQ(spec->variables(4).optimizer().moving_average().momentum(), 0.99f);
  EXPECT_EQ(spec->variables(4).name(), "bn/moving_variance");
  EXPECT_EQ(spec->variables(4).initializer().value(), 1.0f);
  EXPECT_EQ(spec->variables(5).name(), "out/kernel");
  EXPECT_THAT(spec->variables(5).shape().dims(), testing::ElementsAre(8, 10));

  std::unique_ptr<Kernels> kernels = NewCpuKernels();
  auto model = Model::Create(config, kernels.get(), 4);
  ASSERT_TRUE(model.ok()) << model.status();
  // Groups cover every variable in order, each layer's variables within one group.
  ASSERT_GE((*model)->num_groups(), 1);
  EXPECT_EQ((*model)->group_first(0), 0);
  EXPECT_EQ((*model)->group_first((*model)->num_groups()), 7);
  for (int g = 0; g < (*model)->num_groups(); ++g) {
    const int first = (*model)->group_first(g);
    EXPECT_LT(first, (*model)->group_first(g + 1));
    EXPECT_TRUE(first == 0 || first == 1 || first == 5) << first;
  }
}

TEST(ModelTest, RefusesBatchesBeyond32BitIndices) {
  std::unique_ptr<Kernels> kernels = NewCpuKernels();
  auto model = Model::Create(Parse(R"pb(input_dim: 65536
                                        input_shape { height: 256 width: 256 channels: 1 }
                                        network {
                                          name: "c"
                                          conv2d { filters: 64 kernel_size: 3 }
                                        }
                                        network {
                                          name: "g"
                                          global_average_pool {}
                                        }
                                        network {
                                          name: "o"
                                          dense { units: 2 }
                                        })pb"),
                             kernels.get(), 1024);
  ASSERT_FALSE(model.ok());
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("layer c has 4194304 floats per example; 1024 examples of it exceed"));
}

// The per-example estimate counts what grows with the batch: a wider layer adds its output
// and gradient; a 3x3 convolution adds its patches; a config that cannot be built is refused.
TEST(ModelTest, DeviceBytesPerExampleGrowsWithWhatABatchHolds) {
  auto mlp = [](int units) {
    return Parse(absl::StrCat("input_dim: 10 layers { name: 'h' units: ", units,
                              " activation: RELU } layers { name: 'o' units: 3 }"));
  };
  const absl::StatusOr<int64_t> narrow = Model::DeviceBytesPerExample(mlp(20));
  const absl::StatusOr<int64_t> wide = Model::DeviceBytesPerExample(mlp(120));
  ASSERT_TRUE(narrow.ok() && wide.ok()) << narrow.status() << wide.status();
  // 100 more units: their output and gradient, and the larger scratch gradient (accum).
  EXPECT_EQ(*wide - *narrow, 3 * 100 * 4);
  const absl::StatusOr<int64_t> conv = Model::DeviceBytesPerExample(Parse(R"pb(
    input_dim: 64
    input_shape { height: 8 width: 8 channels: 1 }
    network {
      name: "c"
      conv2d { filters: 4 kernel_size: 3 padding: SAME }
    }
    network {
      name: "f"
      flatten {}
    }
    network {
      name: "o"
      dense { units: 2 }
    })pb"));
  ASSERT_TRUE(conv.ok()) << conv.status();
  EXPECT_GE(*conv, (8 * 8 * 9 + 2 * 8 * 8 * 4) * 4);  // patches, the output and its gradient
  EXPECT_EQ(Model::DeviceBytesPerExample(Parse("input_dim: 4")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ModelTest, RefusesNetworksWhoseShapesDoNotFit) {
  auto expect = [](const std::string& text, const std::string& substr) {
    auto spec = ModelSpecFromConfig(Parse(text));
    ASSERT_FALSE(spec.ok()) << text;
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(spec.status().message()), HasSubstr(substr)) << text;
  };
  const std::string image = "input_dim: 16 input_shape { height: 4 width: 4 channels: 1 } ";
  expect(image + R"pb(network {
                        name: "d"
                        dense { units: 2 }
                      })pb",
         "layer d (dense) reads a [4, 4, 1] input; put a flatten layer before it");
  expect(image + R"pb(network {
                        name: "c"
                        conv2d { filters: 2 kernel_size: 5 padding: VALID }
                      }
                      network {
                        name: "f"
                        flatten {}
                      }
                      network {
                        name: "o"
                        dense { units: 2 }
                      })pb",
         "layer c: its 5x5 window does not fit its [4, 4, 1] input with VALID padding");
  expect(image + R"pb(network {
                        name: "c"
                        conv2d { filters: 0 kernel_size: 3 }
                      })pb",
         "layer c (conv2d) needs filters, kernel_size and stride >= 1");
  // The pools share their window's checks and name their kind.
  for (const char* pool : {"max_pool", "average_pool"}) {
    expect(image + absl::StrCat("network { name: 'p' ", pool,
                                " { pool_size: -1 } } network { name: 'f' flatten {} } "
                                "network { name: 'o' dense { units: 2 } }"),
           absl::StrCat("layer p (", pool, ") needs pool_size and stride >= 1, got -1 and 0"));
    expect(image + absl::StrCat("network { name: 'p' ", pool,
                                " { pool_size: 5 padding: VALID } } network { name: 'f' flatten {} "
                                "} network { name: 'o' dense { units: 2 } }"),
           "layer p: its 5x5 window does not fit its [4, 4, 1] input with VALID padding");
  }
  expect(image + R"pb(network {
                        name: "c"
                        conv2d { filters: 2 kernel_size: 3 stride: 2 }
                      }
                      network {
                        name: "a"
                        inputs: [ "c", "input" ]
                        add {}
                      })pb",
         "layer a (add) adds a [2, 2, 2] and a [4, 4, 1] input; they must be equal");
  expect(image + R"pb(network {
                        name: "f"
                        flatten {}
                      }
                      network {
                        name: "o"
                        inputs: "nope"
                        dense { units: 2 }
                      })pb",
         "layer o reads \"nope\", which is not an earlier layer");
  expect(image + R"pb(network {
                        name: "f"
                        flatten {}
                      }
                      network {
                        name: "o"
                        inputs: "input"
                        dense { units: 2 }
                      })pb",
         "layer o (dense) reads a [4, 4, 1] input");
  expect(image + R"pb(network {
                        name: "f"
                        flatten {}
                      }
                      network {
                        name: "g"
                        inputs: "input"
                        flatten {}
                      }
                      network {
                        name: "o"
                        dense { units: 2 }
                      })pb",
         "the output of layer f is not read by any later layer");
  expect(image + R"pb(network {
                        name: "c"
                        conv2d { filters: 2 kernel_size: 3 }
                      })pb",
         "the last layer, c, outputs [4, 4, 2]; the logits must be flat");
  expect(image + R"pb(network {
                        name: "f"
                        flatten {}
                      }
                      network {
                        name: "o"
                        dense { units: 2 activation: RELU }
                      })pb",
         "the last layer, o, must be linear");
  expect(image + R"pb(network {
                        name: "f"
                        flatten {}
                      }
                      network {
                        name: "o"
                        dense { units: 2 }
                      }
                      network {
                        name: "g"
                        flatten {}
                      })pb",
         "the last layer, g, is a flatten");
  expect(image + R"pb(network {
                        name: "c"
                        conv2d { filters: 2 kernel_size: 3 stride: 100000 }
                      })pb",
         "layer c: window 3 and stride 100000 must be at most 65536");
  expect(image + R"pb(network {
                        name: "b"
                        batch_norm { momentum: 1 }
                      })pb",
         "layer b (batch_norm) needs momentum in [0, 1)");
  expect(image + R"pb(network {
                        name: "a"
                        add {}
                      })pb",
         "layer a (add) needs at least two inputs, got 1");
  expect(image + R"pb(network { name: "x" })pb", "layer x (network index 0) has no kind");
  expect(
      "input_dim: 16 input_shape { height: 4 width: 3 channels: 1 } "
      "network { dense { units: 2 } }",
      "input_shape [4, 3, 1] must have every dimension >= 1 and hold input_dim = 16");
  expect(R"pb(input_dim: 4
              layers { units: 2 }
              network { dense { units: 2 } })pb",
         "sets both layers and network");
  expect(image + R"pb(embeddings { name: "e" table: "t" dim: 2 }
                      network {
                        name: "f"
                        flatten {}
                      }
                      network {
                        name: "o"
                        dense { units: 2 }
                      })pb",
         "only wide embedding layers go with input_shape");
}

// The training images' augmentation: shifts within the bound with zeros shifted in, mirrors,
// the same draw for the same step and example, and every shift and both orientations drawn.
TEST(ModelTest, AugmentationShiftsAndMirrorsImages) {
  std::unique_ptr<Kernels> kernels = NewCpuKernels();
  auto model = Model::Create(Parse(R"pb(input_dim: 40
                                        input_shape { height: 4 width: 5 channels: 2 }
                                        augmentation { max_shift: 1 horizontal_flip: true }
                                        network {
                                          name: "f"
                                          flatten {}
                                        }
                                        network {
                                          name: "o"
                                          dense { units: 2 }
                                        })pb"),
                             kernels.get(), 4);
  ASSERT_TRUE(model.ok()) << model.status();
  // Pixel (y, x, c) holds 1 + 100 y + 10 x + c, so every output value names its source.
  std::vector<float> image(40);
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 5; ++x) {
      for (int c = 0; c < 2; ++c) image[(y * 5 + x) * 2 + c] = 1 + 100 * y + 10 * x + c;
    }
  }
  std::set<std::tuple<int, int, bool>> seen;
  for (uint64_t key = 1; key <= 200; ++key) {
    std::vector<float> out(40), again(40);
    (*model)->Augment(image.data(), 7, key, out.data());
    (*model)->Augment(image.data(), 7, key, again.data());
    ASSERT_EQ(out, again) << key;
    // Find the shift and orientation from a pixel that stays inside for every draw: (1, 2).
    const float v = out[(1 * 5 + 2) * 2];
    ASSERT_GT(v, 0) << key;
    const int sy = static_cast<int>(v - 1) / 100, sx = (static_cast<int>(v - 1) % 100) / 10;
    const int dy = sy - 1;
    bool matched = false;
    for (bool flip : {false, true}) {
      const int dx = sx - (flip ? 5 - 1 - 2 : 2);
      if (std::abs(dy) > 1 || std::abs(dx) > 1) continue;
      bool all = true;
      for (int y = 0; y < 4 && all; ++y) {
        for (int x = 0; x < 5 && all; ++x) {
          const int ty = y + dy, tx = (flip ? 4 - x : x) + dx;
          for (int c = 0; c < 2; ++c) {
            const float want =
                ty < 0 || ty >= 4 || tx < 0 || tx >= 5 ? 0.0f : image[(ty * 5 + tx) * 2 + c];
            all &= out[(y * 5 + x) * 2 + c] == want;
          }
        }
      }
      if (all) {
        seen.insert({dy, dx, flip});
        matched = true;
      }
    }
    ASSERT_TRUE(matched) << "key " << key << " gave an image that is no shift or mirror";
  }
  // 3 x 3 shifts x 2 orientations, all drawn in 200 keys.
  EXPECT_EQ(seen.size(), 18u);
  // Another example at the same step draws independently.
  std::vector<float> a(40), b(40);
  int differ = 0;
  for (uint64_t key = 1; key <= 20; ++key) {
    (*model)->Augment(image.data(), 7, key, a.data());
    (*model)->Augment(image.data(), 8, key, b.data());
    differ += a != b;
  }
  EXPECT_GE(differ, 10);

  auto spec = ModelSpecFromConfig(Parse(R"pb(input_dim: 40
                                             input_shape { height: 4 width: 5 channels: 2 }
                                             augmentation { max_shift: 4 }
                                             network {
                                               name: "f"
                                               flatten {}
                                             }
                                             network {
                                               name: "o"
                                               dense { units: 2 }
                                             })pb"));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("augmentation.max_shift must be in [0, 4)"));
  spec = ModelSpecFromConfig(Parse(R"pb(input_dim: 40
                                        augmentation { max_shift: 1 }
                                        layers { units: 2 })pb"));
  ASSERT_FALSE(spec.ok());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("augmentation needs an image"));
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
  expect("input_dim: 4", "has no dense layers and no network");
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

// A batch gathered from the resident data computes what the same batch gathered on the host
// does, bit for bit; a dataset with a bad label, or a model that augments, is not made resident.
TEST(ModelTest, ResidentDataGathersTheSameBatches) {
  std::unique_ptr<Kernels> kernels = NewCpuKernels();
  const v1::ModelConfig config = Parse(R"pb(input_dim: 3
                                            layers { name: "h" units: 4 activation: RELU }
                                            layers { name: "o" units: 3 })pb");
  auto resident = Model::Create(config, kernels.get(), 4);
  auto host = Model::Create(config, kernels.get(), 4);
  ASSERT_TRUE(resident.ok() && host.ok());
  const int n = 10;
  std::vector<float> dense(n * 3), labels(n);
  for (int i = 0; i < n * 3; ++i) dense[i] = std::sin(0.7f * i);
  for (int i = 0; i < n; ++i) labels[i] = static_cast<float>(i % 3);
  ASSERT_TRUE((*resident)->SetResidentData(dense.data(), labels.data(), n).ok());
  std::vector<std::vector<float>> values;
  std::vector<const float*> params;
  for (int64_t size : (*host)->dense_sizes()) {
    values.emplace_back(size);
    for (int64_t i = 0; i < size; ++i) values.back()[i] = std::cos(0.3f * (i + size));
  }
  for (auto& v : values) params.push_back(v.data());
  const std::vector<int64_t> positions = {9, 2, 2, 5};
  std::vector<std::vector<float>> grads;
  std::vector<std::vector<float>> losses;
  for (Model* m : {resident->get(), host->get()}) {
    // The host model is given a copy: the same values, not the resident arrays.
    const std::vector<float> copy = dense;
    const float* from = m == resident->get() ? dense.data() : copy.data();
    ASSERT_TRUE(m->StageGathered(0, from, labels.data(), positions.data(), 4).ok());
    Model::Outputs out;
    std::vector<float> loss(4);
    std::vector<int32_t> predictions(4);
    std::vector<float> logits(4);
    auto ready = kernels->NewEvent();
    out.loss = loss.data();
    out.predictions = predictions.data();
    out.logits = logits.data();
    out.ready = ready.get();
    ASSERT_TRUE(m->Enqueue(0, params, {}, Model::Pass::kTraining, 1.0f, Model::Hooks(), out).ok());
    kernels->Synchronize(ready.get());
    grads.emplace_back(m->device_grads(), m->device_grads() + m->dense_total());
    losses.push_back(loss);
  }
  EXPECT_EQ(grads[0], grads[1]);
  EXPECT_EQ(losses[0], losses[1]);

  labels[7] = 3;
  absl::Status bad = (*host)->SetResidentData(dense.data(), labels.data(), n);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("label 3 of example 7 is out of range"));
  v1::ModelConfig augmenting = Parse(R"pb(input_dim: 4
                                          input_shape { height: 2 width: 2 channels: 1 }
                                          augmentation { max_shift: 1 }
                                          network {
                                            name: "f"
                                            flatten {}
                                          }
                                          network {
                                            name: "o"
                                            dense { units: 3 }
                                          })pb");
  auto image = Model::Create(augmenting, kernels.get(), 4);
  ASSERT_TRUE(image.ok()) << image.status();
  EXPECT_EQ((*image)->SetResidentData(dense.data(), labels.data(), 2).code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace pscluster
