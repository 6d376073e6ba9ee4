#include "chief/chief_server.h"

#include "chief/chief_metrics.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"
#include "evaluator/evaluation.h"
#include "glog/logging.h"
#include "runtime/metrics.h"

namespace pscluster {
namespace {

constexpr absl::Duration kShutdownDrain = absl::Milliseconds(500);

}  // namespace

absl::StatusOr<std::unique_ptr<ChiefServer>> ChiefServer::Create(const ChiefOptions& options) {
  CoordinatorOptions core_options = options;
  core_options.clock = Clock::Real();
  if (!core_options.evaluate) {
    core_options.evaluate = TestSetEvaluation(options.config, options.training.data());
  }
  GrpcPsTransportOptions transport = options.ps_transport;
  transport.tls = options.host.tls;
  core_options.make_ps_transport = [transport](const std::vector<std::string>& addresses)
      -> absl::StatusOr<std::unique_ptr<PsTransport>> {
    return std::make_unique<GrpcPsTransport>(addresses, transport);
  };
  PS_ASSIGN_OR_RETURN(Authorizer authorizer,
                      AuthorizerForTask(options.host.tls, options.cluster.task()));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Coordinator> core, Coordinator::Create(core_options));
  return std::unique_ptr<ChiefServer>(
      new ChiefServer(options, std::move(core), std::move(authorizer)));
}

ChiefServer::ChiefServer(const ChiefOptions& options, std::unique_ptr<Coordinator> core,
                         Authorizer authorizer)
    : options_(options),
      core_(std::move(core)),
      service_(core_.get(), Clock::Real(), std::move(authorizer)) {}

ChiefServer::~ChiefServer() {
  if (options_.host.metrics != nullptr) options_.host.metrics->RemoveCollectors();
  core_->Stop();
  core_->Join();
  if (host_) host_->Shutdown();
}

absl::Status ChiefServer::Start() {
  ServiceHostOptions host_options = options_.host;
  // Every handler of the chief returns within 200 ms of Stop() (long waits are sliced), so the
  // server needs little time to drain; with the default 2 s, gRPC's Shutdown waited the whole
  // grace on every SIGTERM with no handler running (seen in gdb), and the chief overran a 2 s
  // termination grace period.
  host_options.shutdown_grace = std::min(host_options.shutdown_grace, kShutdownDrain);
  PS_ASSIGN_OR_RETURN(host_options.address, TaskAddress(options_.cluster.cluster(), kChiefJob, 0));
  if (options_.host.metrics != nullptr) {
    const Coordinator* core = core_.get();
    options_.host.metrics->AddCollector([core] { return ChiefMetricFamilies(*core); });
  }
  PS_ASSIGN_OR_RETURN(host_, ServiceHost::Start(host_options, {&service_}));
  LOG(INFO) << "chief:0 serving on " << host_->address();
  core_->set_address(host_->address());
  host_->SetServing(true);
  core_->Start();
  return absl::OkStatus();
}

void ChiefServer::Stop() { core_->Stop(); }

absl::Status ChiefServer::Wait() {
  core_->Join();
  LOG(INFO) << "chief:0: background work stopped; closing the RPC server";
  if (host_) host_->Shutdown();
  return absl::OkStatus();
}

std::string ChiefServer::address() const { return host_ ? host_->address() : ""; }

}  // namespace pscluster
