#include "client/cluster_client.h"

#include "client/grpc_ps_transport.h"
#include "client/tcp_ps_transport.h"

namespace pscluster {

std::unique_ptr<PsTransport> NewPsTransport(const std::vector<std::string>& addresses,
                                            bool tensor_wire, const TlsConfig& tls) {
  GrpcPsTransportOptions options;
  options.tls = tls;
  auto grpc = std::make_unique<GrpcPsTransport>(addresses, options);
  if (!tensor_wire || tls.enabled()) return grpc;
  return std::make_unique<TcpPsTransport>(std::move(grpc), addresses, TcpPsTransportOptions());
}

}  // namespace pscluster
