// A worker killed with SIGKILL in sync mode with no backup workers: the chief notices within the
// heartbeat timeout and says which task is missing, nothing spins while it is gone, and training
// resumes when the worker comes back with the same task index.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "proto/ps_service.grpc.pb.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

// CPU time (user + system) a process has used, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Fields after the command name (which is in parentheses and may hold spaces).
  std::istringstream rest(text.substr(text.rfind(')') + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return static_cast<double>(utime + stime) / sysconf(_SC_CLK_TCK);
}

v1::TaskHealth HealthOf(const v1::ClusterStatus& s, const std::string& task) {
  for (const v1::TaskStatus& t : s.tasks()) {
    if (absl::StrCat(t.task().job(), ":", t.task().index()) == task) return t.health();
  }
  return v1::HEALTH_UNKNOWN;
}

TEST(SyncFaultTest, KilledWorkerIsReportedNothingSpinsAndTrainingResumes) {
  TestClusterOptions options = EndlessSyncTraining(2, 2);
  options.flags["chief"].push_back("--max_train_examples=6000");
  options.flags["chief"].push_back("--heartbeat_timeout_ms=1500");
  // Slow enough to leave the cluster idle between steps, fast enough to make progress.
  options.flags["worker"] = {"--step_delay_ms=20"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestCluster& c = **cluster;
  auto chief = ChiefStubOf(c);
  AwaitGlobalStep(*chief, 20, absl::Seconds(60));
  ASSERT_GE(ClusterStatusOf(*chief).global_step(), 20) << c.Logs();

  ASSERT_TRUE(c.worker(1).Signal(SIGKILL).ok());
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(c.worker(1).WaitForExit(absl::Seconds(5)).ok());
  v1::ClusterStatus status;
  do {
    status = ClusterStatusOf(*chief);
    if (HealthOf(status, "worker:1") == v1::HEALTH_MISSING) break;
    absl::SleepFor(absl::Milliseconds(50));
  } while (absl::Now() - killed < absl::Seconds(10));
  const absl::Duration noticed = absl::Now() - killed;
  ASSERT_EQ(HealthOf(status, "worker:1"), v1::HEALTH_MISSING) << status.DebugString();
  // The heartbeat timeout is 1.5 s; a chief that does not look at heartbeats never notices (the
  // loop above gives up after 10 s). The margin is for 2 loaded cores.
  EXPECT_LT(noticed, absl::Milliseconds(1500 + 4000));
  EXPECT_THAT(status.state(), HasSubstr("waiting for worker:1 (no heartbeat)"));
  ASSERT_EQ(status.waiting_for_size(), 1);
  EXPECT_EQ(status.waiting_for(0).job(), "worker");
  EXPECT_EQ(status.waiting_for(0).index(), 1);

  // While it is gone: the step stands still and nobody burns CPU waiting. Over 3 s, a thread
  // that spins takes a core whenever it can (over a second even on two busy cores); waiting,
  // a task spends a few milliseconds on heartbeats (more under the sanitizers).
  const int64_t stuck_at = status.global_step();
  const double chief_cpu = CpuSeconds(c.chief().pid());
  const double worker_cpu = CpuSeconds(c.worker(0).pid());
  const double ps_cpu = CpuSeconds(c.ps(0).pid());
  absl::SleepFor(absl::Seconds(3));
  status = ClusterStatusOf(*chief);
  EXPECT_EQ(status.global_step(), stuck_at);
  EXPECT_LT(CpuSeconds(c.chief().pid()) - chief_cpu, 0.6) << "the chief spins";
  EXPECT_LT(CpuSeconds(c.worker(0).pid()) - worker_cpu, 0.6) << "the waiting worker spins";
  EXPECT_LT(CpuSeconds(c.ps(0).pid()) - ps_cpu, 0.6) << "a ps task spins";

  // The worker comes back with the same index, rejoins at the current step, and training goes on.
  ASSERT_TRUE(c.StartTask("worker", 1).ok()) << c.Logs();
  AwaitGlobalStep(*chief, stuck_at + 10, absl::Seconds(60));
  status = ClusterStatusOf(*chief);
  EXPECT_GE(status.global_step(), stuck_at + 10) << c.Logs();
  EXPECT_EQ(HealthOf(status, "worker:1"), v1::HEALTH_SERVING);
  EXPECT_THAT(c.worker(1).LogTail(200), HasSubstr("registered with the chief"));
}

}  // namespace
}  // namespace pscluster

namespace pscluster {
namespace {

// The chief killed with SIGKILL in sync mode and started again: it recovers the global step
// from the ps tasks, so the workers go on from there without repeating or skipping a step.
// Reports no worker could send, from a client written from proto/ alone, are refused with an
// error naming the field and what was expected; none changes the global step or the progress,
// and training goes on. (A step of 2^63-1 once made the global step -2; finished=true from a
// client that never trained once ended training.)
TEST(SyncFaultTest, ImpossibleStepReportsAreRefusedAndChangeNothing) {
  TestClusterOptions options = EndlessSyncTraining(1, 1);
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestCluster& c = **cluster;
  auto chief = ChiefStubOf(c);
  AwaitGlobalStep(*chief, 5, absl::Seconds(60));
  struct Case {
    int worker;
    int64_t step;
    int64_t examples;
    bool finished;
    grpc::StatusCode code;
    std::string message;
  };
  const int64_t max = std::numeric_limits<int64_t>::max();
  const std::vector<Case> cases = {
      {0, max, 1, false, grpc::StatusCode::INVALID_ARGUMENT,
       "steps and 1 examples; expected at most"},
      {0, 100000, 1, true, grpc::StatusCode::INVALID_ARGUMENT, "past the global step"},
      {0, 1, -50, false, grpc::StatusCode::INVALID_ARGUMENT,
       "reports examples -50; expected a count >= 0"},
      {3, 1, 1, true, grpc::StatusCode::INVALID_ARGUMENT,
       "worker 3 is not in the cluster (1 workers)"},
  };
  for (const Case& k : cases) {
    const v1::ClusterStatus before = ClusterStatusOf(*chief);
    v1::ReportStepRequest req;
    req.set_worker(k.worker);
    req.set_step(k.step);
    req.set_examples(k.examples);
    req.set_finished(k.finished);
    v1::ReportStepResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = chief->ReportStep(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), k.code) << k.message << ": " << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr(k.message));
    const v1::ClusterStatus after = ClusterStatusOf(*chief);
    // Training goes on at its own pace: the step moved by what the real worker did, no more.
    EXPECT_GE(after.global_step(), before.global_step());
    EXPECT_LT(after.global_step(), before.global_step() + 1000) << k.message;
    EXPECT_FALSE(after.progress().finished()) << k.message;
    EXPECT_EQ(after.progress().workers_finished(), 0) << k.message;
  }
  // The chief still serves and training still advances.
  const int64_t now = ClusterStatusOf(*chief).global_step();
  AwaitGlobalStep(*chief, now + 10, absl::Seconds(30));
  EXPECT_GE(ClusterStatusOf(*chief).global_step(), now + 10) << c.Logs();
}

TEST(SyncFaultTest, RestartedChiefRecoversTheGlobalStep) {
  TestClusterOptions options = EndlessSyncTraining(2, 2);
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestCluster& c = **cluster;
  auto chief = ChiefStubOf(c);
  AwaitGlobalStep(*chief, 30, absl::Seconds(60));
  ASSERT_TRUE(c.chief().Signal(SIGKILL).ok());
  ASSERT_TRUE(c.chief().WaitForExit(absl::Seconds(5)).ok());
  // What the ps tasks have applied is the truth the new chief must find. Steps granted before
  // the kill may still complete (the new chief then finds more); without a chief no new one
  // starts.
  auto ps0 = v1::ParameterServer::NewStub(
      grpc::CreateChannel(c.address("ps:0"), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::ListShardsResponse shards;
  ASSERT_TRUE(ps0->ListShards(&ctx, v1::ListShardsRequest(), &shards).ok());
  int64_t applied = 0;
  for (const v1::ShardStats& s : shards.shards()) applied = std::max(applied, s.applied_step());
  ASSERT_GE(applied, 30);

  ASSERT_TRUE(c.StartTask("chief", 0).ok()) << c.Logs();
  v1::ClusterStatus status;
  absl::Time deadline = absl::Now() + absl::Seconds(30);
  do {
    status = ClusterStatusOf(*chief);
    if (status.state().find("training") != std::string::npos && status.global_step() > 0) break;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  // The chief serves (training) only once it has read the step back from the ps tasks, which it
  // logged: at least what they had applied when it died.
  ASSERT_THAT(status.state(), HasSubstr("training")) << c.Logs();
  const std::string log = c.chief().LogTail(200);
  const std::string said = "recovered global step ";
  const size_t at = log.find(said);
  ASSERT_NE(at, std::string::npos) << log;
  const int64_t recovered = std::stoll(log.substr(at + said.size()));
  EXPECT_GE(recovered, applied) << log;
  EXPECT_GE(status.global_step(), recovered) << c.Logs();
  const int64_t resumed = status.global_step();
  AwaitGlobalStep(*chief, resumed + 20, absl::Seconds(60));
  EXPECT_GE(ClusterStatusOf(*chief).global_step(), resumed + 20) << c.Logs();
  // Every step was applied once on every shard: the ps tasks agree with the chief, whose step
  // is read before and after theirs while training goes on.
  const int64_t chief_before = ClusterStatusOf(*chief).global_step();
  grpc::ClientContext ctx2;
  ASSERT_TRUE(ps0->ListShards(&ctx2, v1::ListShardsRequest(), &shards).ok());
  const int64_t chief_after = ClusterStatusOf(*chief).global_step();
  for (const v1::ShardStats& s : shards.shards()) {
    EXPECT_GE(s.applied_step(), chief_before - 1) << s.name();
    EXPECT_LE(s.applied_step(), chief_after + 1) << s.name();
  }
}

}  // namespace
}  // namespace pscluster
