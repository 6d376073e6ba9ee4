#include "client/cluster_client.h"

#include "client/grpc_ps_transport.h"
#include "client/tcp_ps_transport.h"
#include "glog/logging.h"
#include "security/wire_tls.h"

namespace pscluster {

std::unique_ptr<PsTransport> NewPsTransport(const std::vector<std::string>& addresses,
                                            bool tensor_wire, const TlsConfig& tls) {
  GrpcPsTransportOptions options;
  options.tls = tls;
  auto grpc = std::make_unique<GrpcPsTransport>(addresses, options);
  if (!tensor_wire) return grpc;
  TcpPsTransportOptions tcp;
  if (tls.enabled()) {
    absl::StatusOr<std::shared_ptr<WireTlsContext>> context =
        WireTlsContext::Create(tls, WireTlsContext::Side::kClient);
    if (!context.ok()) {
      // The gRPC channels refuse the same files and say why; the data plane is not used.
      LOG(WARNING) << "the tensor data plane is not used: " << context.status();
      return grpc;
    }
    tcp.tls = *std::move(context);
  }
  return std::make_unique<TcpPsTransport>(std::move(grpc), addresses, tcp);
}

}  // namespace pscluster
