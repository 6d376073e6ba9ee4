#ifndef PSCLUSTER_STORAGE_CHECKPOINT_PATH_H_
#define PSCLUSTER_STORAGE_CHECKPOINT_PATH_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pscluster {

// Where a request's checkpoint lives: <checkpoint_dir>/<name>, for a name sent by a peer.
// Refused with INVALID_ARGUMENT naming the name: an empty name, an absolute one, one with '/',
// "." or "..", and one whose path exists but resolves (through links) outside checkpoint_dir.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& checkpoint_dir,
                                              const std::string& name);

// FAILED_PRECONDITION when the checkpoint at `path` is committed (has its manifest): a
// committed checkpoint is never written into again.
absl::Status CheckNotCommitted(const std::string& path);

// INVALID_ARGUMENT unless `file` names a ps task's part of a checkpoint ("ps-<index>").
absl::Status CheckShardFileName(const std::string& file);

}  // namespace pscluster

#endif  // PSCLUSTER_STORAGE_CHECKPOINT_PATH_H_
