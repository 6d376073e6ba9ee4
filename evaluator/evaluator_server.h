#ifndef PSCLUSTER_EVALUATOR_EVALUATOR_SERVER_H_
#define PSCLUSTER_EVALUATOR_EVALUATOR_SERVER_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/ps_follower.h"
#include "kernels/kernels.h"
#include "proto/cluster.pb.h"
#include "runtime/daemon.h"
#include "runtime/serving_task.h"

namespace pscluster {

struct EvaluatorOptions {
  // The cluster; the task must be evaluator:0.
  v1::ClusterConfig cluster;
  // Server settings (health only); `address` is taken from the cluster spec.
  ServiceHostOptions host;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Evaluate the live model this often while training, when the global step has moved.
  absl::Duration eval_every = absl::Seconds(15);
  // Instead (when > 0): evaluate whenever the global step has moved this many steps since the
  // last evaluation (half an epoch's steps, say, for time to accuracy), reading the chief's step
  // every 10 ms at most.
  int64_t eval_every_steps = 0;
  // How often the chief's phase and global step are read.
  absl::Duration poll_every = absl::Milliseconds(250);
  // Overrides the data path the chief names (the test set lives on the evaluator's host).
  std::string data_path;
  // Pull over the ps tasks' tensor data plane (true) or over gRPC.
  bool tensor_wire = true;
  // Exit (status 0) once training is over instead of idling until SIGTERM.
  bool exit_after_training = false;
  // Where the forward passes run: "cpu" or "gpu:N".
  std::string device = "cpu";
};

// The evaluator daemon, TF_CONFIG's `evaluator` task: registers with the chief, fetches the
// model from it, and evaluates the live parameters on the test set (forward passes on the CPU
// or a GPU, `device`): every `eval_every` (or `eval_every_steps`) while the global step moves,
// and once more at the final
// step when the chief asks for it (its FINAL_EVALUATION phase), which ends training. Each result
// goes to the chief (ReportEvaluation), which shows it in its status and metrics file; the
// chief computes nothing while an evaluator serves. A failure (a ps task moved, the chief
// restarted) starts over from the model fetch.
//
// Lifecycle: Create() -> Start() -> Stop() (any thread) -> Wait(). Thread-safe.
class EvaluatorServer : public Daemon {
 public:
  // INVALID_ARGUMENT unless the task is evaluator:0, or for a non-positive interval.
  static absl::StatusOr<std::unique_ptr<EvaluatorServer>> Create(const EvaluatorOptions& options);
  ~EvaluatorServer() override;

  absl::Status Start() override;
  void Stop() override;
  absl::Status Wait() override;

 private:
  EvaluatorServer(const EvaluatorOptions& options, int gpu);

  // Evaluates until training is over; starts over after a failure.
  void EvaluateLoop();
  // One run from the model fetch: OK once training is over (or a stop is requested).
  absl::Status EvaluateOnce();

  const EvaluatorOptions options_;
  const int gpu_;                         // options_.device's index; -1 for the CPU
  std::unique_ptr<Kernels> gpu_kernels_;  // gpu_'s, from Start
  // The heartbeat answers' failed-over tasks, to the evaluation's follower (before task_: its
  // registrar's thread uses it until task_ goes).
  FailoverWatch failovers_;
  std::unique_ptr<ServingTask> task_;
  std::atomic<int64_t> evaluated_step_{-1};
  std::atomic<bool> finished_{false};
};

}  // namespace pscluster

#endif  // PSCLUSTER_EVALUATOR_EVALUATOR_SERVER_H_
