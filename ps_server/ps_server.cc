#include "ps_server/ps_server.h"

#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Create(const PsServerOptions& options) {
  if (options.cluster.task().job() != kPsJob) {
    return absl::InvalidArgumentError(
        absl::StrCat("ps_server must run as a ps task, not ", TaskName(options.cluster.task())));
  }
  return std::unique_ptr<PsServer>(new PsServer(options));
}

PsServer::PsServer(const PsServerOptions& options)
    : options_(options), store_(options.store), service_(&store_, options.service) {}

PsServer::~PsServer() {
  if (task_) task_->Shutdown();
}

absl::Status PsServer::Start() {
  ServingTaskOptions serving;
  serving.cluster = options_.cluster;
  serving.host = options_.host;
  serving.heartbeat_interval = options_.heartbeat_interval;
  PS_ASSIGN_OR_RETURN(task_, ServingTask::Start(serving, {&service_}));
  service_.SetIdentity(options_.cluster.task(), task_->address());
  return absl::OkStatus();
}

void PsServer::Stop() {
  if (task_) task_->RequestStop();
}

absl::Status PsServer::Wait() {
  if (!task_) return absl::FailedPreconditionError("ps_server was not started");
  task_->AwaitStopRequested();
  task_->Shutdown();
  return absl::OkStatus();
}

}  // namespace pscluster
