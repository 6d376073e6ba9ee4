#include "worker/worker_server.h"

#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(const WorkerOptions& options) {
  if (options.cluster.task().job() != kWorkerJob) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the worker must run as a worker task, not ", TaskName(options.cluster.task())));
  }
  return std::unique_ptr<WorkerServer>(new WorkerServer(options));
}

WorkerServer::WorkerServer(const WorkerOptions& options)
    : options_(options), start_time_(absl::Now()) {}

WorkerServer::~WorkerServer() {
  if (task_) task_->Shutdown();
}

absl::Status WorkerServer::Start() {
  ServingTaskOptions serving;
  serving.cluster = options_.cluster;
  serving.host = options_.host;
  serving.heartbeat_interval = options_.heartbeat_interval;
  PS_ASSIGN_OR_RETURN(task_, ServingTask::Start(serving, {this}));
  return absl::OkStatus();
}

void WorkerServer::Stop() {
  if (task_) task_->RequestStop();
}

absl::Status WorkerServer::Wait() {
  if (!task_) return absl::FailedPreconditionError("the worker was not started");
  task_->AwaitStopRequested();
  task_->Shutdown();
  return absl::OkStatus();
}

grpc::Status WorkerServer::GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                                     v1::TaskStatus* resp) {
  *resp->mutable_task() = options_.cluster.task();
  resp->set_address(task_->address());
  resp->set_health(v1::HEALTH_SERVING);
  resp->set_start_unix_micros(absl::ToUnixMicros(start_time_));
  resp->set_uptime_micros(absl::ToInt64Microseconds(absl::Now() - start_time_));
  resp->set_detail("idle");
  return grpc::Status::OK;
}

}  // namespace pscluster
