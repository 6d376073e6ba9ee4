#include "client/cluster_client.h"

#include <chrono>

#include "client/grpc_ps_transport.h"
#include "client/tcp_ps_transport.h"
#include "grpcpp/client_context.h"

namespace pscluster {

absl::StatusOr<v1::GetModelResponse> AwaitModel(v1::Coordinator::StubInterface& chief,
                                                const std::function<bool()>& stopped) {
  v1::GetModelResponse model;
  while (!stopped()) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::GetModelRequest req;
    req.set_wait_until_ready(true);
    if (chief.GetModel(&ctx, req, &model).ok()) return model;
  }
  return absl::CancelledError("stopped while waiting for the chief's model");
}

std::unique_ptr<PsTransport> NewPsTransport(const std::vector<std::string>& addresses,
                                            bool tensor_wire) {
  auto grpc = std::make_unique<GrpcPsTransport>(addresses, GrpcPsTransportOptions());
  if (!tensor_wire) return grpc;
  return std::make_unique<TcpPsTransport>(std::move(grpc), addresses, TcpPsTransportOptions());
}

}  // namespace pscluster
