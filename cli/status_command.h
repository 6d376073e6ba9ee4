#ifndef PSCLUSTER_CLI_STATUS_COMMAND_H_
#define PSCLUSTER_CLI_STATUS_COMMAND_H_

#include <set>
#include <string>

#include "absl/time/time.h"
#include "cli/command_output.h"
#include "client/chief_client.h"
#include "proto/coordinator_service.pb.h"
#include "security/tls.h"

namespace pscluster {

struct StatusOptions {
  // Push and pull rates are measured over this window, between two samples of every task;
  // zero asks each task once and shows no rates.
  absl::Duration rate_window = absl::Seconds(1);
  // Deadline of each call to a task (the chief's are the ChiefClient's).
  absl::Duration rpc_timeout = absl::Seconds(5);
  OutputFormat format = OutputFormat::kTable;
  // Mutual TLS toward the tasks (security/tls.h); plaintext when not enabled.
  TlsConfig tls;
};

// `psctl status`: every task as the chief sees it (role, address, health, uptime, step), the
// global step and update mode, who the cluster waits for, and the recent push and pull rates
// of each task:
//   ps tasks: dense-shard and table updates received, and pulls served, per second (summed
//             over its shards, from ListShards);
//   workers:  model pushes and pulls sent per second, i.e. steps per second (a worker pulls
//             and pushes the model once a step; from Worker.GetStatus).
// JSON is the chief's ClusterStatus with the rates filled in.
//
// Every task the chief reports SERVING or MISSING is asked directly; one that does not answer
// makes the status UNAVAILABLE naming it, with the table still printed. UNAVAILABLE "cannot
// reach the chief at ADDRESS" (and no text) when the chief does not answer.
CommandOutput RunStatusCommand(ChiefClient& chief, const StatusOptions& options);

// The table form of a ClusterStatus. The push and pull rates of the tasks named in `measured`
// ("ps:0") are shown; the others' are "-".
std::string FormatClusterStatus(const v1::ClusterStatus& status,
                                const std::set<std::string>& measured = {});

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_STATUS_COMMAND_H_
