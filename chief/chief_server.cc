#include "chief/chief_server.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/cluster_spec.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "client/parameter_client.h"
#include "glog/logging.h"
#include "sharding/placement.h"

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
  if (init_thread_.joinable()) init_thread_.join();
  if (host_) host_->Shutdown();
}

absl::Status ChiefServer::Start() {
  ServiceHostOptions host_options = options_.host;
  PS_ASSIGN_OR_RETURN(host_options.address,
                      TaskAddress(options_.cluster.cluster(), kChiefJob, 0));
  PS_ASSIGN_OR_RETURN(host_, ServiceHost::Start(host_options, {this}));
  LOG(INFO) << "chief:0 serving on " << host_->address();
  host_->SetServing(true);
  init_thread_ = std::thread([this] { InitializeModel(); });
  return absl::OkStatus();
}

bool ChiefServer::stop_requested() const {
  absl::MutexLock lock(&mu_);
  return stop_requested_;
}

void ChiefServer::InitializeModel() {
  const int num_ps = NumTasks(options_.cluster.cluster(), kPsJob);
  while (!registry_.AwaitServing({std::string(kPsJob)}, absl::Now() + absl::Milliseconds(200))) {
    if (stop_requested()) return;
  }
  std::vector<std::string> addresses;
  for (int i = 0; i < num_ps; ++i) {
    addresses.push_back(*registry_.AddressOf(MakeTaskId(kPsJob, i)));
  }
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(options_.model, num_ps, options_.placement);
  if (!placement.ok()) {
    LOG(ERROR) << "cannot place the model: " << placement.status();
    absl::MutexLock lock(&mu_);
    init_state_ = absl::StrCat("cannot place the model: ", placement.status().message());
    return;
  }
  LOG(INFO) << "placement of " << options_.model.variables_size() << " variables and "
            << options_.model.tables_size() << " tables on " << num_ps << " ps tasks:\n"
            << PlacementDebugString(*placement);
  {
    absl::MutexLock lock(&mu_);
    init_state_ = "creating variables on the ps tasks";
  }
  ParameterClientOptions client_options;
  client_options.max_attempts = 20;
  absl::StatusOr<std::unique_ptr<ParameterClient>> client = ParameterClient::Create(
      options_.model, *placement,
      std::make_unique<GrpcPsTransport>(addresses, options_.ps_transport), client_options);
  absl::Status created = client.ok() ? (*client)->CreateAll(options_.sync) : client.status();
  absl::MutexLock lock(&mu_);
  if (!created.ok()) {
    LOG(ERROR) << "cannot create the variables: " << created;
    init_state_ = absl::StrCat("cannot create the variables: ", created.message());
    return;
  }
  *model_.mutable_model() = options_.model;
  *model_.mutable_placement() = *placement;
  for (const std::string& a : addresses) model_.add_ps_addresses(a);
  *model_.mutable_sync() = options_.sync;
  model_ready_ = true;
  init_state_ = "model ready";
  LOG(INFO) << "every variable is created and initialized on its ps task";
}

grpc::Status ChiefServer::GetModel(grpc::ServerContext* ctx, const v1::GetModelRequest* req,
                                   v1::GetModelResponse* resp) {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return model_ready_ || stop_requested_;
  };
  while (req->wait_until_ready() && !done() && !ctx->IsCancelled() &&
         std::chrono::system_clock::now() < ctx->deadline()) {
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(100));
  }
  if (!model_ready_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("the model is not ready: ", init_state_));
  }
  *resp = model_;
  return grpc::Status::OK;
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
  if (init_thread_.joinable()) init_thread_.join();
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
  absl::MutexLock lock(&mu_);
  resp->set_state(names.empty()
                      ? absl::StrCat("all tasks serving; ", init_state_)
                      : absl::StrCat("waiting for ", absl::StrJoin(names, ", "), "; ", init_state_));
  return grpc::Status::OK;
}

}  // namespace pscluster
