#ifndef PSCLUSTER_CHIEF_CHIEF_SERVER_H_
#define PSCLUSTER_CHIEF_CHIEF_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "chief/coordinator.h"
#include "chief/coordinator_service.h"
#include "client/grpc_ps_transport.h"
#include "runtime/daemon.h"
#include "runtime/service_host.h"

namespace pscluster {

struct ChiefOptions : CoordinatorOptions {
  // Server settings; `address` is taken from the cluster spec.
  ServiceHostOptions host;
  // Settings of the chief's own calls to the ps tasks (the transport is gRPC; any
  // make_ps_transport given is replaced; TLS is host.tls).
  GrpcPsTransportOptions ps_transport;
};

// The chief daemon: a Coordinator served over gRPC on the chief's address from the cluster
// spec, calling the ps tasks over gRPC, on the real clock.
//
// Lifecycle: Create() -> Start() -> Stop() (any thread) -> Wait(). Thread-safe.
class ChiefServer : public Daemon {
 public:
  static absl::StatusOr<std::unique_ptr<ChiefServer>> Create(const ChiefOptions& options);
  ~ChiefServer() override;

  absl::Status Start() override;
  void Stop() override;
  absl::Status Wait() override;

  // The address actually served (valid after Start).
  std::string address() const;

 private:
  ChiefServer(const ChiefOptions& options, std::unique_ptr<Coordinator> core,
              Authorizer authorizer);

  const ChiefOptions options_;
  const std::unique_ptr<Coordinator> core_;
  CoordinatorService service_;
  std::unique_ptr<ServiceHost> host_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_CHIEF_SERVER_H_
