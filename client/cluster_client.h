#ifndef PSCLUSTER_CLIENT_CLUSTER_CLIENT_H_
#define PSCLUSTER_CLIENT_CLUSTER_CLIENT_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/ps_transport.h"
#include "proto/coordinator_service.grpc.pb.h"

namespace pscluster {

// What a worker or the evaluator does first: asks the chief for the model (GetModel with
// wait_until_ready, 2 s at a time) until it is ready. CANCELLED once `stopped()` is true.
absl::StatusOr<v1::GetModelResponse> AwaitModel(v1::Coordinator::StubInterface& chief,
                                                const std::function<bool()>& stopped);

// The transport to the ps tasks at `addresses` (their gRPC addresses): the tensor wire over
// gRPC's control plane when `tensor_wire`, gRPC alone otherwise.
std::unique_ptr<PsTransport> NewPsTransport(const std::vector<std::string>& addresses,
                                            bool tensor_wire);

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_CLUSTER_CLIENT_H_
