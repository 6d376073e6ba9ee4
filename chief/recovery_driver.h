#ifndef PSCLUSTER_CHIEF_RECOVERY_DRIVER_H_
#define PSCLUSTER_CHIEF_RECOVERY_DRIVER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chief/checkpoint_manager.h"
#include "client/parameter_client.h"
#include "proto/ps_service.pb.h"

namespace pscluster {

// Brings the ps tasks back to one consistent model: after ps tasks restarted empty, and when
// a chief starts on a cluster it cannot trust (new variables, a recovery record left by the
// chief before it, a task still waiting for a restore). It decides what to restore, records it
// first (CheckpointManager::RestoreEveryPs) and falls back to initial values when there is
// nothing to restore. It neither holds the workers nor moves the global step: the coordinator
// does that around it, and calls Finish() once the step has moved, which deletes the record.
// Thread-compatible (the coordinator runs one recovery at a time).
class RecoveryDriver {
 public:
  struct Result {
    // The ps tasks hold a consistent model again (Finish() is due).
    bool done = false;
    // The step of the checkpoint restored; -1 when nothing was.
    int64_t restored_step = -1;
    // What happened, in words, for the log.
    std::string summary;
    // Why it is not done (tried again later), or OK.
    absl::Status error;
  };

  // `checkpoints` is null without a checkpoint directory. Neither is owned; both must outlive
  // the driver.
  RecoveryDriver(CheckpointManager* checkpoints, ParameterClient* client,
                 const v1::SyncOptions& sync)
      : checkpoints_(checkpoints), client_(client), sync_(sync) {}

  // The tasks named in `restarted` came back empty, with the workers held at global step
  // `step_before`. Every ps task goes back to the newest checkpoint that restores; with
  // `rewind` (sync mode) the accumulators continue at the checkpoint's step, otherwise at
  // step_before. Without a checkpoint the lost shards start again from their initial values.
  Result AfterRestart(const std::vector<std::string>& restarted, int64_t step_before, bool rewind);

  // At the chief's start, after creating the variables (`fresh` of them new, `awaiting` the
  // tasks still waiting for a restore): why every ps task must be restored, empty when the
  // cluster's state can be trusted (or there is no checkpoint to restore).
  std::vector<std::string> ReasonsToRestoreAtStart(int64_t fresh,
                                                   const std::vector<int>& awaiting) const;
  // Restores every ps task to the newest checkpoint for `why`: its step, or -1 when no
  // checkpoint restores (DATA_LOSS: the tasks keep what they hold; Finish() is still due).
  // Other errors as CheckpointManager::RestoreEveryPs.
  absl::StatusOr<int64_t> RestoreAtStart(const std::vector<std::string>& why);

  // The recovery is complete: the record is deleted (see CheckpointManager::FinishRecovery).
  absl::Status Finish();

 private:
  CheckpointManager* const checkpoints_;
  ParameterClient* const client_;
  const v1::SyncOptions sync_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_RECOVERY_DRIVER_H_
