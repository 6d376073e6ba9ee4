#ifndef PSCLUSTER_CLI_WATCH_COMMAND_H_
#define PSCLUSTER_CLI_WATCH_COMMAND_H_

#include <ostream>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/chief_client.h"
#include "proto/coordinator_service.pb.h"

namespace pscluster {

// One progress line: elapsed time, step, epoch, examples/s, loss, latest test accuracy.
std::string FormatProgress(const v1::ClusterStatus& status);

// `psctl watch`: prints a progress line every `interval` until the chief reports training
// finished, then "final test accuracy: 0.XXXX" and where the metrics are. UNAVAILABLE when the
// chief stays unreachable for `give_up_after`.
absl::Status RunWatchCommand(ChiefClient& chief, absl::Duration interval,
                             absl::Duration give_up_after, std::ostream& out);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_WATCH_COMMAND_H_
