#ifndef PSCLUSTER_PS_SERVER_PS_SERVER_H_
#define PSCLUSTER_PS_SERVER_PS_SERVER_H_

#include <memory>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "ps_server/parameter_store.h"
#include "ps_server/ps_service.h"
#include "ps_server/remote_push_forwarder.h"
#include "ps_server/tensor_server.h"
#include "runtime/daemon.h"
#include "runtime/serving_task.h"

namespace pscluster {

struct PsServerOptions {
  // The cluster; the task must be a ps task.
  v1::ClusterConfig cluster;
  // Server settings; `address` is taken from the cluster spec.
  ServiceHostOptions host;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Stop (exit 3) once the chief has not answered for this long (ServingTaskOptions).
  absl::Duration give_up_on_chief_after = absl::InfiniteDuration();
  ParameterStoreOptions store;
  PsServiceOptions service;
  // The tensor data plane (pulls and pushes over TCP, beside gRPC). Its host is taken from the
  // task's address (a numeric host as given, a name: every interface); its port is
  // data_plane.port (0: any free one), which GetStatus reports. With host.tls it is mutual TLS
  // with the same certificates and roles as gRPC.
  bool serve_data_plane = true;
  TensorServerOptions data_plane;
  // With TLS: hand the data plane's record encryption to the kernel (kTLS) where it can.
  bool data_plane_kernel_tls = false;
};

// The ps daemon: holds shards of the model's variables (see ParameterServer in
// proto/ps_service.proto), serves them, and registers with the chief.
//
// Lifecycle: Create() -> Start() -> Stop() (any thread) -> Wait(). Thread-safe.
class PsServer : public Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<PsServer>> Create(const PsServerOptions& options);
  ~PsServer() override;

  absl::Status Start() override;
  void Stop() override;
  absl::Status Wait() override;

 private:
  PsServer(const PsServerOptions& options, std::unique_ptr<RemotePushForwarder> forwarder);

  const PsServerOptions options_;
  // Forwards the updates of shards with a backup (issue 37); before store_, which uses it.
  const std::unique_ptr<RemotePushForwarder> forwarder_;
  ParameterStore store_;
  PsService service_;
  std::unique_ptr<TensorServer> data_plane_;
  std::unique_ptr<ServingTask> task_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_PS_SERVER_H_
