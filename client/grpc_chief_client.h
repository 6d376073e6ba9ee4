#ifndef PSCLUSTER_CLIENT_GRPC_CHIEF_CLIENT_H_
#define PSCLUSTER_CLIENT_GRPC_CHIEF_CLIENT_H_

#include <memory>
#include <string>

#include "client/chief_client.h"
#include "client/grpc_channel.h"

namespace pscluster {

// A ChiefClient over gRPC to the chief daemon at `address` ("host:port"). Errors name the
// chief: "cannot reach the chief at ADDRESS: ..." when the call did not get an answer in time
// or the connection failed, "chief at ADDRESS: ..." for the chief's own refusals (their codes
// kept). `channel` carries TLS and the message size limit.
std::unique_ptr<ChiefClient> NewGrpcChiefClient(const std::string& address,
                                                const ChiefClientOptions& options = {},
                                                const GrpcChannelOptions& channel = {});

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_GRPC_CHIEF_CLIENT_H_
