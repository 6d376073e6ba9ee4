#ifndef PSCLUSTER_TESTING_TEST_CLUSTER_H_
#define PSCLUSTER_TESTING_TEST_CLUSTER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "security/tls.h"
#include "testing/child_process.h"

namespace pscluster {

struct TestClusterOptions {
  int num_ps = 2;
  int num_workers = 2;
  // 1: an evaluator task too (evaluator:0), started last.
  int num_evaluators = 0;
  // Extra command-line flags for every task of a job ("chief", "ps", "worker"), and for one
  // task ("worker:2"), added after the job's.
  std::map<std::string, std::vector<std::string>> flags;
  // Where the binaries are; empty means this test's runfiles (the test's BUILD target lists
  // //chief:chief, //ps_server:ps_server and //worker:worker in `data`, and
  // //evaluator:evaluator with an evaluator).
  std::string binary_dir;
  // Logs and port files go here; empty means $TEST_UNDECLARED_OUTPUTS_DIR or $TEST_TMPDIR.
  std::string work_dir;
  // How long each task may take to report SERVING.
  absl::Duration start_timeout = absl::Seconds(30);
  // Mutual TLS: a directory of deploy/tls/make_certs.sh's files (ca.pem, <job>-<index>.pem and
  // .key, psctl-viewer.pem and .key). Each task is started with its own certificate, and the
  // cluster's own calls (health checks, ChiefStubOf) use psctl-viewer's. Empty: plaintext.
  std::string tls_dir;
};

// The TLS files of `holder` ("worker-0", "psctl-admin", ...) in a make_certs.sh directory.
TlsConfig TlsFilesOf(const std::string& dir, const std::string& holder);

// A real cluster for multi-process tests: the chief, ps_server and worker binaries started as
// child processes on 127.0.0.1 with port 0. The chief starts first; its real port (read back
// from --port_file) goes into the TF_CONFIG of every other task, whose own entries stay at
// port 0: each binds a free port and registers its real address with the chief.
//
// Start() returns once every task answers the standard gRPC health check with SERVING. The
// destructor kills every process still running (SIGKILL) and reaps it, also when the test
// failed. Thread-compatible.
class TestCluster {
 public:
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start(const TestClusterOptions& options);
  ~TestCluster();

  ChildProcess& chief() { return *tasks_.at("chief:0").process; }
  ChildProcess& ps(int i) { return *tasks_.at("ps:" + std::to_string(i)).process; }
  ChildProcess& worker(int i) { return *tasks_.at("worker:" + std::to_string(i)).process; }
  ChildProcess& evaluator() { return *tasks_.at("evaluator:0").process; }
  // Every running task, the chief first.
  std::vector<ChildProcess*> processes();

  // host:port where a task really serves ("chief:0", "ps:1", ...).
  std::string address(const std::string& task) const { return tasks_.at(task).address; }
  std::string chief_address() const { return address("chief:0"); }
  // The cluster spec that the non-chief tasks were given.
  const v1::ClusterSpec& spec() const { return spec_; }
  const std::string& work_dir() const { return work_dir_; }
  // What the cluster's own calls use: psctl-viewer's certificate under tls_dir, or plaintext.
  const TlsConfig& client_tls() const { return client_tls_; }

  // (Re)starts one task (e.g. after killing it) and waits until it is SERVING. A restarted
  // task binds the address it had, or with same_address false (not for the chief, whose
  // address the others are given) a new port, as a rescheduled pod gets a new IP.
  absl::Status StartTask(const std::string& job, int index, bool same_address = true);

  // Replaces the extra flags of a job or task (a key of TestClusterOptions::flags) for the
  // tasks started from now on, e.g. to restart without a fault-injection flag.
  void SetFlags(const std::string& key, std::vector<std::string> flags) {
    options_.flags[key] = std::move(flags);
  }

  // Kills every task with SIGKILL. Also done by the destructor.
  void KillAll();

  // The last lines of every task's log, for failure messages.
  std::string Logs(int lines = 20);

 private:
  struct Task {
    std::unique_ptr<ChildProcess> process;
    std::string address;
  };

  explicit TestCluster(const TestClusterOptions& options);
  std::string BinaryFor(const std::string& job) const;

  TestClusterOptions options_;
  std::string binary_dir_;
  std::string work_dir_;
  TlsConfig client_tls_;
  v1::ClusterSpec spec_;
  std::map<std::string, Task> tasks_;
  int starts_ = 0;
};

// The path of a data dependency of the running test (a file in its runfiles).
std::string RunfilePath(const std::string& path);

// A cluster that trains the softmax model in sync mode for as long as a test needs (1000
// epochs of 4000 examples, batch 20, workers pausing 10 ms a step, heartbeats every 200 ms),
// for tests that disturb training rather than finish it. Flags a test appends win. The test's
// BUILD target needs //configs in its data.
TestClusterOptions EndlessSyncTraining(int num_ps, int num_workers);

// The chief's flags of the recovery tests: the softmax model, 2 epochs of 12,000 examples in
// batches of 50 (240 steps a worker with 2 workers), a checkpoint every 40 steps into
// `checkpoint_dir`, heartbeats every 200 ms and a task MISSING after 1.5 s.
std::vector<std::string> RecoveryChiefFlags(const std::string& checkpoint_dir,
                                            const std::string& mode = "sync");

// The chief's GetClusterStatus (5 s deadline); CHECK-fails when the chief does not answer,
// which in a test is the failure to report.
v1::ClusterStatus ClusterStatusOf(v1::Coordinator::StubInterface& chief);

// A Coordinator stub for the cluster's chief (loopback; TLS as client_tls()).
std::unique_ptr<v1::Coordinator::Stub> ChiefStubOf(const TestCluster& cluster);

// The chief's GetModel once the model is ready (30 s deadline); CHECK-fails, with the
// cluster's logs, when it does not come.
v1::GetModelResponse ModelOf(TestCluster& cluster);

// Polls the chief's status until `done(status)` or `timeout`; returns the last status, which a
// test checks (the predicate's condition is false in it after a timeout).
v1::ClusterStatus AwaitStatus(v1::Coordinator::StubInterface& chief,
                              const std::function<bool(const v1::ClusterStatus&)>& done,
                              absl::Duration timeout = absl::Seconds(60));

// Waits until the chief reports a global step of at least `step`; false after `timeout`.
bool AwaitGlobalStep(v1::Coordinator::StubInterface& chief, int64_t step,
                     absl::Duration timeout = absl::Seconds(60));

// Calls grpc.health.v1.Health/Check on `address` until it answers SERVING or `timeout`
// passes. Returns UNAVAILABLE / DEADLINE_EXCEEDED naming the address otherwise.
absl::Status AwaitServing(const std::string& address, absl::Duration timeout,
                          const TlsConfig& tls = {});

// Reads a port written by --port_file, waiting up to `timeout` for it to appear; fails early
// if `process` exits.
absl::StatusOr<int> AwaitPortFile(const std::string& path, ChildProcess& process,
                                  absl::Duration timeout);

}  // namespace pscluster

#endif  // PSCLUSTER_TESTING_TEST_CLUSTER_H_
