#include "client/cluster_client.h"

#include "client/grpc_ps_transport.h"
#include "client/tcp_ps_transport.h"

namespace pscluster {

std::unique_ptr<PsTransport> NewPsTransport(const std::vector<std::string>& addresses,
                                            bool tensor_wire) {
  auto grpc = std::make_unique<GrpcPsTransport>(addresses, GrpcPsTransportOptions());
  if (!tensor_wire) return grpc;
  return std::make_unique<TcpPsTransport>(std::move(grpc), addresses, TcpPsTransportOptions());
}

}  // namespace pscluster
