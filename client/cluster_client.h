#ifndef PSCLUSTER_CLIENT_CLUSTER_CLIENT_H_
#define PSCLUSTER_CLIENT_CLUSTER_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/ps_transport.h"
#include "security/tls.h"

namespace pscluster {

// The transport to the ps tasks at `addresses` (their gRPC addresses): the tensor wire over
// gRPC's control plane when `tensor_wire`, gRPC alone otherwise. With TLS both planes use
// mutual TLS with the same certificates.
std::unique_ptr<PsTransport> NewPsTransport(const std::vector<std::string>& addresses,
                                            bool tensor_wire, const TlsConfig& tls = {});

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_CLUSTER_CLIENT_H_
