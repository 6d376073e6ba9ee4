#ifndef PSCLUSTER_CHIEF_SYNC_COORDINATOR_H_
#define PSCLUSTER_CHIEF_SYNC_COORDINATOR_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace pscluster {

struct SyncCoordinatorOptions {
  // SYNC: a step completes when this many distinct workers have reported it (the rest are
  // backups whose late reports are dropped and counted). SSP: unused.
  int replicas_to_aggregate = 1;
  int num_workers = 1;
  // SSP: a worker may start step s only while the slowest unfinished worker has completed at
  // least s - staleness steps. Negative: synchronous mode (tokens per global step).
  int staleness = -1;
  // The generation of the first tokens. A chief passes one no earlier chief of the cluster
  // used (its start time in microseconds), so that a restarted chief's tokens are a new
  // generation to every worker: what a worker computed or prefetched for the previous chief's
  // steps is abandoned, even when the new chief sends the global step back.
  int64_t first_generation = 0;
};

// The chief's token logic for synchronous (SyncReplicas) and bounded-staleness training, without
// transport. The global step is the one authority for which step a worker computes.
//
// SYNC: AcquireToken(w, last) waits until the global step is past `last` and returns it (a
// request after finishing the current step counts as its report); a worker's report of step s
// counts once; when replicas_to_aggregate distinct workers reported
// the current step it advances. A report of an older step is dropped and counted per worker.
// A report of a step after the global step, or of an older generation, was computed before a
// recovery set the global step back (Rewind): dropped.
// SSP: AcquireToken(w, last) waits until last + 1 - staleness <= the slowest active worker's
// completed steps; finished workers stop holding the others back.
//
// Thread-safe. Waits use the injected clock's deadline.
class SyncCoordinator {
 public:
  SyncCoordinator(const SyncCoordinatorOptions& options, const Clock* clock);

  struct Token {
    bool granted = false;   // false: the deadline passed
    bool finished = false;  // training is over
    int64_t step = 0;
    int64_t generation = 0;
  };
  // `generation`: that of the worker's last token (0 before any).
  Token AcquireToken(int worker, int64_t last_done_step, int64_t generation, absl::Time deadline);

  // Returns true if the report counted toward its step, false if it was late (or of an older
  // generation) and dropped.
  bool ReportStep(int worker, int64_t step, int64_t generation);
  void WorkerFinished(int worker);
  // Stops granting tokens (a checkpoint or a recovery is under way). In SYNC mode, waits until
  // the step in progress has closed (a step boundary) or the deadline passes; returns true at a
  // boundary. Resume() grants tokens again.
  bool PauseAtStepBoundary(absl::Time deadline);
  void Resume();
  // SYNC: pauses by itself when the global step reaches `step` (a checkpoint is due there),
  // so the cut is exactly at that step; Resume() goes on.
  void PauseAtStep(int64_t step);
  // Waits until the global step is at least `step` or the deadline passes. True unless the
  // deadline passed.
  bool AwaitStep(int64_t step, absl::Time deadline);
  // Sets the global step (restored from the ps tasks or a checkpoint after a chief restart).
  void SetGlobalStep(int64_t step);
  // SYNC: sends the global step back to `step` (a recovery restored the ps tasks to a
  // checkpoint of that step, or restarts the step in progress) and starts a new generation.
  // Every worker's next token is `step`, whatever it had done; its reports of the older
  // generation belong to the abandoned steps and are dropped. Call while paused.
  void Rewind(int64_t step);
  void Finish();

  int64_t global_step() const;
  std::map<int, int64_t> dropped_per_worker() const;
  // SYNC: the workers that have not reported the current step. SSP: workers at the minimum.
  std::vector<int> waiting_for() const;
  // SSP: steps completed by each worker.
  std::map<int, int64_t> completed() const;
  // SSP: the largest lead granted so far: a started step minus the slowest worker's completed
  // steps. Never more than `staleness`.
  int64_t max_lead() const;

 private:
  bool CanStartLocked(int64_t last_done_step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The current step closed: the next one is open to every worker.
  void AdvanceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // SYNC: the global step is one this worker has not done yet, and it can still close.
  bool OpenStepForLocked(int64_t last_done_step) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  int64_t SlowestLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The step a worker last did, as far as tokens go: for an older generation, at most the one
  // just before the global step.
  int64_t LastDoneLocked(int64_t reported_last_done, int64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const SyncCoordinatorOptions options_;
  const Clock* const clock_;  // Not owned.
  mutable absl::Mutex mu_;
  int64_t global_step_ ABSL_GUARDED_BY(mu_) = 0;
  std::set<int> reported_ ABSL_GUARDED_BY(mu_);  // workers that reported global_step_
  std::map<int, int64_t> dropped_ ABSL_GUARDED_BY(mu_);
  std::map<int, int64_t> completed_ ABSL_GUARDED_BY(mu_);  // SSP: steps done per worker
  std::set<int> finished_workers_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  int64_t max_lead_ ABSL_GUARDED_BY(mu_) = 0;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  int64_t pause_at_ ABSL_GUARDED_BY(mu_) = -1;  // see PauseAtStep
  // Incremented by every Rewind.
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  // SYNC: workers granted a token of global_step_; the step is under way while not empty.
  std::set<int> started_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_SYNC_COORDINATOR_H_
