#ifndef PSCLUSTER_CLI_SAVE_COMMAND_H_
#define PSCLUSTER_CLI_SAVE_COMMAND_H_

#include <string>

#include "absl/time/time.h"
#include "cli/command_output.h"
#include "client/chief_client.h"
#include "proto/coordinator_service.pb.h"

namespace pscluster {

// `psctl save`: asks the chief for a checkpoint now (Coordinator.Checkpoint) and returns once
// its manifest is committed, reporting its path, step, bytes and write time (JSON: the
// CheckpointResponse). The chief's status otherwise, with the chief named: UNAVAILABLE
// "cannot reach the chief at ...", UNIMPLEMENTED when that chief takes no checkpoints,
// DEADLINE_EXCEEDED after `timeout`.
CommandOutput RunSaveCommand(ChiefClient& chief, OutputFormat format);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_SAVE_COMMAND_H_
