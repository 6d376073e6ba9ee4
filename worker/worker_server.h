#ifndef PSCLUSTER_WORKER_WORKER_SERVER_H_
#define PSCLUSTER_WORKER_WORKER_SERVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/serving_task.h"
#include "common/daemon.h"
#include "proto/worker_service.grpc.pb.h"

namespace pscluster {

struct WorkerOptions {
  // The cluster; the task must be a worker.
  v1::ClusterConfig cluster;
  // Server settings; `address` is taken from the cluster spec.
  ServiceHostOptions host;
  absl::Duration heartbeat_interval = absl::Seconds(1);
};

// The worker daemon: serves its status and registers with the chief.
//
// Lifecycle: Create() -> Start() -> Stop() (any thread) -> Wait(). Thread-safe.
class WorkerServer : public Daemon, private v1::Worker::Service {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Create(const WorkerOptions& options);
  ~WorkerServer() override;

  absl::Status Start() override;
  void Stop() override;
  absl::Status Wait() override;

 private:
  explicit WorkerServer(const WorkerOptions& options);

  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest* req,
                         v1::TaskStatus* resp) override;

  const WorkerOptions options_;
  const absl::Time start_time_;
  std::unique_ptr<ServingTask> task_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_WORKER_SERVER_H_
