#ifndef PSCLUSTER_CLI_CKPT_COMMAND_H_
#define PSCLUSTER_CLI_CKPT_COMMAND_H_

#include <string>

#include "cli/command_output.h"
#include "cli/psctl_report.pb.h"

namespace pscluster {

// `psctl ckpt list|show|verify`: checkpoints on disk, offline (no cluster needed). PATH may be
// a checkpoint (DIR/ckpt-0000000120) or a directory of checkpoints, whose newest committed
// one is taken (ResolveCheckpointPath).

// `ckpt list DIR`: the committed checkpoints under DIR, newest first, with step, time, ps
// tasks, shards and bytes (DIR itself when it is one). NOT_FOUND when DIR cannot be listed; a
// manifest that cannot be read leaves its row's `error` set and makes the status DATA_LOSS.
CommandOutput RunCheckpointListCommand(const std::string& dir, OutputFormat format);

// `ckpt show PATH`: the manifest: step, time, mode, placement, the model's variables and
// tables, and every shard with its file, rows, bytes and checksum. JSON is the manifest.
CommandOutput RunCheckpointShowCommand(const std::string& path, OutputFormat format);

// `ckpt verify PATH`: reads every shard of the manifest and checks it against its checksum
// (and a table part's row count). Every shard gets a line; the status is DATA_LOSS (or the
// first other error) naming each bad shard and its file, OK when all pass.
CommandOutput RunCheckpointVerifyCommand(const std::string& path, OutputFormat format);
psctl::CheckpointVerifyReport VerifyCheckpointShards(const std::string& path, absl::Status* status);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_CKPT_COMMAND_H_
