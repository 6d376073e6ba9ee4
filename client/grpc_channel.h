#ifndef PSCLUSTER_CLIENT_GRPC_CHANNEL_H_
#define PSCLUSTER_CLIENT_GRPC_CHANNEL_H_

#include <memory>
#include <string>

#include "grpcpp/channel.h"
#include "security/tls.h"

namespace pscluster {

// Settings every channel of the cluster shares, whichever daemon or tool dials it.
struct GrpcChannelOptions {
  // Mutual TLS with this process's certificate; plaintext when not enabled.
  TlsConfig tls;
  // Largest message sent or received, in bytes (the daemons' --max_message_bytes default).
  int max_message_bytes = 64 << 20;
  // Reconnect within 100 ms to 1 s instead of gRPC's default backoff (1 s growing to 120 s):
  // for peers that restart at the same address, as ps tasks do.
  bool fast_reconnect = false;
  // With TLS: the name the server's certificate must carry, when it is not the address's host
  // (a probe inside a pod dials 127.0.0.1 but the certificate names the pod's DNS name).
  std::string tls_server_name;
};

// A channel to `address` (host:port) with these settings.
std::shared_ptr<grpc::Channel> NewGrpcChannel(const std::string& address,
                                              const GrpcChannelOptions& options);

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_GRPC_CHANNEL_H_
