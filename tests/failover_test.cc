// Issue 37's failover through the real daemons: a chief with --replication=2, three ps tasks
// and clients in this process pushing as workers do. One ps task is killed with SIGKILL while
// they push, at a point that varies from run to run; the chief promotes its partitions'
// backups, the clients follow the new routes, and every push a client got an answer for is in
// the final model exactly once: in its dense variables and in its embedding table's rows.
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cli/live_cluster.h"
#include "cli/status_command.h"
#include "cli/vars_command.h"
#include "client/cluster_client.h"
#include "client/grpc_channel.h"
#include "client/grpc_chief_client.h"
#include "client/parameter_client.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "proto/ps_service.grpc.pb.h"
#include "sharding/sparse_hash.h"
#include "storage/crash_points.h"
#include "testing/child_process.h"
#include "testing/model_snapshot.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

// SGD at rate 1 from zero: a variable's (or a row's) final value is minus the sum of the
// gradients applied to it, exactly (small integers in float). "w" is 64 rows of 64 bytes, cut
// into four partitions of 16 rows (--max_partition_bytes=1024) over the three tasks; the
// table's virtual shards are spread over them too, each backed up on another task.
// (The dense variables alone are kDenseModel.)
constexpr char kDenseModel[] = R"pb(
  variables {
    name: "w"
    shape { dims: 64 dims: 16 }
    initializer { kind: CONSTANT value: 0 }
    optimizer { sgd { learning_rate: 1 } }
  }
  variables {
    name: "b"
    shape { dims: 16 }
    initializer { kind: CONSTANT value: 0 }
    optimizer { sgd { learning_rate: 1 } }
  }
)pb";
constexpr char kTable[] = R"pb(
  tables {
    name: "emb"
    dim: 4
    initializer { kind: CONSTANT value: 0 }
    optimizer { sgd { learning_rate: 1 } }
  }
)pb";

// The rows every push names: spread over every virtual shard, so over every task.
std::vector<int64_t> TableKeys() {
  std::vector<int64_t> keys;
  for (int64_t i = 0; i < 300; ++i) keys.push_back(i * 7919 + 3);
  return keys;
}

constexpr int kNumPs = 3;
constexpr int kClients = 2;
constexpr int kPushesPerClient = 150;

// Three ps tasks with --replication=2 under a chief serving kDenseModel (and kTable
// `with_table`), with heartbeats every 100 ms and a task lost after 1 s without one.
// Checkpoints (under `checkpoint_dir`, when given) only when asked for. `task_flags`: extra
// flags of single tasks ("ps:1").
std::unique_ptr<TestCluster> StartReplicated(
    const std::string& checkpoint_dir = "", bool with_table = true,
    std::vector<std::string> chief0_flags = {},
    std::map<std::string, std::vector<std::string>> task_flags = {}) {
  const std::string model_path = absl::StrCat(getenv("TEST_TMPDIR"), "/model.pbtxt");
  std::ofstream(model_path) << kDenseModel << (with_table ? kTable : "");
  TestClusterOptions options;
  options.num_ps = kNumPs;
  options.num_workers = 0;
  options.flags["chief"] = {"--model_spec=" + model_path, "--max_partition_bytes=1024",
                            "--replication=2", "--heartbeat_interval_ms=100",
                            "--heartbeat_timeout_ms=1000"};
  if (!checkpoint_dir.empty()) {
    options.flags["chief"].push_back("--checkpoint_dir=" + checkpoint_dir);
    options.flags["chief"].push_back("--checkpoint_every_secs=0");
  }
  if (!chief0_flags.empty()) options.flags["chief:0"] = std::move(chief0_flags);
  for (auto& [task, flags] : task_flags) options.flags[task] = std::move(flags);
  absl::StatusOr<std::unique_ptr<TestCluster>> started = TestCluster::Start(options);
  CHECK(started.ok()) << started.status();
  return *std::move(started);
}

// The chief of worker daemons training the softmax model on Fashion-MNIST, async, with
// --replication=2 over the ps tasks, for `epochs` of 12,000 examples in batches of 50, with
// heartbeats every 100 ms and a task lost after 1 s without one.
std::vector<std::string> SoftmaxTrainingChiefFlags(int epochs) {
  return {"--model_config=" + RunfilePath("configs/softmax_regression.pbtxt"),
          "--mode=async",
          "--replication=2",
          "--max_partition_bytes=8192",
          "--max_train_examples=12000",
          "--max_test_examples=2000",
          absl::StrCat("--epochs=", epochs),
          "--batch_size=50",
          "--eval_every_secs=60",
          "--heartbeat_interval_ms=100",
          "--heartbeat_timeout_ms=1000"};
}

// A client as a worker has one: the tensor data plane, few attempts before the caller looks
// up the routes again.
std::unique_ptr<ParameterClient> ClientFor(const v1::GetModelResponse& m, int worker) {
  std::vector<std::string> addresses(m.ps_addresses().begin(), m.ps_addresses().end());
  ParameterClientOptions options;
  options.worker = worker;
  options.max_attempts = 3;
  options.initial_backoff = absl::Milliseconds(20);
  options.max_backoff = absl::Milliseconds(200);
  auto client = ParameterClient::Create(m.model(), m.placement(),
                                        NewPsTransport(addresses, /*tensor_wire=*/true), options);
  CHECK(client.ok()) << client.status();
  return *std::move(client);
}

// What a worker's before_retry does: the failed-over tasks as the chief publishes them.
void FollowFailovers(TestCluster& cluster, ParameterClient& client) {
  const v1::GetModelResponse now = ModelOf(cluster);
  const std::vector<int> failed(now.placement().failed_over_ps().begin(),
                                now.placement().failed_over_ps().end());
  CHECK(client.SetFailedOver(failed).ok());
}

// As a worker's before_retry: the failed-over tasks and the tasks' addresses now, from the
// chief at `chief_address` (waiting for it while it restarts there, 30 s at most; a call the
// chief dies in is asked again).
void FollowChief(const std::string& chief_address, ParameterClient& client) {
  GrpcChannelOptions channel;
  std::unique_ptr<v1::Coordinator::Stub> chief =
      v1::Coordinator::NewStub(NewGrpcChannel(chief_address, channel));
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  v1::GetModelRequest req;
  req.set_wait_until_ready(true);
  v1::GetModelResponse now;
  grpc::Status s;
  do {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    ctx.set_wait_for_ready(true);
    s = chief->GetModel(&ctx, req, &now);
  } while (s.error_code() == grpc::StatusCode::UNAVAILABLE &&
           std::chrono::system_clock::now() < deadline);
  CHECK(s.ok()) << "the chief at " << chief_address << ": " << s.error_message();
  for (int i = 0; i < now.ps_addresses_size(); ++i) {
    CHECK(client.SetPsAddress(i, now.ps_addresses(i)).ok());
  }
  CHECK(client
            .SetFailedOver(std::vector<int>(now.placement().failed_over_ps().begin(),
                                            now.placement().failed_over_ps().end()))
            .ok());
}

// Every element of "w" and "b" and, with `rows`, every row of TableKeys() is `expected` as the
// cluster serves them now (routed as the chief says). `when` names the moment in failures.
void ExpectServed(TestCluster& cluster, const v1::GetModelResponse& m, float expected, bool rows,
                  const std::string& when) {
  std::unique_ptr<ParameterClient> reader = ClientFor(m, -1);
  FollowChief(cluster.chief_address(), *reader);
  std::vector<std::vector<float>> values;
  ASSERT_TRUE(reader->Pull({"w", "b"}, &values).ok()) << cluster.Logs(40);
  for (int v = 0; v < 2; ++v) {
    for (size_t j = 0; j < values[v].size(); ++j) {
      ASSERT_EQ(values[v][j], expected) << when << ": " << (v == 0 ? "w" : "b") << "[" << j << "]\n"
                                        << cluster.Logs(40);
    }
  }
  if (!rows) return;
  const std::vector<int64_t> keys = TableKeys();
  std::vector<float> got(keys.size() * 4);
  ASSERT_TRUE(reader->PullRows("emb", keys.data(), keys.size(), got.data()).ok())
      << cluster.Logs(40);
  for (size_t j = 0; j < got.size(); ++j) {
    ASSERT_EQ(got[j], expected) << when << ": row of key " << keys[j / 4] << "\n"
                                << cluster.Logs(40);
  }
}

// A checkpoint the chief takes now holds every partition (values only: SGD keeps no slots)
// and, with `rows`, every row of TableKeys(), each `expected`.
void ExpectCheckpointHolds(TestCluster& cluster, const v1::GetModelResponse& m, float expected,
                           bool rows) {
  std::unique_ptr<ChiefClient> chief = NewGrpcChiefClient(cluster.chief_address());
  v1::CheckpointResponse saved;
  ASSERT_TRUE(chief->Checkpoint(&saved).ok()) << cluster.Logs(40);
  absl::StatusOr<ModelSnapshot> snapshot = ReadModelSnapshot(saved.path());
  ASSERT_TRUE(snapshot.ok()) << snapshot.status();
  EXPECT_EQ(snapshot->dense.size(), static_cast<size_t>(m.placement().partitions_size()));
  for (const auto& [part, values] : snapshot->dense) {
    for (size_t j = 0; j < values.size(); ++j) {
      ASSERT_EQ(values[j], expected) << part << "[" << j << "]";
    }
  }
  if (!rows) return;
  for (int64_t key : TableKeys()) {
    auto row = snapshot->rows.find({"emb", key});
    ASSERT_NE(row, snapshot->rows.end()) << "key " << key << " is not in " << saved.path();
    for (int j = 0; j < 4; ++j) ASSERT_EQ(row->second[j], expected) << "key " << key;
  }
}

// Whether the chief's log (its last 600 lines) says `text` within 60 s.
bool AwaitChiefLog(TestCluster& cluster, const std::string& text) {
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (cluster.chief().LogTail(600).find(text) == std::string::npos && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  return cluster.chief().LogTail(600).find(text) != std::string::npos;
}

// What a worker tries again (Trainer::RetryStep): a task restarting, or back empty (NOT_FOUND:
// it holds no shard until the chief fails it over or creates them).
bool Retried(const absl::Status& s) {
  return s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kNotFound;
}

// kClients clients pushing as workers do until Stop() (and at least 20 times each): client c
// pushes c + 1 into every element of "w" and "b" and, with `rows`, into every row of
// TableKeys(), each push until it is answered (its tickets keep its request ids across
// attempts), following the chief's routes after an answer a worker retries (FollowChief).
class Pushers {
 public:
  Pushers(TestCluster& cluster, const v1::GetModelResponse& m, bool rows)
      : pushes_(kClients), errors_(kClients) {
    // (The chief's address, not the cluster: a chief the test restarts comes back there.)
    const std::string chief = cluster.chief_address();
    for (int c = 0; c < kClients; ++c) {
      threads_.emplace_back([this, chief, m, rows, c] {
        std::unique_ptr<ParameterClient> client = ClientFor(m, c);
        const std::vector<float> gw(64 * 16, c + 1.0f), gb(16, c + 1.0f);
        const std::vector<int64_t> keys = TableKeys();
        const std::vector<float> grows(keys.size() * 4, c + 1.0f);
        for (int i = 0; !stop_.load() || i < 20; ++i) {
          PushTicket ticket, rows_ticket;
          const absl::Time deadline = absl::Now() + absl::Seconds(60);
          absl::Status s;
          while (!(s = client->Push({"w", "b"}, {gw.data(), gb.data()}, i, &ticket)).ok()) {
            if (!Retried(s) || absl::Now() > deadline) break;
            FollowChief(chief, *client);
          }
          while (s.ok() && rows) {
            s = client->PushRows("emb", keys.data(), keys.size(), grows.data(), i, &rows_ticket);
            if (s.ok() || !Retried(s) || absl::Now() > deadline) break;
            s = absl::OkStatus();  // again, after a look at the routes
            FollowChief(chief, *client);
          }
          if (!s.ok()) {
            errors_[c] = s;
            return;
          }
          pushes_[c].store(i + 1);
          answered_.fetch_add(1);
          absl::SleepFor(absl::Milliseconds(2));
        }
      });
    }
  }
  ~Pushers() { Stop(); }

  // Waits (60 s at most) until `more` further pushes were answered; false if they were not.
  bool AwaitAnswers(int more) {
    const int until = answered_.load() + more;
    const absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (answered_.load() < until && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return answered_.load() >= until;
  }
  // Stops the clients and waits for them; each client's error, if it stopped on one.
  const std::vector<absl::Status>& Stop() {
    stop_.store(true);
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
    return errors_;
  }
  // Once stopped: every element's (and row's) value, minus the sum of the answered pushes.
  float Expected() const {
    float expected = 0;
    for (int c = 0; c < kClients; ++c) expected -= (c + 1.0f) * pushes_[c].load();
    return expected;
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<int> answered_{0};
  std::vector<std::atomic<int>> pushes_;
  std::vector<absl::Status> errors_;
  std::vector<std::thread> threads_;
};

// Two tasks to lose one after the other, with a rebuild between: X backs up a partition of P,
// and P backs up none of X's, so that once X failed over P holds no partition of X's and P's
// loss after X's rebuild leaves every partition a copy. With `tables`, the same holds for the
// tables' virtual shards, and X backs up one of P's. {-1, -1} when the placement has none.
std::pair<int, int> TasksToLoseInTurn(const v1::Placement& placement, bool tables = false) {
  for (int a = 0; a < kNumPs; ++a) {
    for (int b = 0; b < kNumPs; ++b) {
      bool a_backs_b = false, b_backs_a = false, a_backs_b_rows = !tables;
      for (const v1::DensePartition& part : placement.partitions()) {
        a_backs_b |= part.ps_task() == b && part.backup_ps_task() == a;
        b_backs_a |= part.ps_task() == a && part.backup_ps_task() == b;
      }
      for (int v = 0; tables && v < placement.virtual_shard_to_backup_ps_size(); ++v) {
        const int primary = placement.virtual_shard_to_ps(v);
        const int backup = placement.virtual_shard_to_backup_ps(v);
        a_backs_b_rows |= primary == b && backup == a;
        b_backs_a |= primary == a && backup == b;
      }
      if (a != b && a_backs_b && a_backs_b_rows && !b_backs_a) return {a, b};
    }
  }
  return {-1, -1};
}

// Which task dies, and after how many of the clients' pushes were answered; or, with
// `push_applied`, at its crash point of that name: the task kills itself (SIGKILL) right
// after it applied its `after`-th push as a primary, before it forwarded it to the backup,
// with the worker unanswered.
struct KillPoint {
  int ps;
  int after;
  bool push_applied = false;
};

class FailoverTest : public ::testing::TestWithParam<KillPoint> {};

TEST_P(FailoverTest, AKilledPsTaskFailsOverAndEveryAnsweredPushIsInTheModelOnce) {
  const int killed = GetParam().ps;
  const std::string name = absl::StrCat("ps:", killed);
  const std::string checkpoint_dir = absl::StrCat(getenv("TEST_TMPDIR"), "/ckpt-", killed, "-",
                                                  GetParam().after, GetParam().push_applied);
  std::map<std::string, std::vector<std::string>> task_flags;
  if (GetParam().push_applied) {
    task_flags[name] = {absl::StrCat("--crash_at=push_applied@", GetParam().after)};
  }
  std::unique_ptr<TestCluster> started = StartReplicated(checkpoint_dir, true, {}, task_flags);
  TestCluster& cluster = *started;
  const v1::GetModelResponse m = ModelOf(cluster);
  ASSERT_EQ(m.placement().options().replication(), 2);
  int on_killed = 0;
  for (const v1::DensePartition& p : m.placement().partitions()) {
    ASSERT_NE(p.backup_ps_task(), p.ps_task());
    on_killed += p.ps_task() == killed;
  }
  ASSERT_GT(on_killed, 0) << name << " holds no partition: nothing to fail over";
  const std::vector<int64_t> keys = TableKeys();
  {
    std::set<int> tasks;  // the primaries of the rows pushed
    const int32_t shards = m.placement().virtual_shard_to_ps_size();
    for (int64_t key : keys) {
      tasks.insert(m.placement().virtual_shard_to_ps(VirtualShardOfTableKey(key, 0, shards)));
    }
    ASSERT_EQ(tasks.size(), static_cast<size_t>(kNumPs)) << "the rows do not reach every task";
  }

  // Bad input first: a task told that it died itself, or a task index below 0, changes nothing.
  {
    std::unique_ptr<ParameterClient> admin = ClientFor(m, -1);
    for (int failed : {0, -2}) {
      v1::FailOverPsResponse r;
      absl::Status s = admin->FailOverPs(0, failed, &r);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
      EXPECT_THAT(std::string(s.message()),
                  HasSubstr(absl::StrCat("FailOverPs names ps:", failed,
                                         "; expected another ps task's index")));
    }
    // A task that backs up fewer of the failed task's dense shards than the placement puts
    // there refuses, before it promotes anything (the pushes below go on to ps:1's shards,
    // which ps:0 would otherwise stop taking forwards for).
    v1::FailOverPsResponse r;
    absl::Status s = admin->FailOverPs(0, 1, &r, /*min_dense_shards=*/1000);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("the placement puts 1000 here"));
    EXPECT_TRUE(admin->GetStatus(0).ok());
    absl::StatusOr<v1::ListShardsResponse> on_0 = admin->ListShards(0, /*include_backups=*/true);
    ASSERT_TRUE(on_0.ok()) << on_0.status();
    for (const v1::ShardStats& shard : on_0->shards()) {
      EXPECT_FALSE(shard.promoted())
          << shard.name() << "/" << shard.partition() << " of ps:" << shard.primary_ps_task();
    }
  }

  // Client c pushes c + 1 into every element and every row, kPushesPerClient times, each push
  // until it is answered (its ticket keeps its request ids across attempts).
  std::atomic<int> answered{0};
  absl::Mutex times_mu;
  std::vector<absl::Time> answered_at;  // every answer, for the pause the failover made
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(kClients);
  for (int c = 0; c < kClients; ++c) {
    threads.emplace_back([&, c] {
      std::unique_ptr<ParameterClient> client = ClientFor(m, c);
      const std::vector<float> gw(64 * 16, c + 1.0f), gb(16, c + 1.0f);
      const std::vector<float> grows(keys.size() * 4, c + 1.0f);
      for (int i = 0; i < kPushesPerClient; ++i) {
        PushTicket ticket, rows_ticket;
        const absl::Time deadline = absl::Now() + absl::Seconds(60);
        absl::Status s;
        while (!(s = client->Push({"w", "b"}, {gw.data(), gb.data()}, i, &ticket)).ok()) {
          if (s.code() != absl::StatusCode::kUnavailable || absl::Now() > deadline) break;
          FollowFailovers(cluster, *client);
        }
        while (s.ok()) {
          s = client->PushRows("emb", keys.data(), keys.size(), grows.data(), i, &rows_ticket);
          if (s.ok() || s.code() != absl::StatusCode::kUnavailable || absl::Now() > deadline) break;
          s = absl::OkStatus();  // again, after a look at the routes
          FollowFailovers(cluster, *client);
        }
        if (!s.ok()) {
          errors[c] = s;
          return;
        }
        {
          absl::MutexLock lock(&times_mu);
          answered_at.push_back(absl::Now());
        }
        answered.fetch_add(1);
        absl::SleepFor(absl::Milliseconds(2));
      }
    });
  }
  if (GetParam().push_applied) {
    absl::StatusOr<int> died = cluster.ps(killed).WaitForExit(absl::Seconds(60));
    ASSERT_TRUE(died.ok()) << died.status() << "\n" << cluster.Logs(40);
    ASSERT_TRUE(WIFSIGNALED(*died) && WTERMSIG(*died) == SIGKILL) << DescribeWaitStatus(*died);
  } else {
    while (answered.load() < GetParam().after) absl::SleepFor(absl::Microseconds(200));
    ASSERT_TRUE(cluster.ps(killed).Signal(SIGKILL).ok());
  }
  const absl::Time killed_at = absl::Now();
  for (std::thread& t : threads) t.join();
  for (const absl::Status& e : errors) ASSERT_TRUE(e.ok()) << e << "\n" << cluster.Logs(40);

  const v1::GetModelResponse after = ModelOf(cluster);
  ASSERT_THAT(std::vector<int>(after.placement().failed_over_ps().begin(),
                               after.placement().failed_over_ps().end()),
              ::testing::ElementsAre(killed));
  // Every push answered, each applied once: -(1 + 2) * kPushesPerClient everywhere.
  const float expected = -3.0f * kPushesPerClient;
  auto expect_exact = [&](const std::string& when) {
    ExpectServed(cluster, m, expected, /*rows=*/true, when);
  };
  expect_exact("after the failover");

  // A checkpoint after the failover is whole: the tasks that took the dead task's partitions
  // and virtual shards over save them, and it holds every push once.
  ASSERT_NO_FATAL_FAILURE(ExpectCheckpointHolds(cluster, m, expected, /*rows=*/true));

  // psctl vars: each of the dead task's partitions on the task that took it over, with its
  // updates there; each partition it backed up, its backup lost.
  {
    std::unique_ptr<ChiefClient> chief = NewGrpcChiefClient(cluster.chief_address());
    absl::StatusOr<LiveCluster> live = ConnectToCluster(*chief, LiveClusterOptions());
    ASSERT_TRUE(live.ok()) << live.status();
    absl::Status unreachable;  // the dead task's own listing
    const psctl::VarsReport report = BuildVarsReport(*live, &unreachable);
    int took_over = 0, lost = 0;
    for (const psctl::VariableInfo& v : report.variables()) {
      for (const psctl::PartitionInfo& p : v.partitions()) {
        const std::string part = absl::StrCat(v.name(), "/", p.partition());
        if (p.failed_over()) {
          ++took_over;
          EXPECT_EQ(p.failed_primary(), killed) << part;
          EXPECT_NE(p.ps_task(), killed) << part;
          EXPECT_TRUE(p.held()) << part;
          EXPECT_GE(p.updates(), kClients * kPushesPerClient) << part;
        } else {
          EXPECT_NE(p.ps_task(), killed) << part;
          if (p.backup_ps_task() == killed) {
            ++lost;
            EXPECT_TRUE(p.backup_lost()) << part;
          }
        }
      }
    }
    EXPECT_EQ(took_over, on_killed);
    EXPECT_GT(lost, 0);
    const std::string text = FormatVarsReport(report);
    EXPECT_THAT(text, HasSubstr(absl::StrCat("(took over from ", name, ")"))) << text;
    EXPECT_THAT(text, HasSubstr(absl::StrCat(name, " (lost)"))) << text;
  }
  const std::string chief_log = cluster.chief().LogTail(400);
  EXPECT_THAT(chief_log, HasSubstr(name + " failed over"));
  EXPECT_THAT(chief_log, HasSubstr("no checkpoint restored, nothing rolled back"));
  EXPECT_THAT(chief_log, ::testing::Not(HasSubstr("restoring every ps task")));
  // The longest time without an answered push after the kill: detection (the chief's heartbeat
  // timeout, 1 s here) plus the failover plus the clients finding the new routes.
  std::sort(answered_at.begin(), answered_at.end());
  absl::Duration pause;
  for (size_t i = 1; i < answered_at.size(); ++i) {
    if (answered_at[i] > killed_at) pause = std::max(pause, answered_at[i] - answered_at[i - 1]);
  }
  LOG(INFO) << "longest time without an answered push after the SIGKILL: " << pause
            << " (heartbeat timeout 1 s)";
  EXPECT_LT(pause, absl::Seconds(30));

  // The killed task comes back empty: it takes nothing back, and nothing is rolled back.
  cluster.SetFlags(name, {});
  ASSERT_TRUE(cluster.StartTask("ps", killed).ok()) << cluster.Logs();
  const std::string came_back = name + " came back after its failover";
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (cluster.chief().LogTail(400).find(came_back) == std::string::npos && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_THAT(cluster.chief().LogTail(400), HasSubstr(came_back)) << cluster.Logs(40);
  expect_exact("after " + name + " came back");
  EXPECT_THAT(cluster.chief().LogTail(400), ::testing::Not(HasSubstr("restoring every ps task")));
}

// Every task, each at an early, a middle and a late point of the 300 pushes; and ps:1 between
// its apply of a push and its forward.
INSTANTIATE_TEST_SUITE_P(EveryTaskAtSeveralPoints, FailoverTest,
                         ::testing::Values(KillPoint{0, 20}, KillPoint{1, 100}, KillPoint{2, 170},
                                           KillPoint{0, 250}, KillPoint{1, 5}, KillPoint{2, 290},
                                           KillPoint{1, 120, /*push_applied=*/true}),
                         [](const ::testing::TestParamInfo<KillPoint>& info) {
                           return absl::StrCat(
                               "ps", info.param.ps,
                               info.param.push_applied ? "_at_push_applied_" : "_after",
                               info.param.after);
                         });

// Fencing: a primary cut off from everyone (frozen with SIGSTOP: it sends no heartbeat and
// answers nothing) is failed over; when it runs again, a client that still routes to it gets
// no dense pull or push served there, and the shards it held do not change, while the tasks that
// took them over serve on. First its lease from the chief has run out; then the chief's answer
// to its next heartbeat says it was failed over, and it stays fenced.
TEST(FencingTest, APrimaryCutOffAndFailedOverAppliesNothingWhenItRunsAgain) {
  std::unique_ptr<TestCluster> started = StartReplicated();
  TestCluster& cluster = *started;
  const v1::GetModelResponse m = ModelOf(cluster);
  std::unique_ptr<ParameterClient> stale = ClientFor(m, 0);  // never follows a failover
  const std::vector<float> gw(64 * 16, 1.0f), gb(16, 1.0f);
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(stale->Push({"w", "b"}, {gw.data(), gb.data()}, i).ok()) << cluster.Logs(40);
  }
  // The updates each of ps:1's shards has had, as ps:1 reports them.
  auto ps1_updates = [&] {
    std::map<std::string, int64_t> updates;
    for (const v1::DensePartition& p : m.placement().partitions()) {
      if (p.ps_task() != 1) continue;
      v1::InspectShardRequest ask;
      ask.mutable_shard()->set_variable(p.variable());
      ask.mutable_shard()->set_partition(p.partition());
      absl::StatusOr<v1::InspectShardResponse> r = stale->InspectShard(1, ask);
      CHECK(r.ok()) << r.status();
      updates[absl::StrCat(p.variable(), "/", p.partition())] = r->shard().applied_step();
    }
    return updates;
  };
  const std::map<std::string, int64_t> before = ps1_updates();
  ASSERT_FALSE(before.empty()) << "ps:1 holds no partition";

  ASSERT_TRUE(cluster.ps(1).Signal(SIGSTOP).ok());
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (ModelOf(cluster).placement().failed_over_ps_size() == 0 && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_EQ(ModelOf(cluster).placement().failed_over_ps_size(), 1) << cluster.Logs(40);
  ASSERT_TRUE(cluster.ps(1).Signal(SIGCONT).ok());

  // At once, then after its next heartbeats: nothing served, nothing applied.
  for (int round = 0; round < 2; ++round) {
    absl::Status pushed = stale->Push({"w", "b"}, {gw.data(), gb.data()}, 100 + round);
    EXPECT_EQ(pushed.code(), absl::StatusCode::kUnavailable) << pushed;
    std::vector<std::vector<float>> values;
    absl::Status pulled = stale->Pull({"w", "b"}, &values);
    EXPECT_EQ(pulled.code(), absl::StatusCode::kUnavailable) << pulled;
    EXPECT_EQ(ps1_updates(), before) << "round " << round;
    absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_THAT(cluster.ps(1).LogTail(100), HasSubstr("the chief failed this ps task over"));

  // The tasks that took its shards over serve them, with the 10 pushes answered before and
  // none of the two refused there (the other tasks' parts of those pushes were applied: a push
  // is applied per task, as each answers it).
  std::unique_ptr<ParameterClient> fresh = ClientFor(m, 1);
  FollowFailovers(cluster, *fresh);
  ASSERT_TRUE(fresh->Push({"w", "b"}, {gw.data(), gb.data()}, 200).ok()) << cluster.Logs(40);
  std::vector<std::vector<float>> values;
  ASSERT_TRUE(fresh->Pull({"w", "b"}, &values).ok());
  for (const v1::DensePartition& p : m.placement().partitions()) {
    const int v = p.variable() == "w" ? 0 : 1;
    const int64_t row = v == 0 ? 16 : 1;
    const float expected = p.ps_task() == 1 ? -11.0f : -13.0f;
    for (int64_t j = p.row_begin() * row; j < p.row_end() * row; ++j) {
      ASSERT_EQ(values[v][j], expected) << p.variable() << "/" << p.partition() << " [" << j << "]";
    }
  }
}

// A primary frozen (SIGSTOP) near the end of training: the calls hung on it end once the chief
// fails it over, training ends, it hears the chief's `stop` once it runs again, and the whole
// cluster exits 0. The chief waits for a task missing for a moment (cut off, or
// its TCP still backing off after a cut) rather than leave it waiting for a chief that is gone,
// for ever; and it counts a task as told only once the task says it heard it (an answer may
// never arrive). netns_test's replicated run met the hang in CI: ps-1, cut off and failed over,
// was still running 240 s after the chief had exited.
TEST(FencingTest, APrimaryFrozenWhenTrainingEndsHearsTheStopOnceItRunsAgain) {
  TestClusterOptions options;
  options.num_ps = kNumPs;
  options.num_workers = 2;
  options.flags["chief"] = SoftmaxTrainingChiefFlags(/*epochs=*/2);
  options.flags["chief"].push_back("--exit_after_training");
  options.flags["worker"] = {"--step_delay_ms=10"};
  absl::StatusOr<std::unique_ptr<TestCluster>> started = TestCluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  TestCluster& cluster = **started;
  std::unique_ptr<v1::Coordinator::Stub> chief = ChiefStubOf(cluster);
  // 2 epochs of 12,000 examples in batches of 50 over 2 workers: 480 steps in all. Frozen near
  // the end: training goes on once ps:1 failed over, and ends a moment later.
  ASSERT_TRUE(AwaitGlobalStep(*chief, 400)) << cluster.Logs(40);
  ASSERT_TRUE(cluster.ps(1).Signal(SIGSTOP).ok());
  const absl::Time frozen = absl::Now();
  ASSERT_TRUE(AwaitChiefLog(cluster, "telling every task to stop")) << cluster.Logs(40);
  // The calls that hung on ps:1 (the workers' to it, and its primaries' forwards to it) end
  // once the chief fails it over (about 1 s in): before, they held training for their 30 s
  // I/O timeout.
  EXPECT_LT(absl::Now() - frozen, absl::Seconds(15)) << cluster.Logs(40);
  absl::SleepFor(absl::Milliseconds(500));  // (before, the chief exited here)
  ASSERT_TRUE(cluster.ps(1).Signal(SIGCONT).ok());

  absl::StatusOr<int> chief_exit = cluster.chief().WaitForExit(absl::Seconds(60));
  ASSERT_TRUE(chief_exit.ok()) << chief_exit.status() << cluster.Logs(40);
  EXPECT_EQ(DescribeWaitStatus(*chief_exit), "exit 0") << cluster.chief().LogTail(30);
  for (ChildProcess* p : cluster.processes()) {
    absl::StatusOr<int> exit = p->WaitForExit(absl::Seconds(20));
    ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << p->options().binary << "\n" << p->LogTail();
    EXPECT_EQ(DescribeWaitStatus(*exit), "exit 0") << p->options().binary << "\n" << p->LogTail();
  }
  EXPECT_THAT(cluster.ps(1).LogTail(100), HasSubstr("the chief says training is over"));
  EXPECT_THAT(cluster.chief().LogTail(600), HasSubstr("ps:1 failed over"));
}

// A second loss after a failover that leaves a partition with no copy: the chief neither fails
// over nor restores a checkpoint into the tasks as first placed (which would leave the shards
// taken over behind, or roll part of the model back); it says what happened and what to do.
TEST(FailoverTest, ASecondLossThatLeavesNoCopyIsReportedNotRolledBack) {
  std::unique_ptr<TestCluster> started = StartReplicated();
  TestCluster& cluster = *started;
  const v1::GetModelResponse m = ModelOf(cluster);
  // A task whose own partition is backed up on ps:1: once ps:1 is gone, it is the last copy.
  int second = -1;
  for (const v1::DensePartition& p : m.placement().partitions()) {
    if (p.backup_ps_task() == 1) second = p.ps_task();
  }
  ASSERT_GE(second, 0) << "ps:1 backs up nothing";
  auto await_log = [&](const std::string& text) { return AwaitChiefLog(cluster, text); };
  ASSERT_TRUE(cluster.ps(1).Signal(SIGKILL).ok());
  ASSERT_TRUE(await_log("ps:1 failed over")) << cluster.Logs(40);
  ASSERT_TRUE(cluster.ps(second).Signal(SIGKILL).ok());
  ASSERT_TRUE(await_log(absl::StrCat("ps:", second, " is lost and so is ps:1")))
      << cluster.Logs(40);
  // Back, empty: the chief sees it come back (it says so) and still restores nothing and
  // creates nothing again from initial values.
  ASSERT_TRUE(cluster.StartTask("ps", second).ok()) << cluster.Logs();
  ASSERT_TRUE(await_log(absl::StrCat("ps:", second, " came back, empty: nothing is restored")))
      << cluster.Logs(40);
  const std::string log = cluster.chief().LogTail(400);
  EXPECT_THAT(log, HasSubstr("restart the job from its newest checkpoint"));
  EXPECT_THAT(log, ::testing::Not(HasSubstr(absl::StrCat("ps:", second, " failed over"))));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("lost its shards: holding the workers")));
  EXPECT_EQ(ModelOf(cluster).placement().failed_over_ps_size(), 1);
}

// Rebuild: ps:X is killed and fails over; it comes back (at another address) and the chief
// rebuilds onto it the backups it held of the tasks still serving, dense partitions and table
// rows, copied while the clients push on; then ps:P, one of those tasks, is killed: its
// partitions and virtual shards fail over to the rebuilt backups on X, nothing is restored,
// and every answered push is in the model exactly once, dense and rows, in the values served
// and in a checkpoint taken after. (Three virtual shards, one per task, each backed up on the
// next: so that P takes over none of X's, whose only copy it would then hold.)
TEST(RebuildTest, BackupsRebuiltOntoATaskThatCameBackTakeTheNextFailover) {
  const std::string checkpoint_dir = absl::StrCat(getenv("TEST_TMPDIR"), "/ckpt-rebuild");
  std::unique_ptr<TestCluster> started =
      StartReplicated(checkpoint_dir, /*with_table=*/true, {"--num_virtual_shards=3"});
  TestCluster& cluster = *started;
  const v1::GetModelResponse m = ModelOf(cluster);
  const auto [x, p] = TasksToLoseInTurn(m.placement(), /*tables=*/true);
  ASSERT_GE(x, 0) << "no pair of tasks to kill one after the other\n"
                  << m.placement().DebugString();

  int backed_on_x = 0, rebuilt_on_x = 0;  // P's partitions backed up on X; every task's
  std::set<int> primaries_on_x;           // the tasks whose partitions X backs up
  int64_t bytes_on_x = 0;                 // and their values' bytes
  for (const v1::DensePartition& part : m.placement().partitions()) {
    backed_on_x += part.ps_task() == p && part.backup_ps_task() == x;
    rebuilt_on_x += part.backup_ps_task() == x;
    if (part.backup_ps_task() == x) {
      primaries_on_x.insert(part.ps_task());
      bytes_on_x += part.bytes();
    }
  }
  int rows_on_x = 0;  // the rows of TableKeys() whose virtual shard X backs up
  for (int64_t key : TableKeys()) {
    const int32_t v = VirtualShardOfTableKey(key, 0, m.placement().virtual_shard_to_ps_size());
    if (m.placement().virtual_shard_to_backup_ps(v) != x) continue;
    ++rows_on_x;
    primaries_on_x.insert(m.placement().virtual_shard_to_ps(v));
  }
  ASSERT_GT(rows_on_x, 0);
  auto await_log = [&](const std::string& text) { return AwaitChiefLog(cluster, text); };
  Pushers pushers(cluster, m, /*rows=*/true);
  ASSERT_TRUE(pushers.AwaitAnswers(20));
  ASSERT_TRUE(cluster.ps(x).Signal(SIGKILL).ok());
  ASSERT_TRUE(await_log(absl::StrCat("ps:", x, " failed over"))) << cluster.Logs(40);
  ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
  ASSERT_TRUE(cluster.StartTask("ps", x, /*same_address=*/false).ok()) << cluster.Logs();
  ASSERT_TRUE(await_log(absl::StrCat("backups rebuilt on ps:", x, ": ", rebuilt_on_x,
                                     " dense shards and ", rows_on_x, " table rows")))
      << cluster.Logs(40);
  // psctl vars shows each rebuilt backup held on X, no longer lost.
  {
    std::unique_ptr<ChiefClient> chief = NewGrpcChiefClient(cluster.chief_address());
    absl::StatusOr<LiveCluster> live = ConnectToCluster(*chief, LiveClusterOptions());
    ASSERT_TRUE(live.ok()) << live.status();
    absl::Status unreachable;
    const psctl::VarsReport report = BuildVarsReport(*live, &unreachable);
    int held = 0;
    for (const psctl::VariableInfo& v : report.variables()) {
      for (const psctl::PartitionInfo& part : v.partitions()) {
        if (part.failed_over() || part.backup_ps_task() != x) continue;
        EXPECT_FALSE(part.backup_lost()) << v.name() << "/" << part.partition();
        held += part.backup_held();
      }
    }
    EXPECT_EQ(held, rebuilt_on_x) << FormatVarsReport(report);
    // And P's table part backed up on X again: held there, its groups applied.
    bool table_held = false;
    for (const psctl::TableInfo& t : report.tables()) {
      for (const psctl::TablePart& part : t.parts()) {
        if (part.ps_task() != p) continue;
        for (const psctl::TableBackup& b : part.backups()) {
          if (b.ps_task() != x) continue;
          table_held = b.held();
          EXPECT_GT(b.groups_applied(), 0) << FormatVarsReport(report);
        }
      }
    }
    EXPECT_TRUE(table_held) << FormatVarsReport(report);
  }
  // psctl status (and Prometheus, from the same ClusterStatus) shows the rebuild done: every
  // primary that X backs up, its shards and their bytes.
  std::unique_ptr<v1::Coordinator::Stub> chief_stub = ChiefStubOf(cluster);
  {
    const v1::ClusterStatus status = ClusterStatusOf(*chief_stub);
    ASSERT_EQ(status.rebuilds_size(), 1) << status.DebugString();
    const v1::BackupRebuild& r = status.rebuilds(0);
    EXPECT_EQ(r.ps_task(), x);
    EXPECT_EQ(r.state(), v1::BACKUP_REBUILD_DONE) << r.DebugString();
    EXPECT_EQ(r.primaries_done(), r.primaries()) << r.DebugString();
    EXPECT_EQ(r.primaries(), static_cast<int>(primaries_on_x.size())) << r.DebugString();
    EXPECT_EQ(r.shards_copied(), rebuilt_on_x) << r.DebugString();
    EXPECT_EQ(r.rows_copied(), rows_on_x) << r.DebugString();
    EXPECT_GE(r.bytes_copied(), bytes_on_x) << r.DebugString();  // values, and any slots
    EXPECT_GE(r.done_unix_micros(), r.since_unix_micros()) << r.DebugString();
    EXPECT_THAT(
        FormatClusterStatus(status),
        HasSubstr(absl::StrCat("backups rebuilt onto ps:", x, ": done, ", primaries_on_x.size(),
                               " of ", primaries_on_x.size(), " primaries, ", rebuilt_on_x,
                               " dense shards, ", rows_on_x, " table rows, ")));
  }
  // Bad copies sent to X as P's (no TLS here: any caller may): a size other than its backup's,
  // and more bytes than announced, are refused and change nothing (X's copy is what serves
  // P's partition once P fails over, checked below).
  {
    const v1::GetModelResponse now = ModelOf(cluster);
    std::unique_ptr<ParameterClient> reader = ClientFor(m, -1);
    FollowChief(cluster.chief_address(), *reader);
    absl::StatusOr<v1::ListShardsResponse> on_x = reader->ListShards(x, /*include_backups=*/true);
    ASSERT_TRUE(on_x.ok()) << on_x.status();
    const v1::ShardStats* target = nullptr;
    for (const v1::ShardStats& shard : on_x->shards()) {
      if (shard.backup() && shard.primary_ps_task() == p && !shard.is_table()) target = &shard;
    }
    ASSERT_NE(target, nullptr) << "ps:" << x << " lists no backup of ps:" << p;
    GrpcChannelOptions channel;
    std::unique_ptr<v1::ParameterServer::Stub> stub =
        v1::ParameterServer::NewStub(NewGrpcChannel(now.ps_addresses(x), channel));
    for (const int64_t announced : {target->bytes() + 4, target->bytes()}) {
      grpc::ClientContext ctx;
      v1::InstallReplicaResponse response;
      std::unique_ptr<grpc::ClientWriter<v1::InstallReplicaRequest>> writer =
          stub->InstallReplica(&ctx, &response);
      v1::InstallReplicaRequest first;
      first.set_primary_ps_task(p);
      first.set_total_bytes(announced);
      first.mutable_replica()->mutable_shard()->set_variable(target->name());
      first.mutable_replica()->mutable_shard()->set_partition(target->partition());
      first.mutable_replica()->set_updates(1 << 30);
      writer->Write(first);
      v1::InstallReplicaRequest data;
      data.set_data(std::string(static_cast<size_t>(announced + 4), '\x7f'));
      writer->Write(data);
      writer->WritesDone();
      const grpc::Status status = writer->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << announced;
      EXPECT_THAT(status.error_message(),
                  HasSubstr(announced == target->bytes()
                                ? "carries more than its"
                                : absl::StrCat("its backup here holds ", target->bytes())))
          << status.error_message();
    }
  }
  ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
  ASSERT_TRUE(cluster.ps(p).Signal(SIGKILL).ok());
  ASSERT_TRUE(await_log(absl::StrCat("ps:", p, " failed over"))) << cluster.Logs(40);
  ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
  for (const absl::Status& e : pushers.Stop()) {
    ASSERT_TRUE(e.ok()) << e << "\n" << cluster.Logs(40);
  }

  const v1::GetModelResponse after = ModelOf(cluster);
  ASSERT_THAT(std::vector<int>(after.placement().failed_over_ps().begin(),
                               after.placement().failed_over_ps().end()),
              ::testing::UnorderedElementsAre(x, p));
  const float expected = pushers.Expected();
  {
    std::unique_ptr<ParameterClient> reader = ClientFor(m, -1);
    FollowChief(cluster.chief_address(), *reader);
    std::vector<std::vector<float>> values;
    ASSERT_TRUE(reader->Pull({"w", "b"}, &values).ok()) << cluster.Logs(40);
    for (int v = 0; v < 2; ++v) {
      for (size_t j = 0; j < values[v].size(); ++j) {
        ASSERT_EQ(values[v][j], expected) << (v == 0 ? "w" : "b") << "[" << j << "]\n"
                                          << cluster.Logs(40);
      }
    }
    // X serves P's partitions it backed up, as their primary, and P's table rows it backed up.
    absl::StatusOr<v1::ListShardsResponse> on_x = reader->ListShards(x, /*include_backups=*/true);
    ASSERT_TRUE(on_x.ok()) << on_x.status();
    int promoted = 0, promoted_tables = 0;
    for (const v1::ShardStats& shard : on_x->shards()) {
      const bool of_p = shard.backup() && shard.promoted() && shard.primary_ps_task() == p;
      promoted += of_p && !shard.is_table();
      promoted_tables += of_p && shard.is_table();
    }
    EXPECT_EQ(promoted, backed_on_x);
    EXPECT_EQ(promoted_tables, 1);
  }
  // Every row too, P's served by X from its rebuilt copy and the pushes forwarded after it.
  ASSERT_NO_FATAL_FAILURE(
      ExpectServed(cluster, m, expected, /*rows=*/true, "after P's failover onto X"));
  // A checkpoint now holds every partition and row once, X's saves included.
  ASSERT_NO_FATAL_FAILURE(ExpectCheckpointHolds(cluster, m, expected, /*rows=*/true));
  // Bad input to RebuildBackup: a task named as its own backup, a shard it does not hold.
  {
    std::unique_ptr<PsTransport> admin = NewPsTransport(
        std::vector<std::string>(after.ps_addresses().begin(), after.ps_addresses().end()),
        /*tensor_wire=*/false);
    const int live = 3 - x - p;
    v1::RebuildBackupRequest bad;
    bad.set_backup_ps_task(live);
    bad.add_shards()->set_variable("w");
    v1::RebuildBackupResponse r;
    absl::Status s = admin->RebuildBackup(live, bad, &r);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("RebuildBackup names ps:", live,
                                       "; expected another ps task's index")));
    bad.set_backup_ps_task(x);
    bad.mutable_shards(0)->set_variable("no_such_variable");
    s = admin->RebuildBackup(live, bad, &r);
    EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
    EXPECT_TRUE(admin->GetStatus(live).ok());
  }
  const std::string chief_log = cluster.chief().LogTail(5000);
  EXPECT_THAT(chief_log, HasSubstr("no checkpoint restored, nothing rolled back"));
  EXPECT_THAT(chief_log, ::testing::Not(HasSubstr("restoring every ps task")));
  EXPECT_THAT(chief_log, ::testing::Not(HasSubstr("restart the job")));

  // X lost again: it held P's partitions, which now have no copy; the chief says so (and does
  // not fail X over or claim anything was saved), and tells the primaries it had rebuilt from
  // to stop forwarding to it.
  ASSERT_TRUE(cluster.ps(x).Signal(SIGKILL).ok());
  ASSERT_TRUE(await_log(absl::StrCat("ps:", x, ", which held rebuilt backups, is lost again")))
      << cluster.Logs(40);
  ASSERT_TRUE(await_log(absl::StrCat("ps:", x, " is lost, and with it the only copy of the ",
                                     "partitions it took over from ps:", p)))
      << cluster.Logs(40);
  // Its rebuild is no longer done: dropping, then (async) waiting to copy again once it serves.
  const v1::ClusterStatus lost = ClusterStatusOf(*chief_stub);
  ASSERT_EQ(lost.rebuilds_size(), 1) << lost.DebugString();
  EXPECT_NE(lost.rebuilds(0).state(), v1::BACKUP_REBUILD_DONE) << lost.DebugString();
  EXPECT_EQ(lost.rebuilds(0).primaries_done(), 0) << lost.DebugString();
}

// A chief restarted after a failover (docs/replication.md, "A chief restarted after a
// failover"). While clients push, ps:X is killed and fails over; then the chief is killed with
// SIGKILL and started again, with X still down (kDown), or back already and given its backups
// again by the first chief (kBack), or back and then holding partitions of ps:P, killed after
// X's rebuild and failed over onto X (kChained: X is failed over and serving). The new chief
// learns the failovers from the tasks that took the partitions over: it waits for no task that
// is down, creates nothing on the failed-over tasks and restores no checkpoint (a restore would
// roll the model back to the one taken before the first push); every answered push is in the
// model exactly once, dense and rows, served and in a checkpoint it takes; and X, serving again,
// gets its backups rebuilt by the new chief. Or X dies with the chief (both SIGKILLed before the
// chief saw X's loss: a node that ran both lost) and comes back empty as the new chief starts
// (kDiedWithTheChief), or stays down (kDownWithTheChief): the new chief fails X over itself,
// finding its backups trained and X empty, or X still down a heartbeat timeout after it began
// to wait, instead of creating X's shards again and restoring the checkpoint.
// And the first chief dies in the middle of X's failover (kHalfDone: after the first task it
// told, SIGKILL at --crash_at=failover_midway): the new chief completes it, telling the others.
enum class Before { kDown, kBack, kChained, kDiedWithTheChief, kDownWithTheChief, kHalfDone };

class ChiefRestartTest : public ::testing::TestWithParam<Before> {};

TEST_P(ChiefRestartTest, ANewChiefKeepsAnEarlierFailoverAndRollsNothingBack) {
  const Before before = GetParam();
  const std::string checkpoint_dir =
      absl::StrCat(getenv("TEST_TMPDIR"), "/ckpt-chief-restart-", static_cast<int>(before));
  const bool rows = true;
  std::vector<std::string> chief0_flags;
  if (before == Before::kHalfDone) {
    chief0_flags = {absl::StrCat("--crash_at=", kCrashFailoverMidway)};
  }
  // The chained case needs X's rebuild, rows included, to take P's failover: three virtual
  // shards, so that P takes over none of X's (RebuildTest), under both chiefs.
  if (before == Before::kChained) chief0_flags = {"--num_virtual_shards=3"};
  std::unique_ptr<TestCluster> started =
      StartReplicated(checkpoint_dir, /*with_table=*/rows, chief0_flags);
  TestCluster& cluster = *started;
  const v1::GetModelResponse m = ModelOf(cluster);
  const auto [x, p] = TasksToLoseInTurn(m.placement(), /*tables=*/before == Before::kChained);
  ASSERT_GE(x, 0) << "no pair of tasks to kill one after the other";
  auto await_log = [&](const std::string& text) { return AwaitChiefLog(cluster, text); };
  const std::string rebuilt = absl::StrCat("backups rebuilt on ps:", x, ": ");
  Pushers pushers(cluster, m, rows);
  ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
  const bool with_the_chief =
      before == Before::kDiedWithTheChief || before == Before::kDownWithTheChief;
  std::vector<int> failed = {x};
  if (with_the_chief) {
    ASSERT_TRUE(cluster.chief().Signal(SIGKILL).ok());
    ASSERT_TRUE(cluster.chief().WaitForExit(absl::Seconds(5)).ok());
    ASSERT_TRUE(cluster.ps(x).Signal(SIGKILL).ok());
    ASSERT_TRUE(cluster.ps(x).WaitForExit(absl::Seconds(5)).ok());
    if (before == Before::kDiedWithTheChief) {
      // X back (and registered: a ps task serves once the chief knows it) well within the new
      // chief's heartbeat timeout: it is failed over for serving empty, not for being down.
      cluster.SetFlags("chief:0", {"--heartbeat_timeout_ms=30000"});
    }
    ASSERT_TRUE(cluster.StartTask("chief", 0).ok()) << cluster.Logs();
    if (before == Before::kDiedWithTheChief) {
      ASSERT_TRUE(cluster.StartTask("ps", x).ok()) << cluster.Logs();
    }
    ASSERT_TRUE(await_log(absl::StrCat("ps:", x, " lost its shards while no chief ran")))
        << cluster.Logs(40);
  }
  if (before == Before::kHalfDone) {
    ASSERT_TRUE(cluster.ps(x).Signal(SIGKILL).ok());
    absl::StatusOr<int> crashed = cluster.chief().WaitForExit(absl::Seconds(30));
    ASSERT_TRUE(crashed.ok()) << "no crash mid-failover: " << cluster.Logs(40);
    ASSERT_THAT(cluster.chief().LogTail(5), HasSubstr(kCrashFailoverMidway));
    cluster.SetFlags("chief:0", {});
  } else if (!with_the_chief) {
    ASSERT_TRUE(cluster.ps(x).Signal(SIGKILL).ok());
    ASSERT_TRUE(await_log(absl::StrCat("ps:", x, " failed over"))) << cluster.Logs(40);
    ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
  }
  if (before == Before::kBack || before == Before::kChained) {
    ASSERT_TRUE(cluster.StartTask("ps", x).ok()) << cluster.Logs();
    ASSERT_TRUE(await_log(rebuilt)) << cluster.Logs(40);
  }
  if (before == Before::kChained) {
    ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
    ASSERT_TRUE(cluster.ps(p).Signal(SIGKILL).ok());
    ASSERT_TRUE(await_log(absl::StrCat("ps:", p, " failed over"))) << cluster.Logs(40);
    ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
    failed = {std::min(x, p), std::max(x, p)};
  }

  if (!with_the_chief) {
    if (before != Before::kHalfDone) ASSERT_TRUE(cluster.chief().Signal(SIGKILL).ok());
    ASSERT_TRUE(cluster.StartTask("chief", 0).ok()) << cluster.Logs();
    ASSERT_TRUE(await_log(
        absl::StrCat("ps:", absl::StrJoin(failed, ", ps:"), " failed over under an earlier chief")))
        << cluster.Logs(40);
  }
  ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
  if (before == Before::kDown || before == Before::kDownWithTheChief ||
      before == Before::kHalfDone) {
    // Back under the new chief: its backups are rebuilt, as under the chief that failed it over.
    ASSERT_TRUE(cluster.StartTask("ps", x).ok()) << cluster.Logs();
  }
  ASSERT_TRUE(await_log(rebuilt)) << cluster.Logs(40);
  ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
  for (const absl::Status& e : pushers.Stop()) {
    ASSERT_TRUE(e.ok()) << e << "\n" << cluster.Logs(40);
  }

  const v1::GetModelResponse after = ModelOf(cluster);
  EXPECT_THAT(std::vector<int>(after.placement().failed_over_ps().begin(),
                               after.placement().failed_over_ps().end()),
              ::testing::ElementsAreArray(failed));
  const float expected = pushers.Expected();
  ASSERT_NO_FATAL_FAILURE(ExpectServed(cluster, m, expected, rows, "after the restart"));
  ASSERT_NO_FATAL_FAILURE(ExpectCheckpointHolds(cluster, m, expected, rows));
  const std::string chief_log = cluster.chief().LogTail(5000);
  EXPECT_THAT(chief_log, ::testing::Not(HasSubstr("restored checkpoint")));
  EXPECT_THAT(chief_log, ::testing::Not(HasSubstr("restoring every ps task")));
  EXPECT_THAT(chief_log, ::testing::Not(HasSubstr("restart the job")));
  EXPECT_THAT(chief_log, HasSubstr("resuming from the cluster's state"));
}

INSTANTIATE_TEST_SUITE_P(FailedTasks, ChiefRestartTest,
                         ::testing::Values(Before::kDown, Before::kBack, Before::kChained,
                                           Before::kDiedWithTheChief, Before::kDownWithTheChief,
                                           Before::kHalfDone),
                         [](const ::testing::TestParamInfo<Before>& info) {
                           switch (info.param) {
                             case Before::kDiedWithTheChief:
                               return "DiedWithTheChiefAndBackEmpty";
                             case Before::kDownWithTheChief:
                               return "DiedWithTheChiefAndDown";
                             case Before::kHalfDone:
                               return "FailoverLeftHalfDone";
                             case Before::kDown:
                               return "DownAtTheRestart";
                             case Before::kBack:
                               return "BackBeforeTheRestart";
                             case Before::kChained:
                               return "BackAndHoldingAnotherTasksPartitions";
                           }
                           return "";
                         });

// What a new chief refuses to fail over (docs/replication.md): ps:X failed over, came back and
// had its backups rebuilt; then the chief and ps:P, whose partitions X backs up, are killed
// together. X's copy of P may be a rebuild the dead chief did not finish (the new chief cannot
// tell), so P is not failed over onto it: the new chief waits for P, and once P is back empty
// it refuses to restore over the failover, failing with advice, and nothing of P's is served
// from initial values.
TEST(ChiefRestartTest, ATaskBackedUpOnAFailedOverTaskIsNotFailedOverAtStart) {
  const std::string checkpoint_dir = absl::StrCat(getenv("TEST_TMPDIR"), "/ckpt-refused");
  std::unique_ptr<TestCluster> started = StartReplicated(checkpoint_dir, /*with_table=*/false);
  TestCluster& cluster = *started;
  const v1::GetModelResponse m = ModelOf(cluster);
  const auto [x, p] = TasksToLoseInTurn(m.placement());
  ASSERT_GE(x, 0) << "no pair of tasks to kill one after the other";
  auto await_log = [&](const std::string& text) { return AwaitChiefLog(cluster, text); };
  {
    Pushers pushers(cluster, m, /*rows=*/false);
    ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
    ASSERT_TRUE(cluster.ps(x).Signal(SIGKILL).ok());
    ASSERT_TRUE(await_log(absl::StrCat("ps:", x, " failed over"))) << cluster.Logs(40);
    ASSERT_TRUE(cluster.StartTask("ps", x).ok()) << cluster.Logs();
    ASSERT_TRUE(await_log(absl::StrCat("backups rebuilt on ps:", x, ": "))) << cluster.Logs(40);
    ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
    for (const absl::Status& e : pushers.Stop()) {
      ASSERT_TRUE(e.ok()) << e << "\n" << cluster.Logs(40);
    }
  }
  ASSERT_TRUE(cluster.chief().Signal(SIGKILL).ok());
  ASSERT_TRUE(cluster.chief().WaitForExit(absl::Seconds(5)).ok());
  ASSERT_TRUE(cluster.ps(p).Signal(SIGKILL).ok());
  ASSERT_TRUE(cluster.ps(p).WaitForExit(absl::Seconds(5)).ok());
  ASSERT_TRUE(cluster.StartTask("chief", 0).ok()) << cluster.Logs();
  // Past the grace for a task that is down (2 s beyond the 1 s heartbeat timeout): still waiting.
  absl::SleepFor(absl::Seconds(4));
  std::unique_ptr<v1::Coordinator::Stub> chief = ChiefStubOf(cluster);
  EXPECT_EQ(ClusterStatusOf(*chief).phase(), v1::WAITING_FOR_PS) << cluster.Logs(40);
  ASSERT_TRUE(cluster.StartTask("ps", p).ok()) << cluster.Logs();
  const v1::ClusterStatus failed = AwaitStatus(
      *chief, [](const v1::ClusterStatus& s) { return s.phase() == v1::FAILED; },
      absl::Seconds(30));
  ASSERT_EQ(failed.phase(), v1::FAILED) << cluster.Logs(40);
  EXPECT_THAT(failed.phase_detail(), HasSubstr("restart the job from its newest checkpoint"));
  const std::string log = cluster.chief().LogTail(600);
  EXPECT_THAT(log, ::testing::Not(HasSubstr("lost its shards while no chief ran")));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("restored checkpoint")));
}

// The other refusal at start: ps:X failed over (its partitions promoted on both other tasks),
// then the chief and ps:Y, one of the tasks that took X's partitions over, are lost together,
// and Y comes back empty: the only copy of what Y had taken over is gone. The new chief finds X
// failed over (the third task still serves X's other partitions) and tells Y the failover
// again (AdoptFailovers); Y holds none of X's partitions, and the chief FAILS with the advice
// to restart the job from its newest checkpoint, restoring nothing (a restore would put X's
// partitions back on X, which is down, and roll back the others).
TEST(ChiefRestartTest, ATaskThatLostWhatItTookOverIsRefusedAtStart) {
  const std::string checkpoint_dir = absl::StrCat(getenv("TEST_TMPDIR"), "/ckpt-lost-taken");
  std::unique_ptr<TestCluster> started = StartReplicated(checkpoint_dir, /*with_table=*/false);
  TestCluster& cluster = *started;
  const v1::GetModelResponse m = ModelOf(cluster);
  // X: a task whose partitions are backed up on both other tasks; Y: one of those, with a
  // partition of its own backed up on X (so that the new chief does not fail Y over itself).
  std::map<int, std::set<int>> backups_of;
  for (const v1::DensePartition& p : m.placement().partitions()) {
    backups_of[p.ps_task()].insert(p.backup_ps_task());
  }
  int x = -1, y = -1;
  for (int a = 0; a < kNumPs && y < 0; ++a) {
    if (backups_of[a].size() != 2) continue;
    for (int b : backups_of[a]) {
      if (backups_of[b].count(a) > 0) {
        x = a;
        y = b;
        break;
      }
    }
  }
  ASSERT_GE(y, 0) << "no task backed up on both others, backing up one that backs it up";
  auto await_log = [&](const std::string& text) { return AwaitChiefLog(cluster, text); };
  {
    Pushers pushers(cluster, m, /*rows=*/false);
    ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
    ASSERT_TRUE(cluster.ps(x).Signal(SIGKILL).ok());
    ASSERT_TRUE(await_log(absl::StrCat("ps:", x, " failed over"))) << cluster.Logs(40);
    ASSERT_TRUE(pushers.AwaitAnswers(20)) << cluster.Logs(40);
    for (const absl::Status& e : pushers.Stop()) {
      ASSERT_TRUE(e.ok()) << e << "\n" << cluster.Logs(40);
    }
  }
  ASSERT_TRUE(cluster.chief().Signal(SIGKILL).ok());
  ASSERT_TRUE(cluster.chief().WaitForExit(absl::Seconds(5)).ok());
  ASSERT_TRUE(cluster.ps(y).Signal(SIGKILL).ok());
  ASSERT_TRUE(cluster.ps(y).WaitForExit(absl::Seconds(5)).ok());
  // (A task registers with the chief as it starts: Y once the new chief serves.)
  ASSERT_TRUE(cluster.StartTask("chief", 0).ok()) << cluster.Logs();
  ASSERT_TRUE(cluster.StartTask("ps", y).ok()) << cluster.Logs();
  std::unique_ptr<v1::Coordinator::Stub> chief = ChiefStubOf(cluster);
  const v1::ClusterStatus failed = AwaitStatus(
      *chief, [](const v1::ClusterStatus& s) { return s.phase() == v1::FAILED; },
      absl::Seconds(30));
  ASSERT_EQ(failed.phase(), v1::FAILED) << cluster.Logs(40);
  EXPECT_THAT(failed.phase_detail(),
              HasSubstr(absl::StrCat("ps:", x, " failed over, but ps:", y,
                                     " no longer holds the partitions of it")));
  EXPECT_THAT(failed.phase_detail(), HasSubstr("restart the job from its newest checkpoint"));
  const std::string log = cluster.chief().LogTail(600);
  EXPECT_THAT(log, HasSubstr(absl::StrCat("ps:", x, " failed over under an earlier chief")));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("restored checkpoint")));
}

// The real thing: worker daemons training the softmax model on Fashion-MNIST, async, with
// --replication=2 over three ps tasks, and one ps task killed with SIGKILL midway. Training
// goes on through the failover to the end, no checkpoint is restored (there is none), and the
// final model is as good as an undisturbed one.
// Workers training the softmax model in async mode, a ps task killed with SIGKILL in the middle:
// the chief fails it over, the workers follow, and the model still learns. Also with mutual TLS
// on every channel, as a deployed cluster runs (a daemon bound off loopback refuses to start
// without it): the forwards to the backups then go over the backups' sealed data plane, each
// ps task dialing with its own certificate.
class FailoverTrainingTest : public ::testing::TestWithParam<bool> {};

TEST_P(FailoverTrainingTest, WorkersTrainThroughAFailoverToAGoodModel) {
  const bool tls = GetParam();
  TestClusterOptions options;
  options.num_ps = kNumPs;
  options.num_workers = 2;
  if (tls) {
    options.tls_dir = absl::StrCat(getenv("TEST_TMPDIR"), "/certs");
    const ShellResult made = RunShellCommand(
        absl::StrCat("exec bash '", RunfilePath("deploy/tls/make_certs.sh"), "' --out '",
                     options.tls_dir,
                     "' --cluster mnist --chief_hosts 127.0.0.1:0 --ps_hosts "
                     "127.0.0.1:0,127.0.0.1:0,127.0.0.1:0 --worker_hosts 127.0.0.1:0,127.0.0.1:0"),
        absl::StrCat(getenv("TEST_TMPDIR"), "/make_certs.log"));
    ASSERT_EQ(made.exit_code, 0) << made.output;
  }
  options.flags["chief"] = SoftmaxTrainingChiefFlags(/*epochs=*/4);
  options.flags["worker"] = {"--step_delay_ms=10"};
  absl::StatusOr<std::unique_ptr<TestCluster>> started = TestCluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  TestCluster& cluster = **started;
  std::unique_ptr<v1::Coordinator::Stub> chief = ChiefStubOf(cluster);
  ASSERT_TRUE(AwaitGlobalStep(*chief, 200)) << cluster.Logs(40);
  ASSERT_TRUE(cluster.ps(2).Signal(SIGKILL).ok());
  const v1::ClusterStatus s = AwaitStatus(
      *chief, [](const v1::ClusterStatus& s) { return s.progress().finished(); },
      absl::Seconds(120));
  ASSERT_TRUE(s.progress().finished()) << cluster.Logs(40);
  // 4 epochs of 12,000 examples in batches of 50 over 2 workers: 960 steps in all.
  EXPECT_GE(s.global_step(), 960);
  // The softmax model reaches about 0.8 after 2 such epochs; one that lost its updates or
  // stopped learning stays well below.
  EXPECT_GT(s.progress().test_accuracy(), 0.7) << cluster.Logs(40);
  const std::string chief_log = cluster.chief().LogTail(600);
  EXPECT_THAT(chief_log, HasSubstr("ps:2 failed over"));
  EXPECT_THAT(chief_log, ::testing::Not(HasSubstr("restoring every ps task")));
  for (int w = 0; w < 2; ++w) {
    EXPECT_THAT(cluster.worker(w).LogTail(600),
                HasSubstr("ps tasks failed over to their backups: 2"))
        << "worker:" << w;
  }
  for (int ps = 0; ps < 2; ++ps) {  // the two that lived
    const std::string log = cluster.ps(ps).LogTail(5000);
    EXPECT_THAT(log, HasSubstr("forwarding updates to the backups over their tensor data plane"))
        << "ps:" << ps;
    EXPECT_THAT(log, HasSubstr(tls ? " (mutual TLS)" : " (plaintext)")) << "ps:" << ps;
  }
}

INSTANTIATE_TEST_SUITE_P(PlaintextAndTls, FailoverTrainingTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tls" : "Plaintext";
                         });

}  // namespace
}  // namespace pscluster
