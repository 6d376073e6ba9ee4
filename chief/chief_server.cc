#include "chief/chief_server.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cluster_spec.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<ChiefServer>> ChiefServer::Create(const ChiefOptions& options) {
  if (options.cluster.task().job() != kChiefJob || options.cluster.task().index() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the chief must run as task chief:0, not ", TaskName(options.cluster.task())));
  }
  return std::unique_ptr<ChiefServer>(new ChiefServer(options));
}

ChiefServer::ChiefServer(const ChiefOptions& options)
    : options_(options),
      start_time_(absl::Now()),
      registry_(options.cluster.cluster(), options.heartbeat_timeout, Clock::Real()) {}

ChiefServer::~ChiefServer() {
  Stop();
  if (host_) host_->Shutdown();
}

absl::Status ChiefServer::Start() {
  ServiceHostOptions host_options = options_.host;
  PS_ASSIGN_OR_RETURN(host_options.address,
                      TaskAddress(options_.cluster.cluster(), kChiefJob, 0));
  PS_ASSIGN_OR_RETURN(host_, ServiceHost::Start(host_options, {this}));
  LOG(INFO) << "chief:0 serving on " << host_->address();
  host_->SetServing(true);
  return absl::OkStatus();
}

void ChiefServer::Stop() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
}

absl::Status ChiefServer::Wait() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&stop_requested_));
  }
  if (host_) host_->Shutdown();
  return absl::OkStatus();
}

std::string ChiefServer::address() const { return host_ ? host_->address() : ""; }

grpc::Status ChiefServer::RegisterTask(grpc::ServerContext*, const v1::RegisterTaskRequest* req,
                                       v1::RegisterTaskResponse* resp) {
  PS_RETURN_IF_ERROR_GRPC(registry_.Register(req->task(), req->address(), req->incarnation()));
  resp->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return grpc::Status::OK;
}

grpc::Status ChiefServer::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                                    v1::HeartbeatResponse* resp) {
  absl::StatusOr<bool> known =
      registry_.Heartbeat(req->task(), req->incarnation(), req->step(), req->detail());
  if (!known.ok()) return ToGrpcStatus(known.status());
  resp->set_reregister(!*known);
  return grpc::Status::OK;
}

grpc::Status ChiefServer::GetClusterStatus(grpc::ServerContext*,
                                           const v1::GetClusterStatusRequest*,
                                           v1::ClusterStatus* resp) {
  const absl::Time now = absl::Now();
  for (v1::TaskStatus& t : registry_.Snapshot()) {
    if (t.task().job() == kChiefJob) {
      // The chief does not heartbeat itself: if it answers, it is serving.
      t.set_address(address());
      t.set_health(v1::HEALTH_SERVING);
      t.set_start_unix_micros(absl::ToUnixMicros(start_time_));
      t.set_uptime_micros(absl::ToInt64Microseconds(now - start_time_));
    }
    *resp->add_tasks() = std::move(t);
  }
  std::vector<v1::TaskId> missing = registry_.NotServing();
  std::vector<std::string> names;
  for (const v1::TaskId& t : missing) {
    if (t.job() == kChiefJob) continue;
    names.push_back(TaskName(t));
    *resp->add_waiting_for() = t;
  }
  resp->set_state(names.empty() ? "all tasks serving"
                                : absl::StrCat("waiting for ", absl::StrJoin(names, ", ")));
  return grpc::Status::OK;
}

}  // namespace pscluster
