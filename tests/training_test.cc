// Training through the real daemons: a chief, ps tasks and workers on 127.0.0.1, on a slice of
// Fashion-MNIST (installed by tools/setup.sh) or data the test fixes or writes.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/grpc_ps_transport.h"
#include "client/parameter_client.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "model/data/shard.h"
#include "model/data/synthetic_criteo.h"
#include "model/input.h"
#include "model/model.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "ps_server/in_process_ps_transport.h"
#include "sharding/placement.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<v1::Coordinator::Stub> Chief(TestCluster& c) {
  return v1::Coordinator::NewStub(
      grpc::CreateChannel(c.chief_address(), grpc::InsecureChannelCredentials()));
}

bool Finished(const v1::ClusterStatus& s) { return s.progress().finished(); }

// The chief's model and a client of its ps tasks over gRPC, as a tool would make them.
struct RemoteModel {
  v1::GetModelResponse model;
  std::unique_ptr<ParameterClient> client;
};

absl::StatusOr<RemoteModel> ConnectToModel(v1::Coordinator::Stub& chief) {
  RemoteModel remote;
  grpc::ClientContext ctx;
  grpc::Status s = chief.GetModel(&ctx, v1::GetModelRequest(), &remote.model);
  if (!s.ok()) return absl::UnavailableError(s.error_message());
  std::vector<std::string> addresses(remote.model.ps_addresses().begin(),
                                     remote.model.ps_addresses().end());
  absl::StatusOr<std::unique_ptr<ParameterClient>> client = ParameterClient::Create(
      remote.model.model(), remote.model.placement(),
      std::make_unique<GrpcPsTransport>(addresses, GrpcPsTransportOptions()), {});
  if (!client.ok()) return client.status();
  remote.client = *std::move(client);
  return remote;
}

// A training mode, and (async) the workers' pipeline staleness.
struct SoftmaxRun {
  std::string mode;
  int staleness;
  // Chance is 0.10. Stale parameters cost SGD at rate 0.5 some accuracy: with the pipeline's
  // default staleness 1, two async workers end at 0.71-0.74 where they end at 0.81-0.83
  // without it (measured, 4 runs each).
  double min_accuracy;
  // The chief's --local_steps (async): the workers push a delta every this many steps.
  int local_steps = 1;
};

std::string SoftmaxRunName(const ::testing::TestParamInfo<SoftmaxRun>& info) {
  return absl::StrCat(
      info.param.mode, "_staleness", info.param.staleness,
      info.param.local_steps > 1 ? absl::StrCat("_local", info.param.local_steps) : "");
}

class SoftmaxRegressionTest : public ::testing::TestWithParam<SoftmaxRun> {};

TEST_P(SoftmaxRegressionTest, LearnsFashionMnistThroughTheDaemons) {
  const SoftmaxRun& run = GetParam();
  const std::string metrics =
      absl::StrCat(getenv("TEST_TMPDIR"), "/metrics-", SoftmaxRunName({run, 0}), ".jsonl");
  TestClusterOptions options;
  options.num_ps = 2;
  options.num_workers = 2;
  options.flags["chief"] = {"--model_config=" + RunfilePath("configs/softmax_regression.pbtxt"),
                            "--mode=" + run.mode,
                            "--max_train_examples=12000",
                            "--max_test_examples=2000",
                            "--epochs=3",
                            "--batch_size=50",
                            "--eval_every_secs=2",
                            "--metrics_file=" + metrics,
                            absl::StrCat("--local_steps=", run.local_steps)};
  // Reports every 10 ms: each is checked against the steps the chief granted.
  options.flags["worker"] = {absl::StrCat("--pipeline_staleness=", run.staleness),
                             "--report_every_secs=0.01"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = Chief(**cluster);
  v1::ClusterStatus status = AwaitStatus(*chief, Finished, absl::Seconds(240));
  ASSERT_TRUE(status.progress().finished()) << status.DebugString() << (*cluster)->Logs();
  EXPECT_GE(status.progress().test_accuracy(), run.min_accuracy) << status.DebugString();
  // The workers' reports say how stale their steps were: never beyond the bound (sync steps
  // never overlap).
  // With local steps: a step's values were refreshed from the ps at most 2K - 1 steps before.
  EXPECT_LE(status.progress().max_staleness(), run.local_steps > 1
                                                   ? 2 * run.local_steps - 1
                                                   : (run.mode == "sync" ? 0 : run.staleness));
  EXPECT_EQ(status.progress().workers_finished(), 2);
  // No worker's report was refused (each would restart its training).
  EXPECT_THAT((*cluster)->Logs(/*lines=*/100000),
              ::testing::Not(HasSubstr("training interrupted")));
  // 12000 examples, 2 workers, 3 epochs, batches of 50: 360 steps each.
  EXPECT_THAT(status.progress().worker_steps(), ::testing::ElementsAre(360, 360));
  if (run.mode == "sync") {
    EXPECT_EQ(status.global_step(), 360);
  }

  // The metrics file has one JSON line per evaluation, the last one the final accuracy.
  std::ifstream in(metrics);
  std::string line, last;
  int lines = 0;
  while (std::getline(in, line)) {
    last = line;
    ++lines;
  }
  EXPECT_GE(lines, 1);
  EXPECT_THAT(last, HasSubstr("\"test_accuracy\": "));
  EXPECT_THAT(last, HasSubstr(absl::StrCat("\"step\": ", status.progress().test_step())));
}

INSTANTIATE_TEST_SUITE_P(Modes, SoftmaxRegressionTest,
                         ::testing::Values(SoftmaxRun{"async", 0, 0.75},
                                           SoftmaxRun{"async", 1, 0.65},
                                           SoftmaxRun{"sync", 1, 0.75},
                                           SoftmaxRun{"async", 0, 0.70, 4}),
                         SoftmaxRunName);

// Wide & deep (configs/wide_deep.pbtxt) on click logs in the Criteo layout, read from files by
// the workers and the chief: the clicks come from a planted logistic model, so the test AUC is
// measured against the best any model can reach on the test file, not only against chance.
TEST(CtrTrainingTest, WideDeepLearnsCriteoFilesThroughTheDaemons) {
  const std::string dir = getenv("TEST_TMPDIR");
  SyntheticCriteoOptions data;
  data.num_int = 13;  // the model's input_dim
  data.num_cat = 8;
  data.ids_per_field = 50;
  data.seed = 5;
  data.num_examples = 40000;
  const std::string train_path = dir + "/criteo_train.txt";
  ASSERT_TRUE(WriteSyntheticCriteo(data, train_path).ok());
  data.num_examples = 5000;
  data.example_stream = 1;
  // The test file is gzip-compressed, which the reader finds by its first bytes.
  const std::string test_path = dir + "/criteo_test.txt.gz";
  absl::StatusOr<SyntheticCriteoSummary> planted = WriteSyntheticCriteo(data, test_path);
  ASSERT_TRUE(planted.ok()) << planted.status();

  TestClusterOptions options;
  options.num_ps = 2;
  options.num_workers = 2;
  options.flags["chief"] = {"--model_config=" + RunfilePath("configs/wide_deep.pbtxt"),
                            "--data=criteo",
                            "--data_path=" + train_path,
                            "--test_data_path=" + test_path,
                            "--criteo_cat_columns=8",
                            "--epochs=3",
                            "--batch_size=100",
                            "--eval_every_secs=60"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = Chief(**cluster);
  v1::ClusterStatus status = AwaitStatus(*chief, Finished, absl::Seconds(120));
  ASSERT_TRUE(status.progress().finished()) << status.DebugString() << (*cluster)->Logs();
  // 40,000 examples, 2 workers, 3 epochs, batches of 100: 600 steps each.
  EXPECT_THAT(status.progress().worker_steps(), ::testing::ElementsAre(600, 600));
  // Chance is 0.5; the planted model scores 0.783 on this test file, and training ends at
  // 0.770-0.772 (7 runs, about 2 s each).
  LOG(INFO) << "test AUC " << status.progress().test_auc() << ", planted model's "
            << planted->planted_auc;
  EXPECT_GE(status.progress().test_auc(), 0.72) << status.DebugString();
  EXPECT_GE(status.progress().test_auc(), planted->planted_auc - 0.03) << status.DebugString();
}

// N workers in sync mode with replicas_to_aggregate = N end with the parameters of one process
// doing SGD on batches N times larger.
TEST(SyncTrainingTest, EqualsOneProcessWithAnNTimesLargerBatch) {
  constexpr int kWorkers = 2, kBatch = 32, kExamples = 512;
  const std::string config_path = RunfilePath("configs/softmax_regression.pbtxt");
  TestClusterOptions options;
  options.num_ps = 2;
  options.num_workers = kWorkers;
  options.flags["chief"] = {"--model_config=" + config_path,
                            "--mode=sync",
                            absl::StrCat("--max_train_examples=", kExamples),
                            "--max_test_examples=100",
                            "--epochs=1",
                            absl::StrCat("--batch_size=", kBatch),
                            "--shuffle_seed=11",
                            "--max_partition_bytes=8000"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = Chief(**cluster);
  v1::ClusterStatus status = AwaitStatus(*chief, Finished, absl::Seconds(120));
  ASSERT_TRUE(status.progress().finished()) << (*cluster)->Logs();
  const int steps = kExamples / kWorkers / kBatch;
  ASSERT_EQ(status.global_step(), steps);

  auto remote = ConnectToModel(*chief);
  ASSERT_TRUE(remote.ok()) << remote.status();
  const v1::GetModelResponse& model = remote->model;

  // One process: the same initial values, the same examples (each step's batch is the union of
  // the workers' batches), one SGD step per global step on the mean gradient.
  auto placement = ComputePlacement(model.model(), 1, v1::PlacementOptions());
  ASSERT_TRUE(placement.ok());
  auto local = ParameterClient::Create(
      model.model(), *placement, std::make_unique<InProcessPsTransport>(1, ParameterStoreOptions()),
      {});
  ASSERT_TRUE(local.ok());
  ASSERT_TRUE((*local)->CreateAll(v1::SyncOptions()).ok());
  auto all = LoadDataset(model.training().data(), model.config().input_dim(), true);
  ASSERT_TRUE(all.ok()) << all.status();
  std::vector<Dataset> shards;
  std::vector<std::unique_ptr<BatchIterator>> iterators;
  for (int w = 0; w < kWorkers; ++w) shards.push_back(ShardDataset(*all, w, kWorkers));
  for (int w = 0; w < kWorkers; ++w) {
    iterators.push_back(std::make_unique<BatchIterator>(&shards[w], kBatch, 11));
    iterators.back()->StartEpoch(0);
  }
  std::unique_ptr<Kernels> kernels = NewCpuKernels();
  auto net = Model::Create(model.config(), kernels.get(), kWorkers * kBatch);
  ASSERT_TRUE(net.ok());
  const std::vector<std::string>& vars = (*net)->dense_variables();
  for (int s = 0; s < steps; ++s) {
    Dataset big;
    std::vector<Dataset> parts(kWorkers);
    for (int w = 0; w < kWorkers; ++w) ASSERT_TRUE(iterators[w]->Next(&parts[w]));
    big = parts[0];
    for (int w = 1; w < kWorkers; ++w) {
      big.dense.insert(big.dense.end(), parts[w].dense.begin(), parts[w].dense.end());
      big.labels.insert(big.labels.end(), parts[w].labels.begin(), parts[w].labels.end());
      big.num_examples += parts[w].num_examples;
    }
    std::vector<std::vector<float>> params;
    ASSERT_TRUE((*local)->Pull(vars, &params).ok());
    std::vector<const float*> ptrs;
    for (auto& p : params) ptrs.push_back(p.data());
    Batch b;
    b.size = static_cast<int>(big.num_examples);
    b.dense = big.dense.data();
    b.labels = big.labels.data();
    SparseInput sparse;
    Model::PrepareSparse(b, &sparse);
    StepResult r;
    ASSERT_TRUE((*net)->Compute(b, sparse, ptrs, {}, true, &r).ok());
    std::vector<const float*> grads;
    for (auto& g : r.dense_grads) grads.push_back(g.data());
    ASSERT_TRUE((*local)->Push(vars, grads, s).ok());
  }
  std::vector<std::vector<float>> got, want;
  ASSERT_TRUE(remote->client->Pull(vars, &got).ok());
  ASSERT_TRUE((*local)->Pull(vars, &want).ok());
  double max_rel = 0;
  for (size_t v = 0; v < vars.size(); ++v) {
    ASSERT_EQ(got[v].size(), want[v].size());
    for (size_t i = 0; i < got[v].size(); ++i) {
      const double diff = std::abs(got[v][i] - want[v][i]);
      max_rel = std::max(max_rel, diff / std::max(1e-2, std::abs(double(want[v][i]))));
      ASSERT_LE(diff, 1e-5 * std::max(1.0f, std::abs(want[v][i])))
          << vars[v] << "[" << i << "] distributed " << got[v][i] << " vs one process "
          << want[v][i];
    }
  }
  LOG(INFO) << "largest relative difference: " << max_rel;
}

// A small residual network (convolutions, batch normalization, an addition, max pooling) in
// synchronous training: it learns, and the moving statistics on the ps, which evaluation
// normalizes with, were updated by the workers' pushes.
TEST(ConvTrainingTest, ResidualCnnLearnsFashionMnistThroughTheDaemons) {
  const std::string config_path = absl::StrCat(getenv("TEST_TMPDIR"), "/residual_cnn.pbtxt");
  {
    std::ofstream out(config_path);
    out << R"pb(
      name: "residual_cnn"
      input_dim: 784
      input_shape { height: 28 width: 28 channels: 1 }
      network {
        name: "stem"
        conv2d { filters: 8 kernel_size: 3 stride: 2 }
      }
      network {
        name: "stem_bn"
        batch_norm { momentum: 0.9 }
      }
      network {
        name: "stem_relu"
        activation { activation: RELU }
      }
      network {
        name: "conv"
        conv2d { filters: 8 kernel_size: 3 }
      }
      network {
        name: "bn"
        batch_norm { momentum: 0.9 }
      }
      network {
        name: "add"
        inputs: [ "bn", "stem_relu" ]
        add { activation: RELU }
      }
      network {
        name: "pool"
        max_pool {}
      }
      network {
        name: "flat"
        flatten {}
      }
      network {
        name: "logits"
        dense { units: 10 }
      }
      loss: SOFTMAX_CROSS_ENTROPY
      optimizer { adam { learning_rate: 0.003 } }
      seed: 1
    )pb";
  }
  TestClusterOptions options;
  options.num_ps = 2;
  options.num_workers = 2;
  options.flags["chief"] = {
      "--model_config=" + config_path, "--mode=sync", "--max_train_examples=6000",
      "--max_test_examples=1000",      "--epochs=3",  "--batch_size=50"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = Chief(**cluster);
  v1::ClusterStatus status = AwaitStatus(*chief, Finished, absl::Seconds(300));
  ASSERT_TRUE(status.progress().finished()) << status.DebugString() << (*cluster)->Logs();
  LOG(INFO) << "test accuracy " << status.progress().test_accuracy();
  // Chance is 0.10; this network reaches about 0.8 on the slice.
  EXPECT_GE(status.progress().test_accuracy(), 0.65) << status.DebugString();
  EXPECT_EQ(status.global_step(), 6000 / 2 / 50 * 3);

  auto remote = ConnectToModel(*chief);
  ASSERT_TRUE(remote.ok()) << remote.status();
  std::vector<std::vector<float>> stats;
  ASSERT_TRUE(
      remote->client
          ->Pull({"stem_bn/moving_mean", "stem_bn/moving_variance", "bn/moving_variance"}, &stats)
          .ok());
  // Initial values are 0 and 1; the stem's input is pixels in [0, 1], so its convolution's
  // means move away from 0, and every variance away from 1.
  for (size_t v = 0; v < stats.size(); ++v) {
    ASSERT_EQ(stats[v].size(), 8u);
    const float initial = v == 0 ? 0.0f : 1.0f;
    int moved = 0;
    for (float x : stats[v]) {
      EXPECT_TRUE(std::isfinite(x));
      if (v > 0) {
        EXPECT_GE(x, 0.0f);
      }
      moved += std::abs(x - initial) > 1e-3f;
    }
    EXPECT_EQ(moved, 8) << "statistic " << v;
  }
}

// 3 workers, 2 gradients aggregated per step, one worker slowed: the step advances at the pace
// of the fastest two, and the slow worker's late gradients are dropped and counted.
TEST(SyncTrainingTest, BackupWorkerIsOutrunAndItsLateGradientsCounted) {
  TestClusterOptions options;
  options.num_ps = 1;
  options.num_workers = 3;
  options.flags["chief"] = {"--model_config=" + RunfilePath("configs/softmax_regression.pbtxt"),
                            "--mode=sync", "--replicas_to_aggregate=2", "--max_train_examples=6000",
                            "--max_test_examples=100", "--batch_size=50",
                            // 40 steps an epoch (2,000 examples a worker): 50 epochs, so that
                            // training outlasts the slow worker's start and several of its
                            // 400 ms steps, however fast the other two run; the checks below
                            // look at the first 40 steps and the first late gradient.
                            "--epochs=50"};
  options.flags["worker:2"] = {"--step_delay_ms=400"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = Chief(**cluster);
  v1::ClusterStatus status = AwaitStatus(
      *chief, [](const v1::ClusterStatus& s) { return s.global_step() >= 40; }, absl::Seconds(120));
  ASSERT_GE(status.global_step(), 40) << (*cluster)->Logs();
  // The step did not wait for the slow worker: it went on without its gradients. Had it
  // waited, the slow worker would have done every step; 400 ms slower a step than the others,
  // it did at most half of them however loaded the machine (its pace is at most half theirs
  // unless their own steps take over 400 ms).
  ASSERT_EQ(status.progress().worker_steps_size(), 3) << status.DebugString();
  EXPECT_LE(status.progress().worker_steps(2), status.global_step() / 2)
      << "the step waited for the slow worker: " << status.progress().DebugString();
  status = AwaitStatus(
      *chief,
      [](const v1::ClusterStatus& s) {
        return s.state().find("worker:2 had") != std::string::npos;
      },
      absl::Seconds(30));
  EXPECT_THAT(status.state(), HasSubstr("worker:2 had"));
  EXPECT_THAT(status.state(), HasSubstr("late gradients dropped"));
  // The ps task counted the dropped gradients per worker too.
  auto ps = v1::ParameterServer::NewStub(
      grpc::CreateChannel((*cluster)->address("ps:0"), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::ListShardsResponse shards;
  ASSERT_TRUE(ps->ListShards(&ctx, v1::ListShardsRequest(), &shards).ok());
  ASSERT_TRUE(shards.dropped_by_worker().count(2)) << shards.DebugString();
  EXPECT_GT(shards.dropped_by_worker().at(2), 0);
}

// SSP: with a slow worker, the fastest is never more than k steps ahead.
TEST(SspTrainingTest, FastestWorkerStaysWithinTheBound) {
  constexpr int kStaleness = 3;
  TestClusterOptions options;
  options.num_ps = 1;
  options.num_workers = 2;
  options.flags["chief"] = {"--model_config=" + RunfilePath("configs/softmax_regression.pbtxt"),
                            "--mode=ssp",
                            absl::StrCat("--staleness=", kStaleness),
                            "--max_train_examples=2000",
                            "--max_test_examples=100",
                            "--epochs=1",
                            "--batch_size=50",
                            "--max_steps=15"};
  options.flags["worker:1"] = {"--step_delay_ms=150"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = Chief(**cluster);
  int64_t max_observed = 0;
  v1::ClusterStatus status = AwaitStatus(
      *chief,
      [&](const v1::ClusterStatus& s) {
        if (s.progress().worker_steps_size() == 2) {
          max_observed = std::max(
              max_observed, std::abs(s.progress().worker_steps(0) - s.progress().worker_steps(1)));
        }
        return s.progress().workers_finished() == 2;
      },
      absl::Seconds(120));
  ASSERT_EQ(status.progress().workers_finished(), 2) << (*cluster)->Logs();
  // The bound was reached (the slow worker did hold the fast one back) and never passed.
  EXPECT_EQ(status.progress().max_lead(), kStaleness);
  // Completed-step counts may differ by one more while the slow worker is mid-step.
  EXPECT_LE(max_observed, kStaleness + 1);
}

}  // namespace
}  // namespace pscluster

namespace pscluster {
namespace {

// The data formats a user brings, each through the real daemons: files written here from a
// planted model, read by the workers (their shard) and by the chief (the test set), trained
// to the accuracy the planted model allows.
class DataFormatsTest : public ::testing::Test {
 protected:
  std::string Path(const std::string& name) {
    return absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  }

  // Trains `config_text` (written to a file) on `data_flags` with 1 ps and 2 workers, sync;
  // returns the final status.
  v1::ClusterStatus Train(const std::string& name, const std::string& config_text,
                          const std::vector<std::string>& data_flags, int epochs) {
    const std::string config = Path(name + ".pbtxt");
    std::ofstream(config) << config_text;
    TestClusterOptions options;
    options.num_ps = 1;
    options.num_workers = 2;
    options.flags["chief"] = {"--model_config=" + config, "--mode=sync",
                              absl::StrCat("--epochs=", epochs), "--batch_size=32",
                              "--eval_every_secs=60"};
    for (const std::string& f : data_flags) options.flags["chief"].push_back(f);
    auto cluster = TestCluster::Start(options);
    EXPECT_TRUE(cluster.ok()) << cluster.status();
    if (!cluster.ok()) return v1::ClusterStatus();
    auto chief = Chief(**cluster);
    v1::ClusterStatus status = AwaitStatus(*chief, Finished, absl::Seconds(180));
    EXPECT_TRUE(status.progress().finished()) << status.DebugString() << (*cluster)->Logs();
    EXPECT_EQ(status.progress().workers_finished(), 2);
    return status;
  }
};

// A planted logistic model over 4 dense features and one categorical feature of 8 values: the
// label is 1 when w . x + b(city) > 0 (noise-free), so a model that reads both kinds of
// feature reaches an AUC near 1 and one that reads only the dense features does not.
struct PlantedExample {
  float x[4];
  int city;
  int label;
};

std::vector<PlantedExample> Planted(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  const float w[4] = {1.5f, -2.0f, 0.75f, 1.0f};
  const float bias[8] = {-3, 3, -2, 2, -1, 1, -2.5f, 2.5f};
  std::vector<PlantedExample> out(n);
  for (PlantedExample& e : out) {
    float z = 0;
    for (int j = 0; j < 4; ++j) z += w[j] * (e.x[j] = normal(rng));
    e.city = static_cast<int>(rng() % 8);
    e.label = z + bias[e.city] > 0 ? 1 : 0;
  }
  return out;
}

// Wide & deep in small: a 4-dim mean embedding of the ids beside the 4 dense features, 16 ReLU
// units, one logit.
constexpr char kSmallCtrConfig[] = R"pb(
  name: "small_ctr"
  input_dim: 4
  embeddings {
    name: "ids"
    table: "ids"
    dim: 4
    combiner: MEAN
    optimizer { adagrad { learning_rate: 0.1 } }
  }
  layers { name: "hidden" units: 16 activation: RELU }
  layers { name: "logit" units: 1 activation: LINEAR }
  loss: SIGMOID_CROSS_ENTROPY
  optimizer { adam { learning_rate: 0.01 } }
  seed: 3
)pb";

TEST_F(DataFormatsTest, CsvWithAHeaderAndAStringColumnTrains) {
  for (const auto& [name, n, seed] :
       {std::make_tuple("train", 4000, 1u), std::make_tuple("test", 1000, 2u)}) {
    std::ofstream out(Path(absl::StrCat(name, ".csv")));
    out << "x0,x1,city,x2,note,clicked,x3\n";
    for (const PlantedExample& e : Planted(n, seed)) {
      // A quoted field with the delimiter in it, and a column the reader ignores.
      out << e.x[0] << "," << e.x[1] << ",city" << e.city << "," << e.x[2] << ",\"a, b\","
          << e.label << "," << e.x[3] << "\n";
    }
  }
  const v1::ClusterStatus s =
      Train("csv", kSmallCtrConfig,
            {"--data=csv", "--data_path=" + Path("train.csv"),
             "--test_data_path=" + Path("test.csv"), "--csv_header",
             "--csv_columns=x0:float,x1:float,city:string,x2:float,note:ignore,clicked:label,"
             "x3:float"},
            4);
  EXPECT_GE(s.progress().test_auc(), 0.95) << s.progress().DebugString();
}

TEST_F(DataFormatsTest, LibsvmWithDenseAndSparseIndicesTrains) {
  // Indices 0..3 are the dense features (input_dim 4); the city is one sparse id at 100 + city.
  for (const auto& [name, n, seed] :
       {std::make_tuple("train", 4000, 3u), std::make_tuple("test", 1000, 4u)}) {
    std::ofstream out(Path(absl::StrCat(name, ".svm")));
    for (const PlantedExample& e : Planted(n, seed)) {
      out << (e.label == 1 ? "+1" : "-1");
      for (int j = 0; j < 4; ++j) out << " " << j << ":" << e.x[j];
      out << " " << 100 + e.city << ":1  # city " << e.city << "\n";
    }
  }
  const v1::ClusterStatus s = Train(
      "libsvm", kSmallCtrConfig,
      {"--data=libsvm", "--data_path=" + Path("train.svm"), "--test_data_path=" + Path("test.svm")},
      4);
  EXPECT_GE(s.progress().test_auc(), 0.95) << s.progress().DebugString();
}

TEST_F(DataFormatsTest, Cifar10BinaryBatchesTrain) {
  // The standard folder's files (the training set in five batches, the test set in one, the
  // last gzip-compressed as a user may keep them), 32x32x3 images whose class is drawn in one
  // of ten horizontal bands of one channel, over noise.
  const std::string dir = Path("cifar-10-batches-bin");
  std::filesystem::create_directories(dir);
  std::mt19937 rng(5);
  auto write = [&](const std::string& file, int records) {
    std::ofstream out(dir + "/" + file, std::ios::binary);
    std::vector<unsigned char> record(3073);
    for (int r = 0; r < records; ++r) {
      const int label = static_cast<int>(rng() % 10);
      record[0] = static_cast<unsigned char>(label);
      for (int i = 0; i < 3072; ++i) record[1 + i] = static_cast<unsigned char>(rng() % 96);
      const int channel = label % 3;
      const int band = label;  // rows [3 * band, 3 * band + 3) of the 32
      for (int row = 3 * band; row < 3 * band + 3; ++row) {
        for (int col = 0; col < 32; ++col) record[1 + channel * 1024 + row * 32 + col] = 255;
      }
      out.write(reinterpret_cast<const char*>(record.data()), record.size());
    }
  };
  for (int b = 1; b <= 5; ++b) write(absl::StrCat("data_batch_", b, ".bin"), 200);
  write("test_batch.bin", 500);
  ASSERT_EQ(std::system(("gzip -f " + dir + "/test_batch.bin").c_str()), 0);
  const v1::ClusterStatus s = Train("cifar10", R"pb(
                                      name: "cifar_softmax"
                                      input_dim: 3072
                                      input_shape { height: 32 width: 32 channels: 3 }
                                      layers { name: "logits" units: 10 activation: LINEAR }
                                      loss: SOFTMAX_CROSS_ENTROPY
                                      optimizer { adam { learning_rate: 0.01 } }
                                      seed: 5
                                    )pb",
                                    {"--data=cifar10", "--data_path=" + dir}, 3);
  EXPECT_GE(s.progress().test_accuracy(), 0.95) << s.progress().DebugString();
}

}  // namespace
}  // namespace pscluster
