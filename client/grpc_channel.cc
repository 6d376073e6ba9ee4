#include "client/grpc_channel.h"

#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"

namespace pscluster {

std::shared_ptr<grpc::Channel> NewGrpcChannel(const std::string& address,
                                              const GrpcChannelOptions& options) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  if (options.fast_reconnect) {
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  }
  if (!options.tls_server_name.empty()) args.SetSslTargetNameOverride(options.tls_server_name);
  return grpc::CreateCustomChannel(address, ChannelCredentialsFor(options.tls), args);
}

}  // namespace pscluster
