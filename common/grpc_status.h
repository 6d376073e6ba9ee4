#ifndef PSCLUSTER_COMMON_GRPC_STATUS_H_
#define PSCLUSTER_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"

namespace pscluster {

// The one place where absl::Status and grpc::Status are converted. Codes map one to one
// (both use the canonical code space); messages are kept.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace pscluster

// In a gRPC handler: evaluates `expr` (an absl::Status) and returns it as a grpc::Status if
// it is not OK.
#define PS_RETURN_IF_ERROR_GRPC(expr)                                             \
  do {                                                                            \
    ::absl::Status ps_grpc_status_ = (expr);                                      \
    if (!ps_grpc_status_.ok()) return ::pscluster::ToGrpcStatus(ps_grpc_status_); \
  } while (0)

#endif  // PSCLUSTER_COMMON_GRPC_STATUS_H_
