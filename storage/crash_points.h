#ifndef PSCLUSTER_STORAGE_CRASH_POINTS_H_
#define PSCLUSTER_STORAGE_CRASH_POINTS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pscluster {

// Fault injection for the checkpoint and recovery paths: named places where a test makes the
// process die with SIGKILL, as a power cut or the OOM killer would take it, to show that a
// crash at any point of a checkpoint write leaves every committed checkpoint intact, and that
// a chief killed at any point of a recovery leaves nothing its successor cannot finish.
//
// The daemons arm one point from --crash_at; production code passes a null CrashPoints and
// nothing happens.

// A ps task's CheckpointWriter: its RocksDB created, nothing written yet.
inline constexpr char kCrashSaveOpened[] = "save_opened";
// After the first shard's record is written, before the others.
inline constexpr char kCrashSaveMidway[] = "save_midway";
// Every record written, before the RocksDB is flushed and synced.
inline constexpr char kCrashSaveBeforeSync[] = "save_before_sync";
// The ps task's file is complete and synced; the chief has not heard back.
inline constexpr char kCrashSaveDone[] = "save_done";
// The chief's CommitManifest: before MANIFEST.json.tmp is written.
inline constexpr char kCrashManifestBeforeWrite[] = "manifest_before_write";
// MANIFEST.json.tmp written and synced, before the rename that commits it.
inline constexpr char kCrashManifestBeforeRename[] = "manifest_before_rename";
// Renamed (committed), before the directory is synced.
inline constexpr char kCrashManifestBeforeDirSync[] = "manifest_before_dir_sync";
// The chief's recovery of restarted ps tasks: its RecoveryIntent written, nothing else done.
inline constexpr char kCrashRecoveryIntentWritten[] = "recovery_intent_written";
// Every ps task's shards re-created (held until restored), nothing restored yet.
inline constexpr char kCrashRecoveryCreated[] = "recovery_created";
// The first ps task restored, the others not yet (the chief restores one ps task at a time
// when this point is armed, so that the crash leaves the cluster half restored).
inline constexpr char kCrashRecoveryRestoreMidway[] = "recovery_restore_midway";
// Every ps task restored, before the global step goes back and the intent is cleared.
inline constexpr char kCrashRecoveryRestored[] = "recovery_restored";
// A ps task: a CreateShards request has arrived, nothing is created (a ps task that dies again
// while the chief recovers it).
inline constexpr char kCrashPsCreateShards[] = "ps_create_shards";
// The chief at the end of training: every worker has finished, the final checkpoint is not
// taken yet.
inline constexpr char kCrashTrainingEnded[] = "training_ended";
// The final checkpoint committed, training not yet marked finished (the final evaluation to come).
inline constexpr char kCrashFinalCheckpointDone[] = "final_checkpoint_done";
// The chief's failover of a ps task (replication 2): the first live task told (FailOverPs),
// the others not yet, nothing published (a chief that dies mid-failover).
inline constexpr char kCrashFailoverMidway[] = "failover_midway";

// A ps task with backups (replication 2): a worker's dense or table push applied here, its
// forwards to the backups not sent yet (a streamed async push may be committed on them
// already). A primary that dies between its apply and its forward leaves the worker
// unanswered; its retry reaches the promoted backup.
inline constexpr char kCrashPushApplied[] = "push_applied";

// One armed point. Thread-safe.
class CrashPoints {
 public:
  // `spec` is "<point>" or "<point>@<n>": die the n-th time (counting from 1) the point is
  // reached; "" gives null (nothing armed). With ":stop" after it ("save_midway@2:stop") the
  // process stops itself there with SIGSTOP instead, every thread of it, as a frozen machine
  // or a process that hangs would (a test sends SIGCONT or SIGKILL). INVALID_ARGUMENT naming
  // the known points for an unknown one or a bad count.
  static absl::StatusOr<std::unique_ptr<CrashPoints>> Parse(absl::string_view spec);

  // For tests of a component in one process: at the n-th visit of `point`, calls `reached` on
  // the visiting thread instead of killing the process. A `reached` that blocks until the test
  // lets it go stands for a process that stopped there: a successor can be started meanwhile.
  // `point` must be one of the known points.
  static std::unique_ptr<CrashPoints> ForTest(absl::string_view point, int64_t nth,
                                              std::function<void()> reached);

  // Kills this process with SIGKILL when `point` is the armed one and this is its n-th visit
  // (or calls the test's function, see ForTest).
  void Reach(absl::string_view point);

  const std::string& point() const { return point_; }

 private:
  CrashPoints(std::string point, int64_t nth, std::function<void()> reached = nullptr,
              bool stop = false)
      : point_(std::move(point)), nth_(nth), reached_(std::move(reached)), stop_(stop) {}

  const std::string point_;
  const int64_t nth_;
  const std::function<void()> reached_;
  const bool stop_;  // SIGSTOP rather than SIGKILL
  std::atomic<int64_t> visits_{0};
};

// Reach(point) when crash_points is not null.
inline void MaybeCrash(CrashPoints* crash_points, absl::string_view point) {
  if (crash_points != nullptr) crash_points->Reach(point);
}

}  // namespace pscluster

#endif  // PSCLUSTER_STORAGE_CRASH_POINTS_H_
