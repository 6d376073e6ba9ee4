// Unit tests of the chief's logic without RPC: a Coordinator on a fake clock, over ps tasks
// that are ParameterStores in this process (InProcessPsTransport), with real checkpoint files.
// Chief restarts are a second Coordinator over the same stores and directory; a chief that
// stops in the middle of a recovery or a checkpoint is one frozen at a crash point (its thread
// blocked there) while its successor runs, and let go afterwards, fenced off by the ps tasks.

#include "chief/coordinator.h"

#include <atomic>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "chief/in_process_chief_client.h"
#include "client/task_registrar.h"
#include "common/clock.h"
#include "common/cluster_spec.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/in_process_ps_transport.h"
#include "storage/checkpoint.h"
#include "storage/crash_points.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

constexpr int kNumPs = 2;
constexpr int kNumWorkers = 2;

v1::ClusterConfig Cluster() {
  auto config = ParseTfConfig(R"({"cluster": {"chief": ["127.0.0.1:0"],
      "ps": ["127.0.0.1:0", "127.0.0.1:0"], "worker": ["127.0.0.1:0", "127.0.0.1:0"]},
      "task": {"type": "chief", "index": 0}})");
  CHECK(config.ok()) << config.status();
  return *config;
}

// Two dense variables (one per ps task, round robin) and a table on both, all with SGD.
v1::ModelSpec Model() {
  v1::ModelSpec model;
  for (const auto& [name, rows] : {std::pair<std::string, int>{"w", 16}, {"b", 1}}) {
    v1::VariableSpec* v = model.add_variables();
    v->set_name(name);
    v->mutable_shape()->add_dims(rows);
    v->mutable_shape()->add_dims(4);
    v->set_dtype(v1::DT_FLOAT32);
    v->mutable_initializer()->set_kind(v1::InitializerSpec::CONSTANT);
    v->mutable_initializer()->set_value(0.5f);
    v->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  }
  v1::TableSpec* t = model.add_tables();
  t->set_name("emb");
  t->set_dim(4);
  t->mutable_initializer()->set_kind(v1::InitializerSpec::CONSTANT);
  t->mutable_initializer()->set_value(0.25f);
  t->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.1f);
  return model;
}

// Polls `done` in real time; true when it held within `timeout`.
bool WaitFor(const std::function<bool()>& done, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return true;
}

// The model's dense values and the rows of a few table keys, as a worker would pull them.
struct ModelValues {
  std::vector<std::vector<float>> dense;
  std::vector<float> rows;
  bool operator==(const ModelValues& o) const { return dense == o.dense && rows == o.rows; }
};

class CoordinatorTest : public ::testing::Test {
 protected:
  CoordinatorTest()
      : clock_(absl::UnixEpoch() + absl::Hours(24 * 365 * 56), FakeClock::Waits::kBlock),
        ps_(kNumPs, ParameterStoreOptions()),
        dir_(absl::StrCat(::testing::TempDir(), "/coordinator_test_",
                          ::testing::UnitTest::GetInstance()->current_test_info()->name())) {
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }

  ~CoordinatorTest() override {
    // Every timed wait of every thread ends from here on, so that the chiefs can stop.
    clock_.set_waits(FakeClock::Waits::kJump);
    for (auto& f : freezes_) {
      if (!f->release.HasBeenNotified()) f->release.Notify();
    }
    chiefs_.clear();
  }

  CoordinatorOptions Options(v1::UpdateMode mode, CrashPoints* crash_points = nullptr) {
    CoordinatorOptions o;
    o.cluster = Cluster();
    o.model = Model();
    o.sync.set_mode(mode);
    o.checkpoint_dir = dir_;
    o.crash_points = crash_points;
    o.clock = &clock_;
    o.make_ps_transport = [this](const std::vector<std::string>& addresses)
        -> absl::StatusOr<std::unique_ptr<PsTransport>> {
      EXPECT_EQ(addresses.size(), static_cast<size_t>(kNumPs));
      std::unique_ptr<InProcessPsTransport> transport = ps_.Share();
      if (on_chief_transport_) on_chief_transport_(transport.get());
      return std::unique_ptr<PsTransport>(std::move(transport));
    };
    return o;
  }

  // A started chief, owned by the test.
  Coordinator* StartChief(const CoordinatorOptions& options) {
    absl::StatusOr<std::unique_ptr<Coordinator>> chief = Coordinator::Create(options);
    CHECK(chief.ok()) << chief.status();
    (*chief)->Start();
    chiefs_.push_back(*std::move(chief));
    return chiefs_.back().get();
  }

  // Stops `chief` and waits for it, moving the clock on meanwhile so that its timed waits end.
  void StopChief(Coordinator* chief) {
    chief->Stop();
    std::atomic<bool> joined{false};
    std::thread ticker([&] {
      while (!joined) {
        clock_.Advance(absl::Milliseconds(200));
        absl::SleepFor(absl::Milliseconds(1));
      }
    });
    chief->Join();
    joined = true;
    ticker.join();
  }

  // Registers task job:index with `chief`, at 127.0.0.1:port, as incarnation `incarnation`.
  static void Register(Coordinator* chief, const std::string& job, int index, uint64_t incarnation,
                       int port) {
    v1::RegisterTaskRequest req;
    *req.mutable_task() = MakeTaskId(job, index);
    req.set_address(absl::StrCat("127.0.0.1:", port));
    req.set_incarnation(incarnation);
    v1::RegisterTaskResponse resp;
    ASSERT_TRUE(chief->RegisterTask(req, &resp).ok());
  }

  // Registers every ps task (as incarnations ps_incarnation_[i]) and worker, and waits until
  // the model is ready.
  void RegisterAllAndAwaitReady(Coordinator* chief) {
    for (int i = 0; i < kNumPs; ++i) Register(chief, "ps", i, ps_incarnation_[i], 5000 + i);
    for (int i = 0; i < kNumWorkers; ++i) Register(chief, "worker", i, 100 + i, 6000 + i);
    ASSERT_TRUE(WaitFor([&] { return chief->phase() == v1::MODEL_READY; }))
        << v1::ChiefPhase_Name(chief->phase());
  }

  // A client of the stores with the placement the chief serves, as a worker (or a tool) uses.
  std::unique_ptr<ParameterClient> ClientOf(Coordinator* chief) {
    v1::GetModelRequest req;
    v1::GetModelResponse model;
    CHECK(chief->GetModel(req, CallContext(), &model).ok());
    absl::StatusOr<std::unique_ptr<ParameterClient>> client = ParameterClient::Create(
        model.model(), model.placement(), ps_.Share(), ParameterClientOptions());
    CHECK(client.ok()) << client.status();
    return *std::move(client);
  }

  ModelValues Values(ParameterClient* client) {
    ModelValues v;
    CHECK(client->Pull({"w", "b"}, &v.dense).ok());
    const std::vector<int64_t> keys = {1, 2, 3, 1000003};
    v.rows.resize(keys.size() * 4);
    CHECK(client->PullRows("emb", keys.data(), keys.size(), v.rows.data()).ok());
    return v;
  }

  // An ASYNC update of every variable and of a few rows, by `scale`.
  void Train(ParameterClient* client, float scale) {
    const std::vector<float> gw(16 * 4, scale), gb(4, -scale);
    ASSERT_TRUE(client->Push({"w", "b"}, {gw.data(), gb.data()}, 0).ok());
    const std::vector<int64_t> keys = {1, 3, 1000003};
    const std::vector<float> grads(keys.size() * 4, scale);
    ASSERT_TRUE(client->PushRows("emb", keys.data(), keys.size(), grads.data(), 0).ok());
  }

  static absl::StatusOr<v1::CheckpointResponse> Checkpoint(Coordinator* chief) {
    v1::CheckpointResponse resp;
    absl::Status s = chief->Checkpoint(v1::CheckpointRequest(), &resp);
    if (!s.ok()) return s;
    return resp;
  }

  bool RecoveryRecorded() const {
    return ReadRecoveryIntent(dir_).status().code() != absl::StatusCode::kNotFound;
  }

  // The ps tasks restart (empty stores) and register again, ps:0 at a new port.
  void RestartPs(Coordinator* chief) {
    for (int i = 0; i < kNumPs; ++i) {
      ps_.RestartTask(i);
      ++ps_incarnation_[i];
    }
    Register(chief, "ps", 0, ps_incarnation_[0], 5100);
    Register(chief, "ps", 1, ps_incarnation_[1], 5001);
  }

  // Whether every ps task holds its shards, restored (not held waiting for a restore).
  bool PsServing(ParameterClient* client) {
    for (int ps = 0; ps < kNumPs; ++ps) {
      absl::StatusOr<v1::ListShardsResponse> shards =
          ps_.Share()->ListShards(ps, v1::ListShardsRequest());
      if (!shards.ok() || shards->shards_size() == 0) return false;
    }
    std::vector<std::vector<float>> out;
    return client->Pull({"w", "b"}, &out).ok();
  }

  FakeClock clock_;
  InProcessPsTransport ps_;
  // Called with each transport a chief makes to the ps tasks (for failure injection).
  std::function<void(InProcessPsTransport*)> on_chief_transport_;
  // A crash point for a chief that stops there: its thread blocks until `release`.
  struct Freeze {
    absl::Notification reached, release;
    std::unique_ptr<CrashPoints> points;
  };
  Freeze* FreezeAt(const std::string& point, int nth) {
    freezes_.push_back(std::make_unique<Freeze>());
    Freeze* f = freezes_.back().get();
    f->points = CrashPoints::ForTest(point, nth, [f] {
      f->reached.Notify();
      f->release.WaitForNotification();
    });
    return f;
  }
  // The chief that stopped at `f` goes on: it finds that it has been replaced (a newer
  // chief's epoch refused by the ps tasks, or recorded beside the checkpoints) and stops,
  // FAILED. `ahead` runs meanwhile, before the check.
  void ReleaseReplaced(
      Freeze* f, Coordinator* chief, const std::function<void()>& ahead = [] {}) {
    f->release.Notify();
    ahead();
    ASSERT_TRUE(WaitFor([&] { return chief->phase() == v1::FAILED; }))
        << v1::ChiefPhase_Name(chief->phase());
    v1::ClusterStatus status;
    chief->GetClusterStatus(&status);
    EXPECT_THAT(status.phase_detail(), HasSubstr("replaced by a newer chief"));
    EXPECT_TRUE(chief->stop_requested());
    StopChief(chief);
  }

  std::vector<std::unique_ptr<Freeze>> freezes_;  // outlive the chiefs
  std::vector<std::unique_ptr<Coordinator>> chiefs_;
  const std::string dir_;
  uint64_t ps_incarnation_[kNumPs] = {11, 12};
};

TEST_F(CoordinatorTest, InitializesTheVariablesAndCheckpointsThemBeforeTheFirstStep) {
  Coordinator* chief = StartChief(Options(v1::ASYNC));
  EXPECT_EQ(chief->phase(), v1::WAITING_FOR_PS);
  v1::GetModelResponse model;
  absl::Status not_ready = chief->GetModel(v1::GetModelRequest(), CallContext(), &model);
  EXPECT_EQ(not_ready.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(not_ready.message()), HasSubstr("waiting for the ps tasks"));
  v1::ClusterStatus status;
  chief->GetClusterStatus(&status);
  EXPECT_THAT(status.state(), HasSubstr("waiting for"));

  RegisterAllAndAwaitReady(chief);
  ASSERT_TRUE(chief->GetModel(v1::GetModelRequest(), CallContext(), &model).ok());
  EXPECT_THAT(model.ps_addresses(), ::testing::ElementsAre("127.0.0.1:5000", "127.0.0.1:5001"));
  EXPECT_EQ(model.placement().partitions_size(), 2);
  std::unique_ptr<ParameterClient> client = ClientOf(chief);
  const ModelValues initial = Values(client.get());
  EXPECT_EQ(initial.dense[0], std::vector<float>(64, 0.5f));
  EXPECT_EQ(initial.rows, std::vector<float>(16, 0.25f));

  absl::StatusOr<std::vector<std::string>> committed = ListCheckpoints(dir_);
  ASSERT_TRUE(committed.ok()) << committed.status();
  ASSERT_EQ(committed->size(), 1u);
  EXPECT_EQ(ReadManifest(committed->front())->step(), 0);
  chief->GetClusterStatus(&status);
  EXPECT_EQ(status.phase(), v1::MODEL_READY);
  EXPECT_EQ(status.last_checkpoint(), committed->front());
}

TEST_F(CoordinatorTest, ACheckpointWaitsForTheStepUnderWayAndGivesUpOnTheClock) {
  Coordinator* chief = StartChief(Options(v1::SYNC));
  RegisterAllAndAwaitReady(chief);
  // Both workers take their token for step 0; worker 0 ends the step, worker 1 does not.
  int64_t generation = 0;
  for (int w = 0; w < kNumWorkers; ++w) {
    v1::AcquireTokenRequest req;
    req.set_worker(w);
    req.set_step(-1);  // no step done yet
    v1::AcquireTokenResponse token;
    ASSERT_TRUE(chief->AcquireToken(req, CallContext(), &token).ok());
    EXPECT_EQ(token.step(), 0);
    generation = token.generation();
  }
  auto report = [&](int w) {
    v1::ReportStepRequest req;
    req.set_worker(w);
    req.set_step(1);
    req.set_examples(32);
    req.set_loss(1.0f);
    req.set_generation(generation);
    v1::ReportStepResponse resp;
    return chief->ReportStep(req, &resp);
  };
  ASSERT_TRUE(report(0).ok());

  // The checkpoint waits for the step boundary: 10 s of the chief's clock, however long in
  // real time, then gives up naming the worker the step waits for.
  std::atomic<bool> returned{false};
  absl::StatusOr<v1::CheckpointResponse> late;
  std::thread cut([&] {
    late = Checkpoint(chief);
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(returned);
  clock_.Advance(absl::Seconds(9));
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(returned);
  clock_.Advance(absl::Seconds(1));
  cut.join();
  ASSERT_EQ(late.status().code(), absl::StatusCode::kUnavailable) << late.status();
  EXPECT_THAT(std::string(late.status().message()), HasSubstr("waits for worker:1"));
  EXPECT_EQ(ListCheckpoints(dir_)->size(), 1u);  // only the one before the first step

  // Again, and worker 1 ends the step meanwhile: the checkpoint is cut at step 1.
  std::thread cut_again([&] { late = Checkpoint(chief); });
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_TRUE(report(1).ok());
  cut_again.join();
  ASSERT_TRUE(late.ok()) << late.status();
  EXPECT_EQ(late->step(), 1);
  EXPECT_EQ(ReadManifest(late->path())->step(), 1);
  v1::AcquireTokenRequest next;
  next.set_worker(0);
  next.set_step(0);  // the last step it completed
  next.set_generation(generation);
  v1::AcquireTokenResponse token;
  ASSERT_TRUE(chief->AcquireToken(next, CallContext(), &token).ok());
  EXPECT_EQ(token.step(), 1);
}

TEST_F(CoordinatorTest, AnInitializationThatCannotReachAPsTaskStartsAgainWithItsNewAddress) {
  CoordinatorOptions options = Options(v1::ASYNC);
  options.ps_call_attempts = 3;
  options.ps_call_max_backoff = absl::Milliseconds(1);
  // The chief's first transport finds ps:1 gone for all 3 attempts; the next one, twice.
  std::atomic<int> transports{0};
  on_chief_transport_ = [&](InProcessPsTransport* t) {
    t->FailNextCalls(1, ++transports == 1 ? 3 : 2);
  };
  Coordinator* chief = StartChief(options);
  for (int i = 0; i < kNumPs; ++i) Register(chief, "ps", i, ps_incarnation_[i], 5000 + i);
  ASSERT_TRUE(WaitFor([&] {
    v1::ClusterStatus status;
    chief->GetClusterStatus(&status);
    return absl::StrContains(status.phase_detail(), "initializing again");
  }));
  EXPECT_EQ(chief->phase(), v1::WAITING_FOR_PS);
  // ps:1 comes back elsewhere; the next attempt, a slice of the chief's clock later, uses it.
  // The phase is set just before the chief reads the clock for that slice's deadline: a slice
  // moved on in between is not the one it waits for, so move on another while it still waits
  // (never more than a few: 5 s would find the tasks missing).
  Register(chief, "ps", 1, ++ps_incarnation_[1], 5201);
  bool ready = false;
  for (int slice = 0; slice < 5 && !ready; ++slice) {
    clock_.Advance(absl::Milliseconds(200));
    ready = WaitFor([&] { return chief->phase() == v1::MODEL_READY; },
                    absl::Seconds(slice < 4 ? 2 : 30));
  }
  ASSERT_TRUE(ready) << v1::ChiefPhase_Name(chief->phase());
  v1::GetModelResponse model;
  ASSERT_TRUE(chief->GetModel(v1::GetModelRequest(), CallContext(), &model).ok());
  EXPECT_EQ(model.ps_addresses(1), "127.0.0.1:5201");
  EXPECT_EQ(transports, 2);
}

TEST_F(CoordinatorTest, RestartedPsTasksAreRestoredToTheLatestCheckpointAtTheirNewAddress) {
  Coordinator* chief = StartChief(Options(v1::ASYNC));
  RegisterAllAndAwaitReady(chief);
  std::unique_ptr<ParameterClient> client = ClientOf(chief);
  Train(client.get(), 1.0f);
  const ModelValues saved = Values(client.get());
  ASSERT_TRUE(Checkpoint(chief).ok());
  Train(client.get(), 2.0f);
  ASSERT_FALSE(Values(client.get()) == saved);

  RestartPs(chief);
  // The chief notices on its next round, a slice of its clock later.
  clock_.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(WaitFor([&] { return PsServing(client.get()) && !RecoveryRecorded(); }));
  ASSERT_TRUE(WaitFor([&] { return chief->phase() == v1::MODEL_READY; }));
  EXPECT_TRUE(Values(client.get()) == saved);
  v1::GetModelResponse model;
  ASSERT_TRUE(chief->GetModel(v1::GetModelRequest(), CallContext(), &model).ok());
  EXPECT_EQ(model.ps_addresses(0), "127.0.0.1:5100");
}

TEST_F(CoordinatorTest, ARestartedChiefResumesFromTheClusterState) {
  ModelValues trained;
  {
    Coordinator* first = StartChief(Options(v1::ASYNC));
    RegisterAllAndAwaitReady(first);
    std::unique_ptr<ParameterClient> client = ClientOf(first);
    Train(client.get(), 1.0f);
    trained = Values(client.get());
    StopChief(first);
  }
  // The ps tasks kept their shards: nothing is restored, the trained values stay.
  Coordinator* second = StartChief(Options(v1::ASYNC));
  RegisterAllAndAwaitReady(second);
  std::unique_ptr<ParameterClient> client = ClientOf(second);
  EXPECT_TRUE(Values(client.get()) == trained);
  EXPECT_FALSE(RecoveryRecorded());
}

TEST_F(CoordinatorTest, ARestartedChiefBeforeThePsTasksRegisteredStartsNormally) {
  Coordinator* first = StartChief(Options(v1::SYNC));
  Register(first, "ps", 0, ps_incarnation_[0], 5000);
  EXPECT_EQ(first->phase(), v1::WAITING_FOR_PS);
  StopChief(first);
  Coordinator* second = StartChief(Options(v1::SYNC));
  RegisterAllAndAwaitReady(second);
  EXPECT_EQ(ListCheckpoints(dir_)->size(), 1u);
  EXPECT_EQ(second->CurrentStep(), 0);
}

// What replication 2 does not cover yet (tables in sync mode, tables with admission or
// eviction) is refused before the chief starts, naming why, rather than left without backups
// that a failover would trust.
TEST_F(CoordinatorTest, ReplicationTwoIsRefusedWhereBackupsWouldFallBehind) {
  CoordinatorOptions with_table = Options(v1::SYNC);
  with_table.placement.set_replication(2);
  absl::StatusOr<std::unique_ptr<Coordinator>> chief = Coordinator::Create(with_table);
  ASSERT_EQ(chief.status().code(), absl::StatusCode::kInvalidArgument) << chief.status();
  EXPECT_THAT(std::string(chief.status().message()),
              ::testing::HasSubstr("table emb's sync steps are not forwarded"));
  // Async tables are replicated, but not their admission or eviction decisions.
  for (v1::UpdateMode mode : {v1::ASYNC, v1::SSP}) {
    CoordinatorOptions async_table = Options(mode);
    async_table.placement.set_replication(2);
    EXPECT_TRUE(Coordinator::Create(async_table).ok()) << v1::UpdateMode_Name(mode);
    async_table.model.mutable_tables(0)->mutable_admission()->set_min_count(2);
    chief = Coordinator::Create(async_table);
    ASSERT_EQ(chief.status().code(), absl::StatusCode::kInvalidArgument) << chief.status();
    EXPECT_THAT(std::string(chief.status().message()),
                ::testing::HasSubstr("table emb has admission"));
    async_table.model.mutable_tables(0)->clear_admission();
    async_table.model.mutable_tables(0)->mutable_eviction();
    chief = Coordinator::Create(async_table);
    ASSERT_EQ(chief.status().code(), absl::StatusCode::kInvalidArgument) << chief.status();
    EXPECT_THAT(std::string(chief.status().message()),
                ::testing::HasSubstr("table emb has eviction"));
  }

  CoordinatorOptions dense_only = Options(v1::SYNC);
  dense_only.model.clear_tables();
  dense_only.placement.set_replication(3);
  chief = Coordinator::Create(dense_only);
  ASSERT_EQ(chief.status().code(), absl::StatusCode::kInvalidArgument) << chief.status();
  EXPECT_THAT(std::string(chief.status().message()), ::testing::HasSubstr("not 3"));

  // Dense variables are replicated in every mode: sync steps' gradients are forwarded too.
  for (v1::UpdateMode mode : {v1::SYNC, v1::ASYNC, v1::SSP}) {
    dense_only.sync.set_mode(mode);
    dense_only.placement.set_replication(2);
    EXPECT_TRUE(Coordinator::Create(dense_only).ok()) << v1::UpdateMode_Name(mode);
  }
}

// The ChiefClient's loops and the registrar, against the real chief logic through the
// in-process client.
TEST_F(CoordinatorTest, AwaitModelWaitsForTheModelAndStopsWhenAsked) {
  Coordinator* chief = StartChief(Options(v1::ASYNC));
  InProcessChiefClient client(chief, &clock_);
  v1::GetModelResponse model;
  absl::Status not_yet = client.GetModel(&model);
  EXPECT_EQ(not_yet.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(not_yet.message()), HasSubstr("not ready"));
  // A caller that stops gets CANCELLED (each poll ends with a slice of the clock).
  std::atomic<bool> stop{false};
  absl::StatusOr<v1::GetModelResponse> stopped;
  std::thread waiter([&] { stopped = client.AwaitModel([&] { return stop.load(); }); });
  absl::SleepFor(absl::Milliseconds(20));
  stop = true;
  clock_.Advance(client.options().poll_slice);
  waiter.join();
  EXPECT_EQ(stopped.status().code(), absl::StatusCode::kCancelled);

  absl::StatusOr<v1::GetModelResponse> ready;
  std::thread fetcher([&] { ready = client.AwaitModel([] { return false; }); });
  RegisterAllAndAwaitReady(chief);
  fetcher.join();
  ASSERT_TRUE(ready.ok()) << ready.status();
  EXPECT_EQ(ready->ps_addresses_size(), kNumPs);
}

TEST_F(CoordinatorTest, AwaitTokenLongPollsUntilGrantedOrStopped) {
  Coordinator* chief = StartChief(Options(v1::SYNC));
  RegisterAllAndAwaitReady(chief);
  InProcessChiefClient client(chief, &clock_);
  v1::AcquireTokenRequest first;
  first.set_worker(0);
  first.set_step(-1);
  v1::AcquireTokenResponse token;
  ASSERT_TRUE(client
                  .AwaitToken(
                      first, [] { return false; }, &token)
                  .ok());
  EXPECT_EQ(token.step(), 0);

  // Worker 0 has done step 0, worker 1 has not: the next token waits, poll after poll, until
  // the caller stops.
  v1::AcquireTokenRequest next = first;
  next.set_step(0);
  next.set_generation(token.generation());
  std::atomic<int> polls{0};
  absl::Status stopped;
  std::thread waiter([&] {
    stopped = client.AwaitToken(
        next, [&] { return ++polls >= 3; }, &token);
  });
  while (polls < 3) {
    clock_.Advance(client.options().poll_slice);
    absl::SleepFor(absl::Milliseconds(5));
  }
  waiter.join();
  EXPECT_EQ(stopped.code(), absl::StatusCode::kCancelled);
  // A refused request is the chief's error, at once.
  v1::AcquireTokenRequest stranger = first;
  stranger.set_worker(9);
  absl::Status refused = client.AwaitToken(
      stranger, [] { return false; }, &token);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("worker 9 is not in the cluster"));
}

TEST_F(CoordinatorTest, TheRegistrarRegistersAndHeartbeatsThroughAChiefClient) {
  CoordinatorOptions options = Options(v1::ASYNC);
  options.heartbeat_interval = absl::Milliseconds(20);
  Coordinator* chief = StartChief(options);
  TaskRegistrarOptions reg;
  reg.task = MakeTaskId("worker", 1);
  reg.address = "127.0.0.1:7123";
  std::atomic<int> registered{0};
  reg.on_registered = [&] { ++registered; };
  TaskRegistrar registrar(std::make_unique<InProcessChiefClient>(chief, &clock_), reg,
                          [](v1::HeartbeatRequest* req) {
                            req->set_step(42);
                            req->set_detail("training");
                          });
  registrar.Start();
  ASSERT_TRUE(registrar.AwaitRegistered(absl::Now() + absl::Seconds(10)));
  // on_registered runs just after the registration is recorded.
  ASSERT_TRUE(WaitFor([&] { return registered == 1; }));
  auto worker1 = [&] {
    v1::ClusterStatus status;
    chief->GetClusterStatus(&status);
    for (const v1::TaskStatus& t : status.tasks()) {
      if (TaskName(t.task()) == "worker:1") return t;
    }
    return v1::TaskStatus();
  };
  ASSERT_TRUE(WaitFor([&] { return worker1().step() == 42; }));
  EXPECT_EQ(worker1().address(), "127.0.0.1:7123");
  EXPECT_EQ(worker1().health(), v1::HEALTH_SERVING);
  EXPECT_EQ(worker1().detail(), "training");
  registrar.Stop();
}

// A chief that stops at `point` (frozen there) while it recovers restarted ps tasks, or while
// it commits a checkpoint; a successor starts meanwhile and must leave the model the old chief
// was bringing about, with no recovery record left; then the old chief is let go, and the ps
// tasks refuse what it still tries (a newer chief's epoch), so the model stays.
class ChiefStopsMidwayTest : public CoordinatorTest,
                             public ::testing::WithParamInterface<const char*> {};
// The same at the points of a recovery only.
class ChiefStopsMidwayRecoveringTest : public ChiefStopsMidwayTest {};

TEST_P(ChiefStopsMidwayTest, ItsSuccessorFinishesTheWork) {
  const std::string point = GetParam();
  const bool in_recovery = point.rfind("recovery_", 0) == 0;
  // The first visit of a manifest point is the checkpoint before the first step.
  Freeze* freeze = FreezeAt(point, in_recovery ? 1 : 2);
  Coordinator* old_chief = StartChief(Options(v1::ASYNC, freeze->points.get()));
  RegisterAllAndAwaitReady(old_chief);
  std::unique_ptr<ParameterClient> client = ClientOf(old_chief);
  Train(client.get(), 1.0f);
  ModelValues expected = Values(client.get());

  std::thread checkpoint;
  if (in_recovery) {
    ASSERT_TRUE(Checkpoint(old_chief).ok());
    Train(client.get(), 2.0f);  // lost with the ps tasks' restart
    RestartPs(old_chief);
    clock_.Advance(absl::Milliseconds(200));
  } else {
    checkpoint = std::thread([&] { Checkpoint(old_chief).IgnoreError(); });
  }
  ASSERT_TRUE(WaitFor([&] { return freeze->reached.HasBeenNotified(); }));
  EXPECT_EQ(old_chief->phase(), in_recovery ? v1::RECOVERING : v1::MODEL_READY);

  Coordinator* successor = StartChief(Options(v1::ASYNC));
  RegisterAllAndAwaitReady(successor);
  ASSERT_TRUE(WaitFor([&] { return PsServing(client.get()); }));
  EXPECT_TRUE(Values(client.get()) == expected);
  EXPECT_FALSE(RecoveryRecorded());
  // Every committed checkpoint verifies, and the successor can take one.
  absl::StatusOr<std::vector<std::string>> committed = ListCheckpoints(dir_);
  ASSERT_TRUE(committed.ok()) << committed.status();
  for (const std::string& path : *committed) EXPECT_TRUE(VerifyCheckpoint(path).ok()) << path;
  absl::StatusOr<v1::CheckpointResponse> next = Checkpoint(successor);
  ASSERT_TRUE(next.ok()) << next.status();

  // The old chief goes on where it stopped: what it does next is refused, and it stops (after
  // a rename, it has committed before its successor started: nothing is refused).
  StopChief(successor);
  if (point == kCrashManifestBeforeDirSync) {
    freeze->release.Notify();
    checkpoint.join();
    StopChief(old_chief);
  } else {
    ReleaseReplaced(freeze, old_chief, [&] {
      if (checkpoint.joinable()) checkpoint.join();
    });
  }
  EXPECT_TRUE(Values(client.get()) == expected);
  EXPECT_FALSE(RecoveryRecorded());
  committed = ListCheckpoints(dir_);
  ASSERT_TRUE(committed.ok()) << committed.status();
  for (const std::string& path : *committed) EXPECT_TRUE(VerifyCheckpoint(path).ok()) << path;
}

// The successor stops at the same point while it redoes the recovery (RESTORING), and a third
// chief finishes it.
TEST_P(ChiefStopsMidwayRecoveringTest, ASuccessorThatStopsTooLeavesItToTheNext) {
  const std::string point = GetParam();
  Freeze* first_freeze = FreezeAt(point, 1);
  Coordinator* first = StartChief(Options(v1::ASYNC, first_freeze->points.get()));
  RegisterAllAndAwaitReady(first);
  std::unique_ptr<ParameterClient> client = ClientOf(first);
  Train(client.get(), 1.0f);
  const ModelValues expected = Values(client.get());
  ASSERT_TRUE(Checkpoint(first).ok());
  Train(client.get(), 2.0f);
  RestartPs(first);
  clock_.Advance(absl::Milliseconds(200));
  ASSERT_TRUE(WaitFor([&] { return first_freeze->reached.HasBeenNotified(); }));

  Freeze* second_freeze = FreezeAt(point, 1);
  Coordinator* second = StartChief(Options(v1::ASYNC, second_freeze->points.get()));
  for (int i = 0; i < kNumPs; ++i) Register(second, "ps", i, ps_incarnation_[i], 5000 + i);
  ASSERT_TRUE(WaitFor([&] { return second_freeze->reached.HasBeenNotified(); }));
  EXPECT_EQ(second->phase(), v1::RESTORING);

  Coordinator* third = StartChief(Options(v1::ASYNC));
  RegisterAllAndAwaitReady(third);
  ASSERT_TRUE(WaitFor([&] { return PsServing(client.get()); }));
  EXPECT_TRUE(Values(client.get()) == expected);
  EXPECT_FALSE(RecoveryRecorded());
  StopChief(third);

  ReleaseReplaced(second_freeze, second);
  ReleaseReplaced(first_freeze, first);
  EXPECT_TRUE(Values(client.get()) == expected);
}

INSTANTIATE_TEST_SUITE_P(EveryPoint, ChiefStopsMidwayTest,
                         ::testing::Values(kCrashRecoveryIntentWritten, kCrashRecoveryCreated,
                                           kCrashRecoveryRestoreMidway, kCrashRecoveryRestored,
                                           kCrashManifestBeforeWrite, kCrashManifestBeforeRename,
                                           kCrashManifestBeforeDirSync),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });
INSTANTIATE_TEST_SUITE_P(EveryRecoveryPoint, ChiefStopsMidwayRecoveringTest,
                         ::testing::Values(kCrashRecoveryIntentWritten, kCrashRecoveryCreated,
                                           kCrashRecoveryRestoreMidway, kCrashRecoveryRestored),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace pscluster
