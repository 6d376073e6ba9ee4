#ifndef PSCLUSTER_WORKER_WORKER_SERVER_H_
#define PSCLUSTER_WORKER_WORKER_SERVER_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/chief_client.h"
#include "client/ps_follower.h"
#include "kernels/kernels.h"
#include "proto/model.pb.h"
#include "proto/worker_service.grpc.pb.h"
#include "runtime/daemon.h"
#include "runtime/serving_task.h"
#include "security/authz.h"

namespace pscluster {

struct WorkerOptions {
  // The cluster; the task must be a worker.
  v1::ClusterConfig cluster;
  // Server settings; `address` is taken from the cluster spec.
  ServiceHostOptions host;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // "cpu", "gpu:N" (N among the devices CUDA_VISIBLE_DEVICES exposes), or several GPUs
  // "gpu:0,gpu:1,..." whose towers split each batch and sum their gradients (NCCL).
  std::string device = "cpu";
  // ASYNC and SSP: how many of its own steps' pushes a step's parameters may miss (the step
  // pipeline's depth; 0: no overlap between steps). SYNC always uses 0.
  int pipeline_staleness = 1;
  // exit_after_training: how long the chief may not answer, after this worker's last step,
  // before the worker exits anyway.
  absl::Duration chief_gone_after = absl::Minutes(5);
  // Stop (exit 3) once the chief has not answered for this long, at any time
  // (ServingTaskOptions); chief_gone_after is the wait at the end of training.
  absl::Duration give_up_on_chief_after = absl::InfiniteDuration();
  // TrainerOptions::cuda_graphs.
  bool cuda_graphs = true;
  // Cap on the GPU memory this worker allocates, in bytes (0: no cap).
  int64_t gpu_memory_limit_bytes = 0;
  // Encoding of gradients and pulled values on the wire.
  v1::DataType wire_dtype = v1::DT_FLOAT32;
  // Pulls and pushes over the ps tasks' tensor data plane (true) or over gRPC.
  bool tensor_wire = true;
  // Overrides the data path the chief names (data lives on each worker's host).
  std::string data_path;
  // Exit (status 0) once training is done instead of idling until SIGTERM.
  bool exit_after_training = false;
  // Pause after every step (tests of slow workers).
  absl::Duration step_delay = absl::ZeroDuration();
  // How often an async worker reports its steps to the chief (TrainerOptions::report_every).
  absl::Duration report_every = absl::Seconds(2);
};

// The worker daemon: registers with the chief, fetches the model, the placement and the
// training options from it, and trains on its shard of the data, pulling from and pushing to
// the ps tasks. Serves its status over gRPC.
//
// Lifecycle: Create() -> Start() -> Stop() (any thread) -> Wait(). Thread-safe.
class WorkerServer : public Daemon, private v1::Worker::Service {
 public:
  // INVALID_ARGUMENT for a bad task or device name; FAILED_PRECONDITION when the GPU asked for
  // cannot be used (named, with the reason).
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(const WorkerOptions& options);
  ~WorkerServer() override;

  absl::Status Start() override;
  void Stop() override;
  absl::Status Wait() override;

 private:
  WorkerServer(const WorkerOptions& options, std::vector<std::unique_ptr<Kernels>> kernels,
               Authorizer authorizer);

  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest* req,
                         v1::TaskStatus* resp) override;
  // Fetches the model and trains; retries from the model fetch after a failure.
  void TrainLoop();
  // For GetStatus and heartbeats: training or finished, devices, staleness.
  std::string Detail() const;
  // Trains once from the chief's model; sets finished_step_ when the chief took the final report.
  absl::Status TrainOnce();
  // A client of the cluster's chief.
  absl::StatusOr<std::unique_ptr<ChiefClient>> ChiefOfCluster() const;
  // With exit_after_training, after this worker's last step: waits until the chief's status
  // says training is finished (it has taken the final checkpoint and evaluation), the chief
  // tells this task to stop, or the chief has not answered for chief_gone_after. A chief that
  // restarts before its final checkpoint then still finds the workers (it counts them finished
  // from their heartbeats, or has them redo steps it lost); one that finds them gone waits.
  void AwaitTrainingOver();

  const WorkerOptions options_;
  const absl::Time start_time_;
  const std::vector<std::unique_ptr<Kernels>> kernels_;  // one per tower
  const Authorizer authorizer_;
  // The heartbeat answers' failed-over tasks, to the follower of the training attempt
  // (before task_: its registrar's thread uses it until task_ goes).
  FailoverWatch failovers_;
  std::unique_ptr<ServingTask> task_;
  std::atomic<int64_t> steps_{0};
  std::atomic<int> max_staleness_{0};
  std::atomic<bool> finished_{false};
  // Once finished: the step of the final report (HeartbeatRequest.finished_step).
  std::atomic<int64_t> finished_step_{-1};
};

// Parses --device: "cpu" (an empty list) or "gpu:N[,gpu:M...]" (the GPU ordinals, distinct).
absl::StatusOr<std::vector<int>> ParseDevices(const std::string& device);

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_WORKER_SERVER_H_
