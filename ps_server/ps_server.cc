#include "ps_server/ps_server.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "ps_server/ps_metrics.h"
#include "runtime/metrics.h"
#include "runtime/service_host.h"
#include "security/tls.h"
#include "security/wire_tls.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<PsServer>> PsServer::Create(const PsServerOptions& options) {
  if (options.cluster.task().job() != kPsJob) {
    return absl::InvalidArgumentError(
        absl::StrCat("ps_server must run as a ps task, not ", TaskName(options.cluster.task())));
  }
  PsServerOptions with_authz = options;
  PS_ASSIGN_OR_RETURN(with_authz.service.authorizer,
                      AuthorizerForTask(options.host.tls, options.cluster.task()));
  auto forwarder =
      std::make_unique<RemotePushForwarder>(options.cluster.task().index(), options.host.tls);
  return std::unique_ptr<PsServer>(new PsServer(with_authz, std::move(forwarder)));
}

namespace {

ParameterStoreOptions WithForwarder(ParameterStoreOptions options, PushForwarder* forwarder) {
  options.forwarder = forwarder;
  return options;
}

PsServiceOptions WithAddressesTo(PsServiceOptions options, RemotePushForwarder* forwarder) {
  options.ps_addresses_changed = [forwarder](const std::vector<std::string>& addresses) {
    forwarder->SetAddresses(addresses);
  };
  return options;
}

}  // namespace

PsServer::PsServer(const PsServerOptions& options, std::unique_ptr<RemotePushForwarder> forwarder)
    : options_(options),
      forwarder_(std::move(forwarder)),
      store_(WithForwarder(options.store, forwarder_.get())),
      service_(&store_, WithAddressesTo(options.service, forwarder_.get())) {}

PsServer::~PsServer() {
  if (options_.host.metrics != nullptr) options_.host.metrics->RemoveCollectors();
  if (task_) task_->Shutdown();
  if (data_plane_) data_plane_->Shutdown();
}

namespace {

// The data plane binds what the gRPC server binds for the task's host (BindHostFor).
std::string DataPlaneHost(const std::string& address) {
  std::string host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return BindHostFor(host);
}

}  // namespace

absl::Status PsServer::Start() {
  if (options_.host.metrics != nullptr) {
    options_.host.metrics->AddCollector(
        [this] { return PsMetricFamilies(store_, service_.backups()); });
  }
  ServingTaskOptions serving;
  serving.cluster = options_.cluster;
  serving.host = options_.host;
  serving.heartbeat_interval = options_.heartbeat_interval;
  serving.give_up_on_chief_after = options_.give_up_on_chief_after;
  int data_port = 0;
  if (options_.serve_data_plane) {
    const v1::TaskId& task = options_.cluster.task();
    PS_ASSIGN_OR_RETURN(std::string address,
                        TaskAddress(options_.cluster.cluster(), task.job(), task.index()));
    TensorServerOptions data = options_.data_plane;
    data.host = DataPlaneHost(address);
    if (options_.host.tls.enabled()) {
      // Mutual TLS with the cluster's certificates, and every request checked against the
      // caller's role, as on gRPC.
      PS_ASSIGN_OR_RETURN(data.tls,
                          WireTlsContext::Create(options_.host.tls, WireTlsContext::Side::kServer,
                                                 options_.data_plane_kernel_tls));
      PS_ASSIGN_OR_RETURN(PeerIdentity own, OwnIdentity(options_.host.tls));
      data.cluster = own.cluster;
      data.kernel_tls_wanted = options_.data_plane_kernel_tls;
    }
    data.backups = service_.backups();
    PS_ASSIGN_OR_RETURN(data_plane_, TensorServer::Start(&store_, data));
    data_port = data_plane_->port();
  }
  // The data port is known before the first call can ask for it.
  service_.SetIdentity(options_.cluster.task(), "", data_port);
  // Replication's fencing: the chief's answers renew the lease on serving the task's shards.
  BackupStores* backups = service_.backups();
  serving.on_chief_answer = [backups](const TaskRegistrarOptions::Answer& a) {
    if (a.failed_over) backups->Fence();
    if (a.heartbeat_timeout > absl::ZeroDuration()) {
      backups->RenewLease(a.sent + a.heartbeat_timeout * 3 / 4);
    }
  };
  PS_ASSIGN_OR_RETURN(task_, ServingTask::Start(serving, {&service_}));
  service_.SetIdentity(options_.cluster.task(), task_->address(), data_port);
  if (data_plane_) {
    LOG(INFO) << TaskName(options_.cluster.task()) << " tensor data plane on port " << data_port
              << (options_.host.tls.enabled() ? " (mutual TLS)" : " (plaintext)");
  }
  return absl::OkStatus();
}

void PsServer::Stop() {
  if (task_) task_->RequestStop();
}

absl::Status PsServer::Wait() {
  if (!task_) return absl::FailedPreconditionError("ps_server was not started");
  task_->AwaitStopRequested();
  task_->Shutdown();
  if (data_plane_) data_plane_->Shutdown();
  LOG(INFO) << TaskName(options_.cluster.task()) << " stopped: " << store_.total_pushes()
            << " pushes applied to its own shards";
  return task_->exit_status();
}

}  // namespace pscluster
