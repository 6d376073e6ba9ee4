#ifndef PSCLUSTER_CHIEF_CHECKPOINT_MANAGER_H_
#define PSCLUSTER_CHIEF_CHECKPOINT_MANAGER_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/parameter_client.h"
#include "common/clock.h"
#include "proto/cluster.pb.h"
#include "proto/coordinator_service.pb.h"
#include "proto/model_config.pb.h"
#include "proto/ps_service.pb.h"
#include "storage/crash_points.h"

namespace pscluster {

struct CheckpointManagerOptions {
  // Where checkpoints and the recovery record live. Required.
  std::string dir;
  // Committed checkpoints kept; older ones are deleted after each commit (but for those the
  // kept ones build on).
  int keep = 3;
  // A full checkpoint every this many; those in between are incremental (the table rows
  // changed since the checkpoint before, and the keys removed: storage/checkpoint.h), each
  // building on the ones since the last full one. 1: every checkpoint is full. The first
  // checkpoint of a manager, and the first after a restore or a failed save, is full.
  int full_every = 1;
  // Recorded in every manifest beside the model and the placement.
  v1::ModelConfig config;
  v1::SyncOptions sync;
  v1::ClusterSpec cluster;
  // This chief's fencing epoch (common/chief_epoch.h): once a newer one is recorded in `dir`,
  // the manager writes nothing there (0: not checked).
  int64_t chief_epoch = 0;
  // Fault injection (the chief's --crash_at). Not owned; may be null.
  CrashPoints* crash_points = nullptr;
  // Not owned; never null.
  Clock* clock = Clock::Real();
};

// The chief's checkpoints: writes and commits them, lists and restores them (falling back to
// older ones when the newest does not restore), and keeps the recovery record (a
// RecoveryIntent beside the checkpoints) that lets a chief which dies in the middle of a
// restore have its successor redo it. It knows nothing of workers or steps: the caller holds
// the workers at a step boundary before Save and before a restore.
//
// A manager whose chief has been replaced (CheckStillChief) leaves the directory alone.
//
// Thread-compatible for Save and the restores (the chief runs one at a time); last() and
// Committed() are thread-safe.
class CheckpointManager {
 public:
  // `client` is not owned and must outlive the manager.
  CheckpointManager(const CheckpointManagerOptions& options, ParameterClient* client);

  // Saves every shard as the checkpoint of `step` and commits it (its manifest written and
  // synced), then deletes the oldest beyond `keep`. When step's checkpoint is committed
  // already: in SYNC mode (the model is a function of the step) that one is answered; in the
  // other modes (updates without a step) a new one, `step-<sequence>`, is written. A model
  // missing a partition or a table part (a ps task restarted) is not committed
  // (FAILED_PRECONDITION); errors of the ps tasks and of the files as they come.
  absl::StatusOr<v1::CheckpointResponse> Save(int64_t step, const std::string& reason);

  // Save in two halves, so that the workers are held only for the first: Cut has every ps
  // task copy its shards at this moment (pushes are applied again as soon as it returns) and
  // write them in the background; Commit waits for the writes and commits as Save. Errors as
  // Save's; a checkpoint whose Cut or Commit failed is removed.
  struct PendingCheckpoint {
    v1::CheckpointResponse response;  // its step and path
    bool committed = false;           // SYNC: this step's checkpoint exists (the response)
    std::string reason;
    absl::Time start;
    // An incremental checkpoint: the names of those it builds on, oldest (full) first.
    std::vector<std::string> chain;
  };
  absl::StatusOr<PendingCheckpoint> Cut(int64_t step, const std::string& reason);
  // Before Cut, while training goes on: every ps task makes the memory its cut will copy into
  // (SaveShardsRequest.phase SAVE_PREPARE), so that the cut, with the workers held, only
  // copies. Optional: a Cut without it makes that memory itself.
  absl::Status Prepare();
  absl::StatusOr<v1::CheckpointResponse> Commit(const PendingCheckpoint& pending);

  // The committed checkpoints, newest first; NOT_FOUND when there is none.
  absl::StatusOr<std::vector<std::string>> Committed() const;
  bool HasCheckpoint() const { return Committed().ok(); }
  // The path of the last checkpoint this manager committed ("" if none).
  std::string last() const;

  // Restores the newest committed checkpoint that verifies into every ps task, falling back to
  // older ones. Sync accumulators continue at `accumulator_step` (or the checkpoint's step when
  // < 0). Returns the checkpoint's step; NOT_FOUND when there is none, DATA_LOSS when none
  // restores, UNAVAILABLE (or CANCELLED) when a ps task cannot be reached. With an `intent`,
  // the recovery record is rewritten before a fallback to an older checkpoint.
  absl::StatusOr<int64_t> RestoreLatest(int64_t accumulator_step,
                                        v1::RecoveryIntent* intent = nullptr);

  // Brings every ps task to the newest checkpoint as one recorded operation: writes the
  // recovery record (`why`, `step_before`), re-creates lost shards held until restored, then
  // RestoreLatest. The caller moves the global step and then calls FinishRecovery; until then a
  // chief that starts finds the record (UnfinishedRecovery) and redoes it. Errors as
  // RestoreLatest's (after DATA_LOSS the held shards are released); after UNAVAILABLE and the
  // others the record stays.
  absl::StatusOr<int64_t> RestoreEveryPs(const std::vector<std::string>& why, int64_t step_before,
                                         int64_t accumulator_step);
  // Deletes the recovery record: the recovery is complete. The SupersededChiefError of
  // CheckStillChief (nothing deleted); a file error is only logged (the next chief would
  // restore again).
  absl::Status FinishRecovery();
  // OK while no chief newer than this one has recorded its epoch in the directory; otherwise
  // the SupersededChiefError Save, RestoreEveryPs and FinishRecovery give before they write.
  absl::Status CheckStillChief() const;
  // The record of a recovery a chief started and did not finish: NOT_FOUND when there is
  // none, DATA_LOSS when it is unreadable.
  absl::StatusOr<v1::RecoveryIntent> UnfinishedRecovery() const;

 private:
  // Writes the recovery record, unless a newer chief has started (CheckStillChief).
  absl::Status RecordRecovery(const v1::RecoveryIntent& intent);

  // The chain the next checkpoint builds on: empty when it must be full.
  std::vector<std::string> NextChain() const;
  // The next checkpoint is full (a save failed, or the ps tasks were restored).
  void BreakChain();

  const CheckpointManagerOptions options_;
  ParameterClient* const client_;
  mutable absl::Mutex mu_;
  std::string last_ ABSL_GUARDED_BY(mu_);
  // The chain of the last checkpoint this manager committed, itself last: the checkpoints the
  // next incremental one builds on. Empty: the next one is full.
  std::vector<std::string> chain_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_CHECKPOINT_MANAGER_H_
