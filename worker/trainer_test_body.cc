// The training loop against the real chief (a Coordinator, InProcessChief) and ps stores
// (InProcessPsTransport) in this process, through the worker's own ChiefStepSource, on any
// Kernels backend (trainer_test.cc: the CPU; cuda_trainer_test.cc: GPUs).
#include "worker/trainer_test_body.h"

#include <atomic>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "chief/in_process_chief.h"
#include "client/parameter_client.h"
#include "common/clock.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "model/data/shard.h"
#include "model/model.h"
#include "ps_server/in_process_ps_transport.h"
#include "storage/crash_points.h"
#include "testing/model_snapshot.h"
#include "worker/step_pipeline.h"
#include "worker/step_source.h"
#include "worker/trainer.h"

namespace pscluster {
namespace {

constexpr int kBatch = 8;
constexpr int kExamples = 96;  // 12 batches an epoch
constexpr int kEpochs = 2;
constexpr int64_t kSteps = kEpochs * kExamples / kBatch;

constexpr char kMlp[] = R"pb(
  name: "tiny"
  input_dim: 4
  seed: 5
  layers { name: "h" units: 6 activation: RELU }
  layers { name: "o" units: 3 }
  loss: SOFTMAX_CROSS_ENTROPY
  optimizer { sgd { learning_rate: 0.2 } }
)pb";

// The same inputs as a 2x2 image through every kind of layer of a network: a convolution, batch
// normalization (whose moving statistics are pushed too), pooling, a 1x1 convolution added to
// its input, flatten and dense.
constexpr char kCnn[] = R"pb(
  name: "tiny_cnn"
  input_dim: 4
  input_shape { height: 2 width: 2 channels: 1 }
  seed: 5
  network {
    name: "c"
    conv2d { filters: 3 kernel_size: 2 use_bias: true }
  }
  network {
    name: "bn"
    batch_norm { momentum: 0.5 }
  }
  network {
    name: "relu"
    activation { activation: RELU }
  }
  network {
    name: "pool"
    max_pool {}
  }
  network {
    name: "c1"
    conv2d { filters: 3 kernel_size: 1 activation: TANH }
  }
  network {
    name: "add"
    inputs: [ "c1", "pool" ]
    add {}
  }
  network {
    name: "flat"
    flatten {}
  }
  network {
    name: "o"
    dense { units: 3 }
  }
  loss: SOFTMAX_CROSS_ENTROPY
  optimizer { sgd { learning_rate: 0.2 } }
)pb";

// The chief of a run: the model, 2 ps tasks, one worker, batches of kBatch for kEpochs.
InProcessChief::Options ChiefOptions(v1::UpdateMode mode, const char* config = kMlp,
                                     int local_steps = 1) {
  InProcessChief::Options o;
  CHECK(google::protobuf::TextFormat::ParseFromString(config, &o.config));
  o.placement.set_max_partition_bytes(48);  // h/kernel [4, 6] splits over both ps tasks
  o.training.set_batch_size(kBatch);
  o.training.set_epochs(kEpochs);
  o.training.set_shuffle_seed(3);
  o.sync.set_mode(mode);
  o.sync.set_replicas_to_aggregate(1);
  o.sync.set_local_steps(local_steps);
  return o;
}

Dataset MakeData() {
  std::mt19937 rng(11);
  std::normal_distribution<float> n(0, 1);
  Dataset d;
  d.num_examples = kExamples;
  d.dense_dim = 4;
  d.num_classes = 3;
  for (int i = 0; i < kExamples; ++i) {
    float x[4];
    for (float& v : x) v = n(rng);
    d.dense.insert(d.dense.end(), x, x + 4);
    d.labels.push_back(static_cast<float>(x[0] + x[1] > 0.5f ? 2 : (x[2] > 0 ? 1 : 0)));
  }
  return d;
}

// Every dense variable of the model `client` places.
std::vector<std::vector<float>> PullAll(ParameterClient* client) {
  std::vector<std::string> names;
  for (const v1::VariableSpec& v : client->model().variables()) names.push_back(v.name());
  std::vector<std::vector<float>> values;
  CHECK(client->Pull(names, &values).ok());
  return values;
}

std::vector<int64_t> AppliedSteps(PsTransport* ps) {
  std::vector<int64_t> out;
  for (int i = 0; i < ps->num_ps(); ++i) {
    auto list = ps->ListShards(i, v1::ListShardsRequest());
    CHECK(list.ok());
    for (const v1::ShardStats& s : list->shards()) out.push_back(s.applied_step());
  }
  return out;
}

// The worker's own StepSource (ChiefStepSource) over the chief, keeping the reports the chief
// took and the grants that said drain, for the test to read. Thread-safe.
class RecordingSource : public StepSource {
 public:
  RecordingSource(ChiefClient* chief, int32_t worker) : inner_(chief, worker) {}

  absl::Status Acquire(int64_t last_done_step, int64_t generation, int pushes_in_flight,
                       const std::function<bool()>& stop, StepGrant* grant) override {
    absl::Status s = inner_.Acquire(last_done_step, generation, pushes_in_flight, stop, grant);
    if (s.ok() && grant->drain) ++drains_;
    return s;
  }
  absl::Status Report(const StepReport& report) override {
    absl::Status s = inner_.Report(report);
    if (s.ok()) {
      absl::MutexLock lock(&mu_);
      reports_.push_back(report);
    }
    return s;
  }

  std::vector<StepReport> reports() const {
    absl::MutexLock lock(&mu_);
    return reports_;
  }
  int drains() const { return drains_.load(); }

 private:
  ChiefStepSource inner_;
  std::atomic<int> drains_{0};
  mutable absl::Mutex mu_;
  std::vector<StepReport> reports_ ABSL_GUARDED_BY(mu_);
};

// One run's cluster: the real chief over two ps stores in this process, which created and
// initialized the variables; the worker's source of steps; an observer that reads the model.
struct Cluster {
  explicit Cluster(const InProcessChief::Options& options) {
    auto started = InProcessChief::Start(options);
    CHECK(started.ok()) << started.status();
    chief = *std::move(started);
    source = std::make_unique<RecordingSource>(chief->client(0), 0);
    observer = Client();
  }
  const v1::GetModelResponse& m() const { return chief->model(); }
  std::unique_ptr<PsTransport> Transport() { return chief->stores().Share(); }
  std::unique_ptr<ParameterClient> Client(std::unique_ptr<PsTransport> transport = nullptr,
                                          int max_attempts = 5) {
    ParameterClientOptions options;
    options.worker = 0;
    options.max_attempts = max_attempts;
    options.initial_backoff = absl::Milliseconds(1);
    auto c = ParameterClient::Create(m().model(), m().placement(),
                                     transport ? std::move(transport) : Transport(), options);
    CHECK(c.ok());
    return *std::move(c);
  }
  std::vector<std::vector<float>> Values() { return PullAll(observer.get()); }
  // Updates applied to every dense shard (each must equal the steps pushed).
  std::vector<int64_t> Updates() { return AppliedSteps(Transport().get()); }
  // What the chief knows of the run.
  v1::TrainingProgress Progress() {
    v1::ClusterStatus status;
    chief->coordinator().GetClusterStatus(&status);
    return status.progress();
  }

  std::unique_ptr<InProcessChief> chief;
  std::unique_ptr<RecordingSource> source;
  std::unique_ptr<ParameterClient> observer;
};

// What one process computes with no overlap at all and no chief: stores of its own with the
// model `m` places, and for each batch in order, pull every variable, forward and backward,
// push.
std::vector<std::vector<float>> Sequential(const v1::GetModelResponse& m, const Dataset& data,
                                           Kernels* kernels) {
  InProcessPsTransport stores(m.placement().num_ps(), ParameterStoreOptions());
  auto c = ParameterClient::Create(m.model(), m.placement(), stores.Share(), {});
  CHECK(c.ok());
  std::unique_ptr<ParameterClient> client = *std::move(c);
  CHECK(client->CreateAll(m.sync()).ok());
  auto model = Model::Create(m.config(), kernels, kBatch);
  CHECK(model.ok());
  BatchIterator batches(&data, kBatch, m.training().shuffle_seed());
  int64_t step = 0;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    batches.StartEpoch(epoch);
    Dataset batch;
    while (batches.Next(&batch)) {
      std::vector<std::vector<float>> params;
      CHECK(client->Pull((*model)->dense_variables(), &params).ok());
      std::vector<const float*> ptrs;
      for (const auto& p : params) ptrs.push_back(p.data());
      SparseInput sparse;
      Model::PrepareSparse(AsBatch(batch), &sparse);
      StepResult r;
      CHECK((*model)->Compute(AsBatch(batch), sparse, ptrs, {}, true, &r).ok());
      std::vector<const float*> grads;
      for (const auto& g : r.dense_grads) grads.push_back(g.data());
      CHECK(client->Push((*model)->dense_variables(), grads, step++).ok());
    }
  }
  return PullAll(client.get());
}

struct RunResult {
  absl::Status status;
  int64_t steps = 0;
  int max_staleness = 0;
};

// Worker 0's training loop over the cluster's chief and stores (or `client`'s transport).
RunResult Train(Cluster& cluster, std::vector<Kernels*> towers, TrainerOptions options,
                std::unique_ptr<ParameterClient> client = nullptr) {
  if (client == nullptr) client = cluster.Client();
  options.report_every = absl::Milliseconds(1);
  Trainer trainer(cluster.m(), MakeData(), client.get(), towers, cluster.source.get(), options);
  RunResult r;
  r.status = trainer.Run([] { return false; });
  r.steps = trainer.steps();
  r.max_staleness = trainer.max_staleness();
  return r;
}

// Every example was reported, the last report says finished, and the chief counted the worker
// done after kSteps steps.
void ExpectFinishedAndCounted(Cluster& cluster) {
  std::vector<StepReport> reports = cluster.source->reports();
  ASSERT_FALSE(reports.empty());
  EXPECT_TRUE(reports.back().finished);
  EXPECT_EQ(reports.back().step, kSteps);
  int64_t examples = 0;
  for (const StepReport& rep : reports) examples += rep.examples;
  EXPECT_EQ(examples, kEpochs * kExamples);
  const v1::TrainingProgress progress = cluster.Progress();
  EXPECT_EQ(progress.workers_finished(), 1);
  EXPECT_THAT(progress.worker_steps(), ::testing::ElementsAre(kSteps));
}

// With no overlap between steps (staleness 0), the pipeline computes exactly what one process
// does step after step: the same bits.
TEST_P(TrainerTest, AsyncWithoutOverlapEqualsSequentialTraining) {
  Cluster cluster(ChiefOptions(v1::ASYNC));
  std::vector<std::unique_ptr<Kernels>> devices = Devices(1);
  Kernels* cpu = devices[0].get();
  TrainerOptions options;
  options.staleness = 0;
  RunResult r = Train(cluster, {cpu}, options);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.steps, kSteps);
  EXPECT_EQ(r.max_staleness, 0);
  ExpectSameModel(cluster.Values(), Sequential(cluster.m(), MakeData(), cpu));
  EXPECT_THAT(cluster.Updates(), ::testing::Each(kSteps));
  ExpectFinishedAndCounted(cluster);
}

// The same for a convolutional network, whose variables the pipeline pulls in groups.
TEST_P(TrainerTest, ConvolutionalNetworkWithoutOverlapEqualsSequentialTraining) {
  Cluster cluster(ChiefOptions(v1::ASYNC, kCnn));
  std::vector<std::unique_ptr<Kernels>> devices = Devices(1);
  TrainerOptions options;
  options.staleness = 0;
  RunResult r = Train(cluster, {devices[0].get()}, options);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.steps, kSteps);
  ExpectSameModel(cluster.Values(), Sequential(cluster.m(), MakeData(), devices[0].get()));
  EXPECT_THAT(cluster.Updates(), ::testing::Each(kSteps));
}

// SYNC with one replica: the token's global step picks the batch, and the result is again
// the sequential one.
TEST_P(TrainerTest, SyncEqualsSequentialTraining) {
  Cluster cluster(ChiefOptions(v1::SYNC));
  std::vector<std::unique_ptr<Kernels>> devices = Devices(1);
  Kernels* cpu = devices[0].get();
  TrainerOptions options;
  options.staleness = 3;  // ignored: sync steps never overlap
  RunResult r = Train(cluster, {cpu}, options);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.steps, kSteps);
  EXPECT_EQ(r.max_staleness, 0);
  EXPECT_EQ(cluster.chief->coordinator().CurrentStep(), kSteps);
  ExpectSameModel(cluster.Values(), Sequential(cluster.m(), MakeData(), cpu));
  // One report per step, and the final one.
  EXPECT_EQ(static_cast<int64_t>(cluster.source->reports().size()), kSteps + 1);
  ExpectFinishedAndCounted(cluster);
}

// Staleness 1: the next step's parameters are pulled while a slow push is still in flight, so
// steps see parameters one push behind, never more; every push is applied exactly once.
TEST_P(TrainerTest, PipelinedStepsAreAtMostOnePushStaleAndPushEverything) {
  Cluster cluster(ChiefOptions(v1::ASYNC));
  std::vector<std::unique_ptr<Kernels>> devices = Devices(1);
  Kernels* cpu = devices[0].get();
  TrainerOptions options;
  options.staleness = 1;
  options.step_delay = absl::Milliseconds(5);  // pushes take a while
  RunResult r = Train(cluster, {cpu}, options);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.steps, kSteps);
  EXPECT_EQ(r.max_staleness, 1);
  EXPECT_THAT(cluster.Updates(), ::testing::Each(kSteps));
  int max_reported = 0;
  for (const StepReport& rep : cluster.source->reports()) {
    max_reported = std::max(max_reported, rep.max_staleness);
    EXPECT_LE(rep.mean_staleness, 1.0f);
  }
  EXPECT_EQ(max_reported, 1);
  EXPECT_EQ(cluster.Progress().max_staleness(), 1);
}

// A transport whose answers to some pushes are lost after the ps applied them. Pushes the ps
// recognised as duplicates are counted in `*duplicates`, which the test keeps (the transport
// goes with its client).
class LosingTransport : public PsTransport {
 public:
  LosingTransport(std::unique_ptr<PsTransport> inner, std::vector<int> lose,
                  std::shared_ptr<std::atomic<int>> duplicates)
      : inner_(std::move(inner)), lose_(std::move(lose)), duplicates_(std::move(duplicates)) {}
  int num_ps() const override { return inner_->num_ps(); }
  absl::Status CreateShards(int ps, const v1::CreateShardsRequest& r,
                            v1::CreateShardsResponse* o) override {
    return inner_->CreateShards(ps, r, o);
  }
  absl::Status PullDense(int ps, const std::vector<DenseSlice>& s, v1::DataType w,
                         int64_t step) override {
    return inner_->PullDense(ps, s, w, step);
  }
  absl::Status PushDense(int ps, const std::vector<DenseSlice>& s, const PushMeta& meta,
                         v1::PushDenseResponse* o) override {
    absl::Status st = inner_->PushDense(ps, s, meta, o);
    const int n = pushes_.fetch_add(1);
    if (st.ok() && std::find(lose_.begin(), lose_.end(), n) != lose_.end()) {
      return absl::UnavailableError(absl::StrCat("push ", n, ": the answer was lost"));
    }
    if (st.ok() && o->duplicate()) duplicates_->fetch_add(1);
    return st;
  }
  absl::Status PullSparse(int ps, const std::string& t, const int64_t* k, int64_t n, int64_t d,
                          v1::DataType w, int64_t step, float* out) override {
    return inner_->PullSparse(ps, t, k, n, d, w, step, out);
  }
  absl::Status PushSparse(int ps, const std::string& t, const int64_t* k, int64_t n, int64_t d,
                          const float* g, const PushMeta& meta,
                          v1::PushSparseResponse* o) override {
    return inner_->PushSparse(ps, t, k, n, d, g, meta, o);
  }
  absl::StatusOr<v1::ListShardsResponse> ListShards(int ps,
                                                    const v1::ListShardsRequest& r) override {
    return inner_->ListShards(ps, r);
  }
  absl::StatusOr<v1::InspectShardResponse> InspectShard(int ps,
                                                        const v1::InspectShardRequest& r) override {
    return inner_->InspectShard(ps, r);
  }
  absl::Status SaveShards(int ps, const v1::SaveShardsRequest& r,
                          v1::SaveShardsResponse* o) override {
    return inner_->SaveShards(ps, r, o);
  }
  absl::Status RestoreShards(int ps, const v1::RestoreShardsRequest& r,
                             v1::RestoreShardsResponse* o) override {
    return inner_->RestoreShards(ps, r, o);
  }
  absl::StatusOr<v1::TaskStatus> GetStatus(int ps) override { return inner_->GetStatus(ps); }

 private:
  std::unique_ptr<PsTransport> inner_;
  const std::vector<int> lose_;
  std::atomic<int> pushes_{0};
  const std::shared_ptr<std::atomic<int>> duplicates_;
};

// Pushes whose answers are lost fail the step (no retry inside the client here); the pipeline
// sends them again with their request ids, the ps recognises them, and every step's gradient
// is applied exactly once.
TEST_P(TrainerTest, PushesWhoseAnswersAreLostAreAppliedOnce) {
  Cluster cluster(ChiefOptions(v1::ASYNC));
  auto duplicates = std::make_shared<std::atomic<int>>(0);
  auto losing = std::make_unique<LosingTransport>(cluster.Transport(),
                                                  std::vector<int>{3, 10, 11, 25}, duplicates);
  std::unique_ptr<ParameterClient> client = cluster.Client(std::move(losing), /*max_attempts=*/1);
  std::vector<std::unique_ptr<Kernels>> devices = Devices(1);
  Kernels* cpu = devices[0].get();
  // The trainer's own clock: its pauses before a retry pass at once.
  FakeClock trainer_clock;
  const absl::Time start = trainer_clock.Now();
  TrainerOptions options;
  options.staleness = 1;
  options.clock = &trainer_clock;
  RunResult r = Train(cluster, {cpu}, options, std::move(client));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.steps, kSteps);
  EXPECT_THAT(cluster.Updates(), ::testing::Each(kSteps));
  // Each lost answer's push was sent again and recognised (a retry can itself lose its answer,
  // so fewer duplicates than losses are possible, never none).
  EXPECT_GE(duplicates->load(), 1);
  EXPECT_LE(duplicates->load(), 4);
  // The failed steps paused (200 ms each) on the trainer's clock, not the wall's.
  EXPECT_GE(trainer_clock.Now() - start, absl::Milliseconds(200));
}

// Two towers, each half of the batch, sum their share-weighted gradients: the same training as
// one device with the whole batch, up to float rounding.
TEST_P(TrainerTest, TwoTowersEqualOneDeviceWithTheWholeBatch) {
  std::vector<std::unique_ptr<Kernels>> two = Devices(2);
  if (two.size() < 2) GTEST_SKIP() << "needs two devices";
  TrainerOptions options;
  options.staleness = 0;
  Cluster single(ChiefOptions(v1::ASYNC)), towers(ChiefOptions(v1::ASYNC));
  ASSERT_TRUE(Train(single, {two[0].get()}, options).status.ok());
  RunResult r = Train(towers, {two[0].get(), two[1].get()}, options);
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.steps, kSteps);
  const auto want = single.Values(), got = towers.Values();
  ASSERT_EQ(got.size(), want.size());
  for (size_t v = 0; v < got.size(); ++v) {
    for (size_t i = 0; i < got[v].size(); ++i) {
      EXPECT_NEAR(got[v][i], want[v][i], 1e-5) << "variable " << v << " element " << i;
    }
  }
}

// A checkpoint requested from the chief while a pipelined async worker has pushes in flight:
// the chief closes the gate, the worker is told to drain, and the cut comes only once its
// pushes are applied, so every shard of the checkpoint has taken the same steps. The workers
// are held only for the cut: training goes on while the ps tasks write it, before the chief
// commits it.
TEST_P(TrainerTest, ACheckpointDrainsThePipelineBeforeTheCutAndTrainingGoesOnWhileItIsWritten) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/trainer_test_cut_", GetParam().name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::vector<int64_t> at_commit, a_while_later;
  Cluster* running = nullptr;
  // The chief's first manifest is the checkpoint of the initial model; the second is ours,
  // written once every ps task has written its part.
  std::unique_ptr<CrashPoints> before_commit =
      CrashPoints::ForTest(kCrashManifestBeforeWrite, 2, [&] {
        at_commit = running->Updates();
        for (const absl::Time give_up = absl::Now() + absl::Seconds(10);
             absl::Now() < give_up && running->Updates() == at_commit;) {
          absl::SleepFor(absl::Milliseconds(2));
        }
        a_while_later = running->Updates();
      });
  InProcessChief::Options chief = ChiefOptions(v1::ASYNC);
  chief.checkpoint_dir = dir;
  chief.crash_points = before_commit.get();
  Cluster cluster(chief);
  running = &cluster;
  std::vector<std::unique_ptr<Kernels>> devices = Devices(1);
  TrainerOptions options;
  options.staleness = 1;
  options.step_delay = absl::Milliseconds(20);
  RunResult r;
  std::thread worker([&] { r = Train(cluster, {devices[0].get()}, options); });
  // Training under way: a step applied everywhere (and, with staleness 1, the next one's push
  // in flight).
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       absl::Now() < give_up && cluster.Updates()[0] == 0;) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  v1::CheckpointResponse saved;
  ASSERT_TRUE(cluster.chief->coordinator().Checkpoint(v1::CheckpointRequest(), &saved).ok());
  worker.join();
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_GE(cluster.source->drains(), 1);
  EXPECT_THAT(cluster.Updates(), ::testing::Each(kSteps));

  absl::StatusOr<ModelSnapshot> cut = ReadModelSnapshot(saved.path());
  ASSERT_TRUE(cut.ok()) << cut.status();
  ASSERT_FALSE(cut->dense_updates.empty());
  const int64_t cut_updates = cut->dense_updates.begin()->second;
  EXPECT_GT(cut_updates, 0);
  EXPECT_LT(cut_updates, kSteps);
  for (const auto& [shard, updates] : cut->dense_updates) {
    EXPECT_EQ(updates, cut_updates) << shard << ": a push half applied at the cut";
  }
  // Pushes were applied after the cut and before the commit.
  ASSERT_FALSE(at_commit.empty());
  EXPECT_THAT(at_commit, ::testing::Each(::testing::Ge(cut_updates)));
  EXPECT_NE(a_while_later, at_commit) << "training stood still while the checkpoint was written";
}

// The MLP with Adam (and a decay): the local steps must count the optimizer's updates as the
// ps does.
constexpr char kMlpAdam[] = R"pb(
  name: "tiny_adam"
  input_dim: 4
  seed: 5
  layers { name: "h" units: 6 activation: RELU }
  layers { name: "o" units: 3 }
  loss: SOFTMAX_CROSS_ENTROPY
  optimizer {
    adam { learning_rate: 0.05 }
    decay { decay_rate: 0.5 decay_steps: 10 }
  }
)pb";

// One worker with local steps trains the model that pushing every step trains: its local
// updates are the ps's optimizer run on the device, and the deltas it pushes add up to them
// (up to the rounding of value + (local - value)). Every 4 steps one delta: 6 updates per
// shard; every example reported.
// On a device that captures graphs, with the steps replayed from graphs and without.
TEST_P(TrainerTest, LocalStepsOfOneWorkerTrainWhatPushingEveryStepTrains) {
  const bool graphs = Devices(1)[0]->can_capture();
  std::vector<std::pair<bool, const char*>> runs;
  for (const bool cuda_graphs : {true, false}) {
    if (!cuda_graphs && !graphs) continue;
    for (const char* config : {kMlp, kMlpAdam, kCnn}) runs.emplace_back(cuda_graphs, config);
  }
  for (const auto& [cuda_graphs, config] : runs) {
    Cluster cluster(ChiefOptions(v1::ASYNC, config, /*local_steps=*/4));
    SCOPED_TRACE(absl::StrCat(cluster.m().config().name(), cuda_graphs ? ", graphs" : ""));
    std::vector<std::unique_ptr<Kernels>> devices = Devices(1);
    TrainerOptions options;
    options.cuda_graphs = cuda_graphs;
    RunResult r = Train(cluster, {devices[0].get()}, options);
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.steps, kSteps);
    // A step's values were refreshed from the ps K - 1 to 2K - 1 steps before at most (the
    // pulled values arrive while the next K steps compute).
    EXPECT_GE(r.max_staleness, 3);
    EXPECT_LE(r.max_staleness, 7);
    ExpectNearModel(cluster.Values(), Sequential(cluster.m(), MakeData(), devices[0].get()));
    EXPECT_THAT(cluster.Updates(), ::testing::Each(kSteps / 4));
    ExpectFinishedAndCounted(cluster);
  }
}

// Local steps on a worker of two towers: each step's batch split over them, their gradients
// summed and the same update applied to each tower's copy, so the worker trains what one
// device with the whole batch trains, and pushes one delta per K steps. A tower whose copy
// fell behind (its update skipped) would give the sum a gradient taken at other values. (With
// one worker the pulled values are the worker's own, so folding them in changes nothing to
// check here. Not the CNN: its batch norm takes each tower's statistics, as
// DistributedDataParallel's does per GPU.)
TEST_P(TrainerTest, LocalStepsOverTwoTowersTrainWhatOneDeviceWithTheWholeBatchTrains) {
  std::vector<std::unique_ptr<Kernels>> two = Devices(2);
  if (two.size() < 2) GTEST_SKIP() << "needs two devices";
  for (const char* config : {kMlp, kMlpAdam}) {
    Cluster cluster(ChiefOptions(v1::ASYNC, config, /*local_steps=*/4));
    SCOPED_TRACE(cluster.m().config().name());
    RunResult r = Train(cluster, {two[0].get(), two[1].get()}, TrainerOptions());
    ASSERT_TRUE(r.status.ok()) << r.status;
    EXPECT_EQ(r.steps, kSteps);
    EXPECT_LE(r.max_staleness, 7);
    ExpectNearModel(cluster.Values(), Sequential(cluster.m(), MakeData(), two[0].get()));
    EXPECT_THAT(cluster.Updates(), ::testing::Each(kSteps / 4));
    ExpectFinishedAndCounted(cluster);
  }
}

// A delta whose answer is lost fails the step that waits for it; the step is run again after
// the delta went through with its request ids, so each is added once.
TEST_P(TrainerTest, LocalStepDeltasWhoseAnswersAreLostAreAddedOnce) {
  Cluster cluster(ChiefOptions(v1::ASYNC, kMlp, /*local_steps=*/3));
  auto duplicates = std::make_shared<std::atomic<int>>(0);
  auto losing =
      std::make_unique<LosingTransport>(cluster.Transport(), std::vector<int>{2, 5}, duplicates);
  std::unique_ptr<ParameterClient> client = cluster.Client(std::move(losing), /*max_attempts=*/1);
  std::vector<std::unique_ptr<Kernels>> devices = Devices(1);
  FakeClock trainer_clock;  // no real pauses before the retries
  TrainerOptions options;
  options.clock = &trainer_clock;
  RunResult r = Train(cluster, {devices[0].get()}, options, std::move(client));
  ASSERT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.steps, kSteps);
  EXPECT_THAT(cluster.Updates(), ::testing::Each(kSteps / 3));
  EXPECT_GE(duplicates->load(), 1);
  ExpectNearModel(cluster.Values(), Sequential(cluster.m(), MakeData(), devices[0].get()));
}

// Local steps in sync mode, or with an optimizer the device does not run, are refused before a
// step, naming what was wrong (the chief's own flags refuse the first; the worker checks the
// model it is served all the same).
TEST_P(TrainerTest, LocalStepsAreRefusedInSyncModeAndForOtherOptimizers) {
  std::vector<std::unique_ptr<Kernels>> devices = Devices(1);
  {
    Cluster cluster(ChiefOptions(v1::SYNC, kMlp, /*local_steps=*/4));
    RunResult r = Train(cluster, {devices[0].get()}, TrainerOptions());
    EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status.message()), ::testing::HasSubstr("need async or ssp mode"));
    EXPECT_EQ(r.steps, 0);
  }
  {
    InProcessChief::Options options = ChiefOptions(v1::ASYNC, kMlp, /*local_steps=*/4);
    options.config.mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
    Cluster cluster(options);
    RunResult r = Train(cluster, {devices[0].get()}, TrainerOptions());
    EXPECT_EQ(r.status.code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(r.status.message()), ::testing::HasSubstr("not adagrad"));
    EXPECT_EQ(r.steps, 0);
  }
}

}  // namespace
}  // namespace pscluster
