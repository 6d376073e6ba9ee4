// Multi-process tests of the daemons' lifecycle: the real binaries on 127.0.0.1, port 0.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "storage/checkpoint.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct RunResult {
  int wait_status = 0;
  std::string output;
};

// Runs a binary to completion with the given TF_CONFIG and returns its status and output.
RunResult RunToExit(const std::string& binary, const std::vector<std::string>& args,
                    const std::string& tf_config) {
  static int n = 0;
  ChildProcessOptions options;
  options.binary = RunfilePath(binary);
  options.args = args;
  options.env = {{"TF_CONFIG", tf_config}};
  options.log_path = absl::StrCat(getenv("TEST_TMPDIR"), "/run", n++, ".log");
  auto child = ChildProcess::Spawn(options);
  CHECK(child.ok()) << child.status();
  auto status = (*child)->WaitForExit(absl::Seconds(30));
  CHECK(status.ok()) << status.status();
  return {*status, (*child)->LogTail(1000)};
}

// A chief and one ps task, no workers; `ps_flags` are added to the ps's.
absl::StatusOr<std::unique_ptr<TestCluster>> StartChiefAndOnePs(
    std::vector<std::string> ps_flags = {}) {
  TestClusterOptions options;
  options.num_ps = 1;
  options.num_workers = 0;
  if (!ps_flags.empty()) options.flags["ps"] = std::move(ps_flags);
  return TestCluster::Start(options);
}

TEST(LifecycleTest, AllTasksServeAndExitCleanlyOnSigterm) {
  TestClusterOptions options;
  options.num_ps = 2;
  options.num_workers = 2;
  // A slice of the data: a worker reading all of Fashion-MNIST (seconds under ASan on a busy
  // machine) when SIGTERM comes would stop only once it has read it.
  options.flags["chief"] = {"--max_train_examples=2000", "--max_test_examples=500"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestCluster& c = **cluster;

  // The chief sees all five tasks SERVING at the addresses they really bound.
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(c.chief_address(), grpc::InsecureChannelCredentials()));
  v1::ClusterStatus status;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  int serving = 0;
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    status.Clear();
    ASSERT_TRUE(stub->GetClusterStatus(&ctx, v1::GetClusterStatusRequest(), &status).ok());
    serving = 0;
    for (const v1::TaskStatus& t : status.tasks()) serving += t.health() == v1::HEALTH_SERVING;
    if (serving == 5) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_EQ(serving, 5) << status.DebugString();
  for (const v1::TaskStatus& t : status.tasks()) {
    EXPECT_EQ(t.address(), c.address(TaskName(t.task()))) << TaskName(t.task());
  }

  std::vector<ChildProcess*> processes = c.processes();
  ASSERT_EQ(processes.size(), 5u);
  for (ChildProcess* p : processes) ASSERT_TRUE(p->Signal(SIGTERM).ok());
  const absl::Time stop_deadline = absl::Now() + absl::Seconds(10);
  for (ChildProcess* p : processes) {
    auto exit = p->WaitForExit(std::max(stop_deadline - absl::Now(), absl::ZeroDuration()));
    ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << p->LogTail();
    EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0)
        << p->options().binary << ": " << DescribeWaitStatus(*exit) << "\n"
        << p->LogTail();
    EXPECT_THAT(p->LogTail(5), HasSubstr("stopped cleanly"));
    // Reaped and gone: nothing is left behind.
    EXPECT_EQ(kill(p->pid(), 0), -1);
  }
}

// The time of day of a glog line ("I20261202 14:02:11.617985 ..."), or -1.
double GlogSecondOfDay(const std::string& log, const std::string& text) {
  const size_t at = log.find(text);
  if (at == std::string::npos) return -1;
  const size_t line = log.rfind('\n', at);
  const std::string head = log.substr(line == std::string::npos ? 0 : line + 1, 24);
  int h = 0, m = 0;
  double s = 0;
  if (std::sscanf(head.c_str() + 9, "%d:%d:%lf", &h, &m, &s) != 3) return -1;
  return h * 3600 + m * 60 + s;
}

// With --exit_after_training the run ends by itself, as a Kubernetes Job must: the chief takes
// the final checkpoint, tells every task to stop through its heartbeat answer, and exits; the
// ps tasks and the workers exit 0 too. worker:0 was not given --exit_after_training and waits
// for the chief's word; worker:1 was, as the Kubernetes Jobs run them, and ends by itself once
// the chief's status says training finished, saying so to the chief (TaskRegistrar::
// SayStopping), which then need not wait for it to go missing.
TEST(LifecycleTest, TheWholeClusterExitsZeroWhenTrainingEnds) {
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/exit-after-training");
  TestClusterOptions options;
  options.num_ps = 2;
  options.num_workers = 2;
  options.flags["chief"] = RecoveryChiefFlags(dir);
  options.flags["chief"].push_back("--exit_after_training");
  options.flags["worker:1"] = {"--exit_after_training"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestCluster& c = **cluster;

  std::vector<ChildProcess*> processes = c.processes();
  ASSERT_EQ(processes.size(), 5u);
  auto chief_exit = c.chief().WaitForExit(absl::Seconds(240));
  ASSERT_TRUE(chief_exit.ok()) << chief_exit.status() << c.Logs();
  EXPECT_EQ(DescribeWaitStatus(*chief_exit), "exit 0") << c.chief().LogTail(30);
  const std::string chief_log = c.chief().LogTail(30);
  EXPECT_THAT(chief_log, HasSubstr("every task has been told to stop"));
  // Every task said it heard, or that it stops by itself, at once: no wait for one to go
  // missing (1.5 s here, then up to 10 s more).
  const double telling = GlogSecondOfDay(chief_log, "telling every task to stop");
  const double told = GlogSecondOfDay(chief_log, "every task has been told to stop");
  ASSERT_GE(telling, 0) << chief_log;
  ASSERT_GE(told, 0) << chief_log;
  EXPECT_LT(told - telling, 1.5) << chief_log;
  // Every other task has heard it by the time the chief exits, and stops within moments.
  for (ChildProcess* p : processes) {
    auto exit = p->WaitForExit(absl::Seconds(10));
    ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << p->LogTail();
    EXPECT_EQ(DescribeWaitStatus(*exit), "exit 0") << p->options().binary << "\n" << p->LogTail();
  }
  for (const std::string task : {"ps:0", "ps:1", "worker:0"}) {
    ChildProcess& p = task[0] == 'p' ? c.ps(task.back() - '0') : c.worker(task.back() - '0');
    EXPECT_THAT(p.LogTail(30), HasSubstr("the chief says training is over")) << task;
  }
  // The final checkpoint holds the final step: 2 epochs of 12,000 examples, each sync step
  // a batch of 50 from each of the 2 workers.
  auto checkpoints = ListCheckpoints(dir);
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  ASSERT_FALSE(checkpoints->empty());
  auto manifest = ReadManifest(checkpoints->front());
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step(), 240);
  EXPECT_TRUE(VerifyCheckpoint(checkpoints->front()).ok());
}

// SIGTERM is honoured within the grace period whatever the chief waits on: here a recovery
// that cannot finish, because the restarted ps:1 dies again (--crash_at=ps_create_shards) when
// the chief re-creates its shards, and the chief's calls to it retry.
TEST(LifecycleTest, SigtermEndsTheChiefDuringAStuckRecovery) {
  TestClusterOptions options = EndlessSyncTraining(2, 1);
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestCluster& c = **cluster;
  auto chief = ChiefStubOf(c);
  ASSERT_TRUE(AwaitGlobalStep(*chief, 5)) << c.Logs();
  ASSERT_TRUE(c.ps(1).Signal(SIGKILL).ok());
  ASSERT_TRUE(c.ps(1).WaitForExit(absl::Seconds(5)).ok());
  c.SetFlags("ps:1", {"--crash_at=ps_create_shards"});
  // The chief may re-create its shards, and so kill it, before it is seen SERVING: what
  // StartTask says does not matter, the crash point's line below does.
  c.StartTask("ps", 1).IgnoreError();
  ASSERT_TRUE(c.ps(1).WaitForExit(absl::Seconds(30)).ok()) << c.Logs();
  ASSERT_THAT(c.ps(1).LogTail(5), HasSubstr("crash point ps_create_shards"));
  // The chief is now retrying its calls to the dead task.
  const v1::ClusterStatus stuck =
      AwaitStatus(*chief, [](const v1::ClusterStatus& s) { return s.phase() == v1::RECOVERING; });
  EXPECT_THAT(stuck.state(), HasSubstr("recovering: ps:1 restarted"));
  EXPECT_EQ(stuck.phase(), v1::RECOVERING);
  EXPECT_EQ(stuck.phase_detail(), "ps:1 restarted");
  EXPECT_THAT(c.chief().LogTail(50), HasSubstr("chief: training -> recovering (ps:1 restarted)"));
  const absl::Time start = absl::Now();
  ASSERT_TRUE(c.chief().Signal(SIGTERM).ok());
  auto exit = c.chief().WaitForExit(absl::Seconds(10));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << c.chief().LogTail();
  const absl::Duration took = absl::Now() - start;
  // Unheeded, SIGTERM would wait for the retries to give up: 20 attempts with backoff up to
  // 2 s, over half a minute. Heeded, the chief exits at once (well under a second on an idle
  // machine); the bound leaves room for two loaded cores.
  EXPECT_LT(took, absl::Seconds(6)) << c.chief().LogTail(30);
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << DescribeWaitStatus(*exit) << "\n"
                                                           << c.chief().LogTail(30);
  LOG(INFO) << "the chief stopped " << absl::FormatDuration(took) << " after SIGTERM";
}

// SIGTERM also ends a call under way, not only the retries: here the chief's checkpoint save
// waits on ps:1, which stopped itself (SIGSTOP, every thread) in the middle of it and answers
// nothing. Before, the chief stopped only once the save's deadline passed
// (--checkpoint_timeout_secs, 600 s by default); a rebuild's copy held it the same way.
TEST(LifecycleTest, SigtermEndsTheChiefDuringASaveStuckOnAFrozenPs) {
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/frozen-save");
  TestClusterOptions options = EndlessSyncTraining(2, 1);
  options.flags["chief"].push_back("--checkpoint_dir=" + dir);
  options.flags["chief"].push_back("--checkpoint_every_steps=20");
  options.flags["ps:1"] = {"--crash_at=save_midway@2:stop"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestCluster& c = **cluster;
  const absl::Time until = absl::Now() + absl::Seconds(60);
  while (c.ps(1).LogTail(5).find("reached: SIGSTOP") == std::string::npos && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_THAT(c.ps(1).LogTail(5), HasSubstr("crash point save_midway@2 reached: SIGSTOP"))
      << c.Logs();
  absl::SleepFor(absl::Milliseconds(300));  // the save is waiting on ps:1
  const absl::Time start = absl::Now();
  ASSERT_TRUE(c.chief().Signal(SIGTERM).ok());
  auto exit = c.chief().WaitForExit(absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << c.chief().LogTail(30);
  const absl::Duration took = absl::Now() - start;
  EXPECT_LT(took, absl::Seconds(6)) << c.chief().LogTail(30);
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << DescribeWaitStatus(*exit) << "\n"
                                                           << c.chief().LogTail(30);
  LOG(INFO) << "the chief stopped " << absl::FormatDuration(took)
            << " after SIGTERM, its save stuck on a frozen ps task";
}

TEST(LifecycleTest, SigintStopsADaemonToo) {
  auto cluster = StartChiefAndOnePs();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ChildProcess& ps = (*cluster)->ps(0);
  ASSERT_TRUE(ps.Signal(SIGINT).ok());
  auto exit = ps.WaitForExit(absl::Seconds(5));
  ASSERT_TRUE(exit.ok()) << exit.status();
  EXPECT_EQ(DescribeWaitStatus(*exit), "exit 0") << ps.LogTail();
}

// A ps whose chief is gone (killed first, as a Job's pods may be, its host dead) still exits
// at once on SIGTERM. Its heartbeat to the chief hangs in connect; stopping used to wait for
// the call's deadline (3 s here, up to ~9 s past the grace period in multi-host runs), and now
// cancels it (TaskRegistrar::Stop, ChiefClient::CancelCalls).
TEST(LifecycleTest, APsWhoseChiefIsGoneExitsPromptly) {
  auto cluster = StartChiefAndOnePs();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ChildProcess& ps = (*cluster)->ps(0);
  ASSERT_TRUE((*cluster)->chief().Signal(SIGKILL).ok());
  ASSERT_TRUE((*cluster)->chief().WaitForExit(absl::Seconds(10)).ok());
  // The chief's host as a dead machine looks: connections to its port neither succeed nor are
  // refused (a listener whose queue is full drops their SYNs), so the ps's channel hangs in
  // connect rather than failing at once as on a live loopback.
  const std::string chief = (*cluster)->chief_address();
  const int port = std::stoi(chief.substr(chief.rfind(':') + 1));
  const int hole = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  const int one = 1;
  setsockopt(hole, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ASSERT_EQ(bind(hole, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0) << strerror(errno);
  ASSERT_EQ(listen(hole, 0), 0);
  std::vector<int> fillers;
  for (int i = 0; i < 3; ++i) {  // fill the queue: later SYNs are dropped
    const int f = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    connect(f, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    fillers.push_back(f);
  }
  absl::SleepFor(absl::Seconds(3));  // the ps's heartbeats fail and its channel reconnects
  const absl::Time signalled = absl::Now();
  ASSERT_TRUE(ps.Signal(SIGTERM).ok());
  auto exit = ps.WaitForExit(absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << ps.LogTail();
  const absl::Duration took = absl::Now() - signalled;
  EXPECT_EQ(DescribeWaitStatus(*exit), "exit 0") << ps.LogTail();
  EXPECT_THAT(ps.LogTail(10), HasSubstr("stopped cleanly"));
  EXPECT_LT(took, absl::Seconds(1)) << ps.LogTail();
  LOG(INFO) << "the ps exited " << absl::FormatDuration(took) << " after SIGTERM";
  for (int f : fillers) close(f);
  close(hole);
}

// A ps given --give_up_on_chief_secs stops and exits 3 once the chief has answered nothing for
// that long (its Job failed for good), so that the Kubernetes Jobs of the run fail too instead
// of waiting for it until their deadline; it keeps waiting while the chief answers.
TEST(LifecycleTest, APsGivesUpOnAChiefGoneForGoodWithExitCode3) {
  auto cluster = StartChiefAndOnePs({"--give_up_on_chief_secs=2"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ChildProcess& ps = (*cluster)->ps(0);
  // Heartbeats answered: it stays.
  EXPECT_FALSE(ps.WaitForExit(absl::Seconds(3)).ok()) << ps.LogTail();
  ASSERT_TRUE((*cluster)->chief().Signal(SIGKILL).ok());
  const absl::Time killed = absl::Now();
  auto exit = ps.WaitForExit(absl::Seconds(20));
  ASSERT_TRUE(exit.ok()) << exit.status() << "\n" << ps.LogTail();
  EXPECT_EQ(DescribeWaitStatus(*exit), "exit 3") << ps.LogTail();
  // The 2 s of silence count from the last answered heartbeat, which may be up to one
  // heartbeat interval (1 s) before the kill (when the kill meets a heartbeat in flight, as it
  // did in 1 of 3 runs here): not sooner than 1 s after it.
  EXPECT_GE(absl::Now() - killed, absl::Seconds(0.9));
  EXPECT_THAT(ps.LogTail(20), HasSubstr("(--give_up_on_chief_secs): giving up on it"));
  EXPECT_THAT(ps.LogTail(20), HasSubstr("its Job has failed or it is unreachable"));
}

TEST(LifecycleTest, PsctlStatusShowsEveryTask) {
  TestClusterOptions options;
  options.num_ps = 2;
  options.num_workers = 1;
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  RunResult r;
  for (int attempt = 0; attempt < 100; ++attempt) {
    r = RunToExit("cli/psctl", {"--chief=" + (*cluster)->chief_address(), "status"}, "");
    if (r.output.find("all tasks serving") != std::string::npos) break;
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 0") << r.output;
  for (const char* task : {"chief:0", "ps:0", "ps:1", "worker:0"}) {
    EXPECT_THAT(r.output, HasSubstr(absl::StrCat(task, "  ")));
    EXPECT_THAT(r.output, HasSubstr((*cluster)->address(task)));
  }
  EXPECT_THAT(r.output, HasSubstr("state: all tasks serving"));

  // Unreachable chief: a clear message and a non-zero exit.
  (*cluster)->KillAll();
  r = RunToExit("cli/psctl", {"--chief=" + (*cluster)->chief_address(), "status"}, "");
  EXPECT_NE(DescribeWaitStatus(r.wait_status), "exit 0");
  EXPECT_THAT(r.output, HasSubstr("cannot reach the chief at " + (*cluster)->chief_address()));
}

struct BadSpec {
  const char* name;
  const char* tf_config;
  const char* expected;
};

class BadClusterSpecTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(BadClusterSpecTest, EveryDaemonRefusesWithOneLine) {
  const BadSpec& spec = GetParam();
  for (const char* binary : {"chief/chief", "ps_server/ps_server", "worker/worker"}) {
    SCOPED_TRACE(binary);
    RunResult r = RunToExit(binary, {}, spec.tf_config);
    EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << r.output;
    EXPECT_THAT(r.output, HasSubstr("invalid cluster spec: "));
    EXPECT_THAT(r.output, HasSubstr(spec.expected));
    // One line, ending in a newline.
    EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 0) << r.output;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllProblems, BadClusterSpecTest,
    ::testing::Values(BadSpec{"MalformedJson", R"({"cluster": {"ps": [)", "not a valid JSON"},
                      BadSpec{"UnknownJob",
                              R"({"cluster": {"chief": ["a:1"], "ps": ["b:1"], "boss": ["c:1"]},
                    "task": {"type": "ps", "index": 0}})",
                              "unknown job \"boss\""},
                      BadSpec{"IndexOutOfRange",
                              R"({"cluster": {"chief": ["a:1"], "ps": ["b:1"], "worker": ["c:1"]},
                    "task": {"type": "ps", "index": 3}})",
                              "task index 3 out of range for job \"ps\""},
                      BadSpec{"MissingTask", R"({"cluster": {"chief": ["a:1"], "ps": ["b:1"]}})",
                              "no task"},
                      BadSpec{"MalformedAddress",
                              R"({"cluster": {"chief": ["a:1"], "ps": ["b"]},
                    "task": {"type": "ps", "index": 0}})",
                              "malformed address \"b\""},
                      BadSpec{"DuplicateAddress",
                              R"({"cluster": {"chief": ["a:1"], "ps": ["b:1", "a:1"]},
                    "task": {"type": "ps", "index": 0}})",
                              "duplicate address \"a:1\""},
                      BadSpec{"NoPs",
                              R"({"cluster": {"chief": ["a:1"], "worker": ["b:1"]},
                    "task": {"type": "worker", "index": 0}})",
                              "no \"ps\" task"},
                      BadSpec{"TwoChiefs",
                              R"({"cluster": {"chief": ["a:1", "a:2"], "ps": ["b:1"]},
                    "task": {"type": "ps", "index": 0}})",
                              "job \"chief\" has 2 tasks"}),
    [](const ::testing::TestParamInfo<BadSpec>& info) { return info.param.name; });

TEST(DaemonFlagsTest, HelpListsTheProjectsFlagsByGroupAndExitsZero) {
  for (const char* binary :
       {"chief/chief", "ps_server/ps_server", "worker/worker", "evaluator/evaluator"}) {
    for (const char* help : {"--help", "--helpshort"}) {
      RunResult r = RunToExit(binary, {help}, "");
      EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 0") << binary << " " << help;
      for (const char* text :
           {"--port_file", "--ps_hosts", "--task_index", "--cluster_spec_file", "--tls_ca_file",
            "Cluster spec (else the TF_CONFIG environment variable):",
            "Mutual TLS (docs/security.md):", "Server:", "--helpfull lists every flag"}) {
        EXPECT_THAT(r.output, HasSubstr(text)) << binary << " " << help;
      }
      // The logging library's flags are left to --helpfull.
      EXPECT_THAT(r.output, Not(HasSubstr("--minloglevel"))) << binary;
      EXPECT_THAT(r.output, Not(HasSubstr("--flagfile"))) << binary;
    }
    RunResult full = RunToExit(binary, {"--helpfull"}, "");
    EXPECT_THAT(full.output, HasSubstr("-minloglevel")) << binary;
  }
  // Each program lists its own flags first, under its name.
  EXPECT_THAT(RunToExit("chief/chief", {"--help"}, "").output,
              HasSubstr("chief flags:\n  --batch_size  (int32, default 128)"));
  EXPECT_THAT(RunToExit("ps_server/ps_server", {"--help"}, "").output,
              HasSubstr("--max_table_rows"));
}

TEST(DaemonFlagsTest, VersionNamesTheReleaseAndCommit) {
  for (const char* binary :
       {"chief/chief", "ps_server/ps_server", "worker/worker", "evaluator/evaluator"}) {
    RunResult r = RunToExit(binary, {"--version"}, "");
    EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 0") << binary;
    EXPECT_THAT(r.output, ::testing::MatchesRegex(".* version [0-9]+\\.[0-9]+\\.[0-9]+ "
                                                  "\\(commit [0-9a-z-]+\\)"))
        << binary;
  }
}

// Flags naming paths are checked before anything starts, with the flag, the path and why.
TEST(DaemonFlagsTest, BadPathsAreRefusedAtStart) {
  const std::string chief_config =
      R"({"cluster": {"chief": ["127.0.0.1:0"], "ps": ["127.0.0.1:0"]},
          "task": {"type": "chief", "index": 0}})";
  const std::string model = "--model_config=" + RunfilePath("configs/mlp.pbtxt");
  const std::string tmp = getenv("TEST_TMPDIR");
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {{model, "--data_path=/nonexistent"},
            "chief: --data_path /nonexistent: no such file or directory"},
           {{model, "--metrics_file=/nonexistent/m.jsonl"},
            "chief: --metrics_file /nonexistent/m.jsonl: its directory /nonexistent does not "
            "exist"},
           {{model, "--metrics_file=" + tmp},
            "chief: --metrics_file " + tmp + ": is a directory, expected a file"},
           {{model, "--checkpoint_dir=/proc/nope"},
            "chief: --checkpoint_dir /proc/nope: cannot create it"},
           {{model, "--port_file=/nonexistent/port"},
            "chief: --port_file /nonexistent/port: its directory /nonexistent does not exist"},
       }) {
    RunResult r = RunToExit("chief/chief", c.args, chief_config);
    EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << r.output;
    EXPECT_THAT(r.output, HasSubstr(c.message));
  }
  RunResult ps = RunToExit("ps_server/ps_server", {"--checkpoint_dir=/nonexistent"},
                           R"({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:0"]},
                               "task": {"type": "ps", "index": 0}})");
  EXPECT_EQ(DescribeWaitStatus(ps.wait_status), "exit 2") << ps.output;
  EXPECT_THAT(ps.output, HasSubstr("ps_server: --checkpoint_dir /nonexistent: not an existing "
                                   "directory"));
  RunResult worker = RunToExit("worker/worker", {"--data_path=/nonexistent"},
                               R"({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:0"],
                                   "worker": ["127.0.0.1:0"]},
                                   "task": {"type": "worker", "index": 0}})");
  EXPECT_EQ(DescribeWaitStatus(worker.wait_status), "exit 2") << worker.output;
  EXPECT_THAT(worker.output, HasSubstr("worker: --data_path /nonexistent: no such file"));
}

TEST(DaemonFlagsTest, ANegativeGiveUpOnTheChiefIsRefusedAtStart) {
  const std::string ps_config = R"({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:0"]},
                                    "task": {"type": "ps", "index": 0}})";
  for (const std::string value : {"-1", "nan"}) {
    RunResult ps =
        RunToExit("ps_server/ps_server", {"--give_up_on_chief_secs=" + value}, ps_config);
    EXPECT_EQ(DescribeWaitStatus(ps.wait_status), "exit 2") << ps.output;
    EXPECT_THAT(ps.output,
                HasSubstr("ps_server: --give_up_on_chief_secs must be >= 0, not " + value));
  }
  RunResult worker = RunToExit("worker/worker", {"--give_up_on_chief_secs=-1"},
                               R"({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:0"],
                                   "worker": ["127.0.0.1:0"]},
                                   "task": {"type": "worker", "index": 0}})");
  EXPECT_EQ(DescribeWaitStatus(worker.wait_status), "exit 2") << worker.output;
  EXPECT_THAT(worker.output, HasSubstr("worker: --give_up_on_chief_secs must be >= 0, not -1"));
}

TEST(DaemonFlagsTest, AWorkerAskedForAMissingGpuRefusesToStart) {
  const std::string tf_config =
      R"({"cluster": {"chief": ["127.0.0.1:1"], "ps": ["127.0.0.1:0"], "worker": ["127.0.0.1:0"]},
          "task": {"type": "worker", "index": 0}})";
  RunResult r = RunToExit("worker/worker", {"--device=gpu:7"}, tf_config);
  EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << r.output;
  // Built without CUDA it says so; with CUDA and no such device it names the GPU.
  EXPECT_THAT(r.output,
              ::testing::AnyOf(HasSubstr("built without CUDA"), HasSubstr("GPU 7 does not exist"),
                               HasSubstr("no usable CUDA driver")));
  r = RunToExit("worker/worker", {"--device=tpu"}, tf_config);
  EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << r.output;
  EXPECT_THAT(r.output,
              HasSubstr("--device must be cpu, gpu:N, or GPUs gpu:N,gpu:M,..., not \"tpu\""));
  r = RunToExit("worker/worker", {"--device=gpu:0,gpu:0"}, tf_config);
  EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << r.output;
  EXPECT_THAT(r.output, HasSubstr("--device names gpu:0 twice"));
  r = RunToExit("worker/worker", {"--pipeline_staleness=-1"}, tf_config);
  EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << r.output;
  EXPECT_THAT(r.output, HasSubstr("--pipeline_staleness must be >= 0, got -1"));
  for (const char* every : {"0", "-1", "nan"}) {
    r = RunToExit("worker/worker", {std::string("--report_every_secs=") + every}, tf_config);
    EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << r.output;
    EXPECT_THAT(r.output, HasSubstr("--report_every_secs must be in (0, 3600], not"));
  }
}

TEST(DaemonFlagsTest, TheChiefRefusesSettingsItCannotRun) {
  const std::string tf_config =
      R"({"cluster": {"chief": ["127.0.0.1:0"], "ps": ["127.0.0.1:0"], "worker": ["127.0.0.1:0"]},
          "task": {"type": "chief", "index": 0}})";
  RunResult r = RunToExit("chief/chief", {"--local_steps=0"}, tf_config);
  EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << r.output;
  EXPECT_THAT(r.output, HasSubstr("--local_steps must be >= 1"));
  r = RunToExit("chief/chief", {"--local_steps=4", "--mode=sync"}, tf_config);
  EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << r.output;
  EXPECT_THAT(r.output, HasSubstr("--local_steps needs --mode=async or ssp"));
  r = RunToExit("chief/chief", {"--full_checkpoint_every=0"}, tf_config);
  EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << r.output;
  EXPECT_THAT(r.output, HasSubstr("--full_checkpoint_every must be >= 1 (1: every checkpoint "
                                  "full), not 0"));
}

TEST(DaemonFlagsTest, AnUnknownCrashPointIsRefused) {
  const std::string tf_config =
      R"({"cluster": {"chief": ["127.0.0.1:0"], "ps": ["127.0.0.1:0"]},
          "task": {"type": "TASK", "index": 0}})";
  for (const char* job : {"chief", "ps"}) {
    std::string config = tf_config;
    config.replace(config.find("TASK"), 4, job);
    RunResult r = RunToExit(std::string(job) == "chief" ? "chief/chief" : "ps_server/ps_server",
                            {"--crash_at=save_somewhere@2"}, config);
    EXPECT_EQ(DescribeWaitStatus(r.wait_status), "exit 2") << job << ": " << r.output;
    EXPECT_THAT(r.output, HasSubstr("--crash_at: unknown crash point \"save_somewhere\"; "
                                    "expected one of save_opened"))
        << job;
  }
}

}  // namespace
}  // namespace pscluster
