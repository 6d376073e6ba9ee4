#ifndef PSCLUSTER_CLI_STATUS_COMMAND_H_
#define PSCLUSTER_CLI_STATUS_COMMAND_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/coordinator_service.grpc.pb.h"

namespace pscluster {

// `psctl status`: every task as the chief sees it. Returns the text to print: an aligned
// table, or JSON when `json` is set. UNAVAILABLE (naming the chief) when it cannot be reached.
absl::StatusOr<std::string> RunStatusCommand(v1::Coordinator::StubInterface& chief,
                                             const std::string& chief_address, bool json);

// The table form of a ClusterStatus.
std::string FormatClusterStatus(const v1::ClusterStatus& status);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_STATUS_COMMAND_H_
