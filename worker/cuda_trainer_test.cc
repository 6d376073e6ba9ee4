// The training-loop suite on GPUs: the pipelined step with device-resident parameters and
// gradients (copy streams, page-locked buffers), against the ps store in this process; the
// towers test when two GPUs are visible (NCCL). Needs a GPU.
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "worker/trainer_test_body.h"

namespace pscluster {
namespace {

std::vector<std::unique_ptr<Kernels>> Gpus(int n) {
  std::vector<std::unique_ptr<Kernels>> out;
  for (int i = 0; i < n; ++i) {
    CudaKernelsOptions options;
    options.device = i;
    absl::StatusOr<std::unique_ptr<Kernels>> k = NewCudaKernels(options);
    if (!k.ok()) {
      LOG(INFO) << "GPU " << i << ": " << k.status();
      break;
    }
    out.push_back(*std::move(k));
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Cuda, TrainerTest,
                         testing::Values(TrainerDevices{"cuda", &Gpus, /*exact=*/false}),
                         TrainerDevicesName);

// A step replayed from a captured graph computes what the same step launched kernel by kernel
// computes, on the parameters and the batch as they are when it runs: two models, one with
// capture, take the same six SGD steps on alternating input slots (two shapes: each runs once
// as usual, is captured on its second step and replayed after).
TEST(CudaModelCaptureTest, ReplayedStepsComputeWhatLaunchedStepsCompute) {
  v1::ModelConfig config;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        name: "capture"
        input_dim: 20
        seed: 3
        layers { name: "h" units: 16 activation: RELU }
        layers { name: "o" units: 4 }
        loss: SOFTMAX_CROSS_ENTROPY
        optimizer { sgd { learning_rate: 0.1 } }
      )pb",
      &config));
  constexpr int kBatch = 32;
  constexpr int kSteps = 6;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<std::vector<float>> features(kSteps, std::vector<float>(kBatch * 20));
  std::vector<std::vector<float>> labels(kSteps, std::vector<float>(kBatch));
  for (int s = 0; s < kSteps; ++s) {
    for (float& x : features[s]) x = uniform(rng);
    for (int i = 0; i < kBatch; ++i) labels[s][i] = static_cast<float>((s + i) % 4);
  }
  struct Run {
    std::vector<std::vector<float>> grads;  // per step
    std::vector<float> params;              // after the steps
    int64_t launches = 0;
  };
  auto run = [&](bool capture) {
    Run r;
    CudaKernelsOptions options;
    absl::StatusOr<std::unique_ptr<Kernels>> gpu = NewCudaKernels(options);
    EXPECT_TRUE(gpu.ok()) << gpu.status();
    if (!gpu.ok()) return r;
    absl::StatusOr<std::unique_ptr<Model>> model = Model::Create(config, gpu->get(), kBatch);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return r;
    Model& m = **model;
    Kernels& k = **gpu;
    m.set_capture(capture);
    EXPECT_EQ(m.capture(), capture);
    const int64_t n = m.dense_total();
    float* params = *k.AllocateFloats(n);
    std::vector<float> initial(n);
    std::mt19937 init_rng(11);
    for (float& x : initial) x = 0.3f * uniform(init_rng);
    k.CopyToDevice(initial.data(), params, n);
    std::vector<const float*> views;
    for (int64_t offset : m.dense_offsets()) views.push_back(params + offset);
    Model::Outputs outputs;
    outputs.loss = static_cast<float*>(*k.AllocateHost(kBatch * 4));
    outputs.predictions = static_cast<int32_t*>(*k.AllocateHost(kBatch * 4));
    std::unique_ptr<Kernels::Event> ready = k.NewEvent();
    outputs.ready = ready.get();
    for (int s = 0; s < kSteps; ++s) {
      Batch batch;
      batch.size = kBatch;
      batch.dense = features[s].data();
      batch.labels = labels[s].data();
      EXPECT_TRUE(m.StageInputs(s % Model::kInputSlots, batch, SparseInput()).ok());
      EXPECT_TRUE(m.Enqueue(s % Model::kInputSlots, views, {}, Model::Pass::kTraining, 1.0f,
                            Model::Hooks(), outputs)
                      .ok());
      std::vector<float> g(n);
      k.CopyToHost(m.device_grads(), g.data(), n);
      r.grads.push_back(g);
      k.Axpy(n, -0.1f, m.device_grads(), params);  // the graph reads the new values
      k.Synchronize(ready.get());
    }
    r.params.resize(n);
    k.CopyToHost(params, r.params.data(), n);
    r.launches = m.graph_launches();
    k.FreeHost(outputs.loss);
    k.FreeHost(outputs.predictions);
    return r;
  };
  const Run launched = run(false);
  const Run replayed = run(true);
  EXPECT_EQ(launched.launches, 0);
  EXPECT_EQ(replayed.launches, kSteps - Model::kInputSlots);
  ASSERT_EQ(replayed.grads.size(), launched.grads.size());
  for (int s = 0; s < kSteps; ++s) {
    SCOPED_TRACE(absl::StrCat("step ", s));
    ExpectNearModel({replayed.grads[s]}, {launched.grads[s]});
  }
  ExpectNearModel({replayed.params}, {launched.params});
}

}  // namespace
}  // namespace pscluster
