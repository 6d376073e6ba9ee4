#include "testing/test_cluster.h"

#include <signal.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/grpc_channel.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "proto/health.grpc.pb.h"

namespace pscluster {
namespace {

std::string EnvOr(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

}  // namespace

std::vector<std::string> RecoveryChiefFlags(const std::string& checkpoint_dir,
                                            const std::string& mode) {
  return {"--model_config=" + RunfilePath("configs/softmax_regression.pbtxt"),
          "--mode=" + mode,
          "--max_train_examples=12000",
          "--max_test_examples=2000",
          "--epochs=2",
          "--batch_size=50",
          "--eval_every_secs=60",
          "--heartbeat_interval_ms=200",
          "--heartbeat_timeout_ms=1500",
          "--checkpoint_dir=" + checkpoint_dir,
          "--checkpoint_every_steps=40"};
}

TestClusterOptions EndlessSyncTraining(int num_ps, int num_workers) {
  TestClusterOptions options;
  options.num_ps = num_ps;
  options.num_workers = num_workers;
  options.flags["chief"] = {"--model_config=" + RunfilePath("configs/softmax_regression.pbtxt"),
                            "--mode=sync",
                            "--max_train_examples=4000",
                            "--max_test_examples=100",
                            "--epochs=1000",
                            "--batch_size=20",
                            "--heartbeat_interval_ms=200"};
  options.flags["worker"] = {"--step_delay_ms=10"};
  return options;
}

std::string RunfilePath(const std::string& path) {
  return absl::StrCat(EnvOr("TEST_SRCDIR", "."), "/", EnvOr("TEST_WORKSPACE", "pscluster"), "/",
                      path);
}

v1::ClusterStatus ClusterStatusOf(v1::Coordinator::StubInterface& chief) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ClusterStatus status;
  grpc::Status s = chief.GetClusterStatus(&ctx, v1::GetClusterStatusRequest(), &status);
  CHECK(s.ok()) << "the chief does not answer GetClusterStatus: " << s.error_message();
  return status;
}

TlsConfig TlsFilesOf(const std::string& dir, const std::string& holder) {
  TlsConfig tls;
  tls.ca_file = dir + "/ca.pem";
  tls.cert_file = absl::StrCat(dir, "/", holder, ".pem");
  tls.key_file = absl::StrCat(dir, "/", holder, ".key");
  return tls;
}

std::unique_ptr<v1::Coordinator::Stub> ChiefStubOf(const TestCluster& cluster) {
  GrpcChannelOptions channel;
  channel.tls = cluster.client_tls();
  return v1::Coordinator::NewStub(NewGrpcChannel(cluster.chief_address(), channel));
}

v1::GetModelResponse ModelOf(TestCluster& cluster) {
  std::unique_ptr<v1::Coordinator::Stub> chief = ChiefStubOf(cluster);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ctx.set_wait_for_ready(true);  // (a chief a test restarts may not listen yet)
  v1::GetModelRequest req;
  req.set_wait_until_ready(true);
  v1::GetModelResponse resp;
  grpc::Status s = chief->GetModel(&ctx, req, &resp);
  CHECK(s.ok()) << s.error_message() << "\n" << cluster.Logs();
  return resp;
}

v1::ClusterStatus AwaitStatus(v1::Coordinator::StubInterface& chief,
                              const std::function<bool(const v1::ClusterStatus&)>& done,
                              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::ClusterStatus status;
  do {
    status = ClusterStatusOf(chief);
    if (done(status)) break;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  return status;
}

bool AwaitGlobalStep(v1::Coordinator::StubInterface& chief, int64_t step, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (ClusterStatusOf(chief).global_step() < step) {
    if (absl::Now() >= deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

absl::Status AwaitServing(const std::string& address, absl::Duration timeout,
                          const TlsConfig& tls) {
  GrpcChannelOptions channel;
  channel.tls = tls;
  auto stub = grpc::health::v1::Health::NewStub(NewGrpcChannel(address, channel));
  const absl::Time deadline = absl::Now() + timeout;
  std::string last = "no answer";
  while (absl::Now() < deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status s = stub->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
    if (s.ok() && resp.status() == grpc::health::v1::HealthCheckResponse::SERVING) {
      return absl::OkStatus();
    }
    last = s.ok() ? absl::StrCat("health status ", resp.status()) : s.error_message();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(
      absl::StrCat(address, " not SERVING after ", absl::FormatDuration(timeout), ": ", last));
}

absl::StatusOr<int> AwaitPortFile(const std::string& path, ChildProcess& process,
                                  absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    std::ifstream in(path);
    std::string text;
    int port = 0;
    if (in && std::getline(in, text) && absl::SimpleAtoi(text, &port) && port > 0) return port;
    if (!process.Running()) {
      return absl::UnavailableError(absl::StrCat(
          process.options().binary, " exited before writing its port:\n", process.LogTail()));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("no port in ", path, " after ", absl::FormatDuration(timeout)));
}

TestCluster::TestCluster(const TestClusterOptions& options) : options_(options) {
  binary_dir_ = options.binary_dir.empty() ? RunfilePath("") : options.binary_dir;
  // Each cluster of a test binary gets its own folder, so later clusters keep earlier logs.
  static int clusters = 0;
  work_dir_ = absl::StrCat(options.work_dir.empty()
                               ? EnvOr("TEST_UNDECLARED_OUTPUTS_DIR", EnvOr("TEST_TMPDIR", "/tmp"))
                               : options.work_dir,
                           "/cluster-", clusters++);
  mkdir(work_dir_.c_str(), 0755);
  if (!options.tls_dir.empty()) client_tls_ = TlsFilesOf(options.tls_dir, "psctl-viewer");
}

TestCluster::~TestCluster() { KillAll(); }

std::string TestCluster::BinaryFor(const std::string& job) const {
  if (job == kChiefJob) return binary_dir_ + "/chief/chief";
  if (job == kPsJob) return binary_dir_ + "/ps_server/ps_server";
  if (job == kEvaluatorJob) return binary_dir_ + "/evaluator/evaluator";
  return binary_dir_ + "/worker/worker";
}

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::Start(const TestClusterOptions& options) {
  auto cluster = std::unique_ptr<TestCluster>(new TestCluster(options));
  auto add_job = [&](v1::ClusterSpec* spec, const std::string& name, int n,
                     const std::string& address) {
    if (n == 0) return;
    v1::JobDef* job = spec->add_jobs();
    job->set_name(name);
    for (int i = 0; i < n; ++i) (*job->mutable_tasks())[i] = address;
  };
  // The chief's own spec: every address at port 0; the chief learns the others' real
  // addresses when they register.
  add_job(&cluster->spec_, "chief", 1, "127.0.0.1:0");
  add_job(&cluster->spec_, "ps", options.num_ps, "127.0.0.1:0");
  add_job(&cluster->spec_, "worker", options.num_workers, "127.0.0.1:0");
  add_job(&cluster->spec_, "evaluator", options.num_evaluators, "127.0.0.1:0");
  PS_RETURN_IF_ERROR(cluster->StartTask("chief", 0));
  (*cluster->spec_.mutable_jobs(0)->mutable_tasks())[0] = cluster->chief_address();
  for (int i = 0; i < options.num_ps; ++i) PS_RETURN_IF_ERROR(cluster->StartTask("ps", i));
  for (int i = 0; i < options.num_workers; ++i) {
    PS_RETURN_IF_ERROR(cluster->StartTask("worker", i));
  }
  for (int i = 0; i < options.num_evaluators; ++i) {
    PS_RETURN_IF_ERROR(cluster->StartTask("evaluator", i));
  }
  return cluster;
}

absl::Status TestCluster::StartTask(const std::string& job, int index, bool same_address) {
  const std::string name = absl::StrCat(job, ":", index);
  const int n = starts_++;
  v1::ClusterConfig config;
  *config.mutable_cluster() = spec_;
  *config.mutable_task() = MakeTaskId(job, index);

  if (tasks_.count(name) && (same_address || job == "chief")) {
    // A restarted task comes back at the address the others know.
    for (v1::JobDef& j : *config.mutable_cluster()->mutable_jobs()) {
      if (j.name() == job) (*j.mutable_tasks())[index] = tasks_[name].address;
    }
  }
  ChildProcessOptions child;
  child.binary = BinaryFor(job);
  const std::string base = absl::StrCat(work_dir_, "/", job, "-", index, ".", n);
  const std::string port_file = base + ".port";
  std::remove(port_file.c_str());
  child.log_path = base + ".log";
  child.args = {absl::StrCat("--port_file=", port_file)};
  if (!options_.tls_dir.empty()) {
    const TlsConfig tls = TlsFilesOf(options_.tls_dir, absl::StrCat(job, "-", index));
    child.args.push_back("--tls_ca_file=" + tls.ca_file);
    child.args.push_back("--tls_cert_file=" + tls.cert_file);
    child.args.push_back("--tls_key_file=" + tls.key_file);
  }
  for (const std::string& key : {job, name}) {
    auto it = options_.flags.find(key);
    if (it != options_.flags.end()) {
      child.args.insert(child.args.end(), it->second.begin(), it->second.end());
    }
  }
  child.env = {{"TF_CONFIG", ToTfConfigJson(config)}};

  Task& task = tasks_[name];
  task.process.reset();  // reaps an earlier process of this task
  PS_ASSIGN_OR_RETURN(task.process, ChildProcess::Spawn(child));
  PS_ASSIGN_OR_RETURN(int port, AwaitPortFile(port_file, *task.process, options_.start_timeout));
  task.address = absl::StrCat("127.0.0.1:", port);
  // Asked in short slices, so that a task that dies before it serves (a crash point, a bad
  // flag) is reported at once rather than after the whole timeout.
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  absl::Status serving;
  do {
    serving = AwaitServing(task.address, std::min(absl::Milliseconds(500), deadline - absl::Now()),
                           client_tls_);
    if (!serving.ok() && !task.process->Running()) {
      serving = absl::UnavailableError(absl::StrCat(task.address, " exited before serving"));
      break;
    }
  } while (!serving.ok() && absl::Now() < deadline);
  if (!serving.ok()) {
    return absl::Status(serving.code(),
                        absl::StrCat(name, ": ", serving.message(), "\n", task.process->LogTail()));
  }
  return absl::OkStatus();
}

std::vector<ChildProcess*> TestCluster::processes() {
  std::vector<ChildProcess*> out;
  for (auto& [name, task] : tasks_) {
    if (!task.process || !task.process->Running()) continue;
    // The chief first: "chief:0" sorts before "ps:*" and "worker:*" anyway.
    out.push_back(task.process.get());
  }
  return out;
}

void TestCluster::KillAll() {
  for (auto& [name, task] : tasks_) {
    if (task.process && task.process->Running()) {
      task.process->Signal(SIGKILL).IgnoreError();
      task.process->WaitForExit(absl::Seconds(10)).IgnoreError();
    }
  }
}

std::string TestCluster::Logs(int lines) {
  std::string out;
  for (auto& [name, task] : tasks_) {
    if (!task.process) continue;
    absl::StrAppend(&out, "---- ", name, " (", task.process->options().log_path, ")\n",
                    task.process->LogTail(lines), "\n");
  }
  return out;
}

}  // namespace pscluster
