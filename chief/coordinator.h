#ifndef PSCLUSTER_CHIEF_COORDINATOR_H_
#define PSCLUSTER_CHIEF_COORDINATOR_H_

#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chief/checkpoint_manager.h"
#include "chief/recovery_driver.h"
#include "chief/step_gate.h"
#include "chief/step_reports.h"
#include "chief/sync_coordinator.h"
#include "chief/task_registry.h"
#include "client/parameter_client.h"
#include "client/ps_transport.h"
#include "common/clock.h"
#include "evaluator/eval_result.h"
#include "proto/cluster.pb.h"
#include "proto/coordinator_service.pb.h"
#include "proto/model.pb.h"
#include "proto/model_config.pb.h"
#include "storage/crash_points.h"

namespace pscluster {

// Makes the chief's transport to the ps tasks, given their addresses by index.
using PsTransportMaker =
    std::function<absl::StatusOr<std::unique_ptr<PsTransport>>(const std::vector<std::string>&)>;

struct CoordinatorOptions {
  // The cluster; the task must be chief:0.
  v1::ClusterConfig cluster;
  // Tasks are told to send heartbeats this often.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A task without a heartbeat for this long is MISSING.
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // The model the workers train. When it has layers, the variables come from it and `model`
  // is ignored; otherwise `model` lists the variables and tables directly (no training).
  v1::ModelConfig config;
  v1::ModelSpec model;
  // Served to the workers: batch size, epochs, data.
  v1::TrainingOptions training;
  // How variables are spread over the ps tasks.
  v1::PlacementOptions placement;
  // Update mode: ASYNC; SYNC with replicas_to_aggregate (0: every worker); or SSP with its
  // staleness bound.
  v1::SyncOptions sync;
  // Without an evaluator task: evaluate the test set this often while training, and once at
  // the end (needs `config`). With one, the evaluator evaluates and reports.
  absl::Duration eval_every = absl::Seconds(15);
  // The chief's own evaluation (without an evaluator task, and of the final model when the
  // evaluator's does not come); the chief's main gives it evaluator/evaluation.h's
  // TestSetEvaluation. Unset: those evaluations fail (logged) and the chief goes on.
  EvaluateFn evaluate;
  // With an evaluator task: how long to wait for its evaluation of the final model before
  // the chief evaluates it itself.
  absl::Duration final_eval_timeout = absl::Seconds(60);
  // Once training is over (final checkpoint and evaluation taken): answer every task's next
  // heartbeat with `stop`, wait until each has said it heard it (HeartbeatRequest.stopping)
  // or is gone (no heartbeat for max(4 x heartbeat_timeout, 10 s): a task missing for less
  // may be cut off for a moment and come back), for at most exit_grace, then stop the chief
  // too, so the whole cluster exits 0 (a Kubernetes Job completes). Off: the cluster keeps
  // serving the trained model.
  bool exit_after_training = false;
  absl::Duration exit_grace = absl::Seconds(30);
  // Each evaluation is appended here as a JSON line (empty: not written).
  std::string metrics_path;
  // Checkpoints go here (empty: none). The newest committed one is restored when the chief
  // starts with freshly created variables, and when a ps task restarts.
  std::string checkpoint_dir;
  // Take a checkpoint every this many global steps and/or this often (0: not on that trigger),
  // and once when training ends.
  int64_t checkpoint_every_steps = 0;
  absl::Duration checkpoint_every = absl::ZeroDuration();
  // Committed checkpoints kept; older ones are deleted.
  int keep_checkpoints = 3;
  // CheckpointManagerOptions.full_every: a full checkpoint every this many, incremental ones
  // between.
  int full_checkpoint_every = 1;
  // The chief's calls to a ps task that fail with UNAVAILABLE are tried this many times in all,
  // with backoff up to ps_call_max_backoff (ParameterClientOptions).
  int ps_call_attempts = 20;
  absl::Duration ps_call_max_backoff = absl::Seconds(2);
  // How long a checkpoint waits for the workers to reach a step boundary.
  absl::Duration checkpoint_hold_timeout = absl::Seconds(10);
  // Fault injection for tests (chief --crash_at). Not owned; null in real use.
  CrashPoints* crash_points = nullptr;
  // Where time comes from. Not owned; a FakeClock in tests.
  Clock* clock = Clock::Real();
  // Makes the transport to the ps tasks once they have registered (ChiefServer: gRPC; tests:
  // in-process stores). Required.
  PsTransportMaker make_ps_transport;
};

// A call's deadline, on the coordinator's clock, and whether its caller has gone.
struct CallContext {
  absl::Time deadline = absl::InfiniteFuture();
  std::function<bool()> cancelled = [] { return false; };
};

// The chief's logic, without RPC: waits until every ps task has registered, computes the
// placement of the model's variables, creates and initializes every variable on its ps tasks
// (harmless if repeated), then serves the model, the placement and the ps addresses to workers
// (GetModel). It owns the global step and the sync tokens, gathers the workers' progress,
// takes checkpoints, restores every ps task when one restarts, has the model evaluated
// periodically and at the end, and reports all of it in GetClusterStatus. Its state is a
// v1::ChiefPhase; every transition is logged and shown in the status.
//
// Its parts, one job each: TaskRegistry (who is in the cluster, their addresses and
// heartbeats), SyncCoordinator (tokens and the global step) and StepGate (ASYNC: holding the
// workers), CheckpointManager (checkpoint files and the recovery record), RecoveryDriver
// (what to restore after a restart, and at start). Time comes from the
// injected Clock, the ps tasks through the injected transport. ChiefServer serves it over
// gRPC (CoordinatorService); tests drive it directly.
//
// The methods named after the Coordinator service's RPCs validate their request whole and
// change nothing when they refuse it.
//
// Lifecycle: Create() -> Start() -> Stop() (any thread) -> Join(). Thread-safe.
class Coordinator {
 public:
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(const CoordinatorOptions& options);
  ~Coordinator();

  // Starts the background work (initialization, then checkpoints, recovery, evaluation).
  void Start();
  // Asks everything to stop: waits end, calls to the ps tasks are cancelled, workers waiting
  // for tokens are told to finish.
  void Stop();
  // Blocks until Stop() has been called and the background work has ended.
  void Join();
  bool stop_requested() const;

  // The chief's own address, shown in the status.
  void set_address(const std::string& address);

  // The Coordinator service (proto/coordinator_service.proto).
  absl::Status RegisterTask(const v1::RegisterTaskRequest& req, v1::RegisterTaskResponse* resp);
  absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp);
  void GetClusterStatus(v1::ClusterStatus* resp) const;
  // Recoveries begun since this chief started (for metrics).
  int64_t recoveries() const;
  // The ps tasks failed over to their backups so far (replication 2), in order. A copy.
  std::vector<int> FailedOver() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status GetModel(const v1::GetModelRequest& req, const CallContext& call,
                        v1::GetModelResponse* resp);
  absl::Status AcquireToken(const v1::AcquireTokenRequest& req, const CallContext& call,
                            v1::AcquireTokenResponse* resp);
  absl::Status ReportStep(const v1::ReportStepRequest& req, v1::ReportStepResponse* resp);
  absl::Status Checkpoint(const v1::CheckpointRequest& req, v1::CheckpointResponse* resp);
  // INVALID_ARGUMENT for a report not from evaluator:0 or with impossible values (a step past
  // the global step, no examples, a loss, accuracy or AUC out of range); FAILED_PRECONDITION
  // when the cluster has no evaluator or no final evaluation is expected.
  absl::Status ReportEvaluation(const v1::ReportEvaluationRequest& req,
                                v1::ReportEvaluationResponse* resp);

  v1::ChiefPhase phase() const;
  int64_t CurrentStep() const;

 private:
  explicit Coordinator(const CoordinatorOptions& options);

  absl::Status CheckEvaluationReport(const v1::ReportEvaluationRequest& req) const;

  // Stops new steps and waits until none is under way (SYNC: the current step closed; ASYNC:
  // every live worker is back at the gate). UNAVAILABLE naming the workers still inside after
  // `timeout`; the workers stay held either way until ResumeWorkers().
  absl::Status HoldWorkersAtStepBoundary(absl::Duration timeout);
  void ResumeWorkers();
  // Writes a checkpoint of the current model (sync: at a step boundary) and commits its
  // manifest. `require_ready`: refuse (UNAVAILABLE) until the model is ready; InitializeModel's
  // first checkpoint is taken just before.
  absl::StatusOr<v1::CheckpointResponse> TakeCheckpoint(const std::string& reason,
                                                        bool require_ready = true)
      ABSL_LOCKS_EXCLUDED(operation_mu_);
  // Points the chief's calls, and the addresses GetModel serves, at the address each of the
  // `restarted` ps tasks registered with last.
  void FollowMovedPs(const std::vector<int>& restarted);
  // The same for task `ps`, if it registered elsewhere; also called by the client before it
  // tries a call to it again.
  void FollowPs(int ps) ABSL_LOCKS_EXCLUDED(mu_);
  // Takes periodic checkpoints and restores every ps task when one restarts. Runs on
  // background_ after initialization.
  void MaintenanceLoop();
  void RecoverRestartedPs(const std::vector<int>& restarted) ABSL_LOCKS_EXCLUDED(operation_mu_);
  // Replication 2 (issue 37, docs/replication.md): fails over every ps task that stopped
  // heartbeating or is in `restarted` (came back empty) and has not failed over yet, where the
  // backups of all its partitions are on live tasks. Returns the tasks of `restarted` it could
  // not fail over (both copies lost): those are restored from the checkpoint as without
  // replication. Restarted tasks that had failed over before are left empty.
  std::vector<int> FailOverLostPs(const std::vector<int>& restarted)
      ABSL_LOCKS_EXCLUDED(operation_mu_);
  // Promotes the backups of `ps`'s partitions on their tasks and publishes the new routes
  // (Placement.failed_over_ps) to the chief's client and to GetModel. False, with nothing
  // published, when a backup task could not be promoted (tried again later).
  bool FailOver(int ps) ABSL_EXCLUSIVE_LOCKS_REQUIRED(operation_mu_);
  // Rebuild (docs/replication.md), on a thread of its own (the rebuilder) so that a slow copy
  // never holds up a failover or a checkpoint: gives the dense partitions whose placement
  // backup is the failed-over task `ps` (once it serves again) a backup there again, one
  // primary at a time, copied while pushes go on (ParameterClient::RebuildBackupOnto); what
  // fails is tried again later, with a growing pause. Async tables are rebuilt with the dense
  // shards (their rows, stripe by stripe); sync shards are not rebuilt.
  void RebuildLoop();
  void RebuildOnto(int ps);
  // A task that held rebuilt backups (or was being given some) was lost again: tells the
  // primaries asked to rebuild onto it to stop forwarding there (FailOverPs); true once all
  // did. With `keep_for_rebuilder` (the maintenance thread's first try) the task stays marked
  // for the rebuilder to tell them again, after any rebuild of it under way.
  bool DropBackupsOn(int ps, bool keep_for_rebuilder);
  // Maintenance thread: `ps`, failed over, serves (or will) again: rebuild onto it.
  void ScheduleRebuild(int ps);
  // Replication 2: ends the chief's calls to a ps task as soon as its heartbeats stop
  // (ParameterClient::AbortCalls), so that a call to a task that hangs does not hold the
  // maintenance thread, and the task's failover, until the call's deadline.
  void LossWatchLoop();
  // The virtual shards of the tables whose primary is `ps`, each with the task backing it up
  // (none for a model without tables).
  std::vector<std::pair<int, int>> TableBackupsOf(int ps) const;
  // When `s` says that a newer chief has replaced this one (common/chief_epoch.h): the phase
  // becomes FAILED, the chief stops, and true is returned.
  bool StopIfSuperseded(const absl::Status& s);

  // Waits for the ps tasks, places and creates the variables, then evaluates periodically.
  // Runs on background_.
  void Run();
  absl::Status InitializeModel();
  // By ps task index: 1 for a task the registry does not see serving (never registered, or
  // its heartbeats stopped).
  std::vector<char> PsDown() const;
  // Replication 2, as the chief starts, from the serving tasks' shards (at `addresses`):
  // `promoted`, the ps tasks an earlier chief failed over (a serving task holds their
  // partitions promoted); `lost`, the others whose backups hold trained state while they hold
  // nothing of their own (restarted while no chief ran) or, with `down_is_lost`, are down,
  // and none of whose backups (as `placement` puts them) is on a `promoted` task.
  // UNAVAILABLE when a serving task does not answer.
  struct FailoversFound {
    std::vector<int> promoted;
    std::vector<int> lost;
  };
  absl::StatusOr<FailoversFound> FailedOverEarlier(const std::vector<std::string>& addresses,
                                                   const v1::Placement& placement,
                                                   bool down_is_lost);
  // Tells every other serving task of those failovers again (FailOverPs: a task told before
  // answers as it did, so a failover the earlier chief left half done is completed).
  // UNAVAILABLE when a task does not take it, or when partitions of one are backed up on a task
  // that is down (no copy serves: the chief initializes again, waiting for it);
  // FAILED_PRECONDITION when a task no longer holds the partitions it took over.
  absl::Status AdoptFailovers(const std::vector<int>& failed);
  // Evaluates periodically (without an evaluator task), then, once every worker is done,
  // takes the final checkpoint, has the final model evaluated (by the evaluator, or by the
  // chief if it has none or it does not answer in time) and marks training finished.
  void EvaluationLoop();
  // The chief's own evaluation (options_.evaluate); background_ only.
  absl::StatusOr<EvalResult> OwnEvaluation(int64_t step);
  // Seconds since the first step report (0 before it): the training clock of
  // TrainingProgress.elapsed_seconds and of time to accuracy.
  double TrainingSeconds() const ABSL_LOCKS_EXCLUDED(mu_);
  double TrainingSecondsLocked(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Shows `r`, computed by task `by`, in the status, and appends it to the metrics file.
  void RecordEvaluation(const EvalResult& r, const std::string& by) ABSL_LOCKS_EXCLUDED(mu_);

  const CoordinatorOptions options_;
  Clock* const clock_;
  const absl::Time start_time_;
  const int num_ps_;
  const int num_workers_;
  const bool has_evaluator_;  // the cluster has an evaluator task
  TaskRegistry registry_;
  SyncCoordinator sync_;
  StepGate gate_;  // ASYNC: where workers are held for a checkpoint or a recovery
  std::thread background_;
  // Set once (under mu_, so that Stop() can cancel it), before model_ready_; read without the
  // lock after that.
  std::unique_ptr<ParameterClient> client_;
  // Set with client_ when there is a checkpoint directory.
  std::unique_ptr<CheckpointManager> checkpoints_;
  // Set with client_; background_ only.
  std::unique_ptr<RecoveryDriver> recovery_;
  std::vector<uint64_t> ps_incarnations_;  // as of the last (re)creation; background_ only
  // Rebuild (replication 2), per failed-over task.
  struct RebuildState {
    bool pending = false;   // to get its backups again once it serves
    bool drop = false;      // lost again: its primaries must stop forwarding to it first
    std::set<int> rebuilt;  // primaries whose partitions it backs up again
    // Primaries asked to rebuild onto it since its last drop, with their incarnation then.
    std::map<int, uint64_t> asked;
    int drops_in_flight = 0;  // the maintenance thread's, under way
    int64_t shards = 0;       // copied onto it since it came back, and their bytes
    int64_t bytes = 0;
    int64_t rows = 0;   // table rows copied (their bytes in `bytes`)
    int primaries = 0;  // to back up, as the last try counted them
    int tries = 0;
    std::string last_error;  // the last failed copy's
    absl::Time since;        // when it came back
    absl::Time done = absl::InfinitePast();
    absl::Time next_try;
    absl::Duration pause;      // before the next try after a failure
    absl::Time drop_next_try;  // the same for the drop
    absl::Duration drop_pause = absl::Milliseconds(200);
  };
  // A rebuild from the start (its counts and pause).
  void ResetRebuildLocked(RebuildState* state) ABSL_EXCLUSIVE_LOCKS_REQUIRED(rebuild_mu_);
  // ClusterStatus.rebuilds.
  void FillRebuilds(v1::ClusterStatus* resp) const ABSL_LOCKS_EXCLUDED(rebuild_mu_);
  absl::Mutex follow_mu_;  // FollowPs's
  mutable absl::Mutex rebuild_mu_;
  std::map<int, RebuildState> rebuild_ ABSL_GUARDED_BY(rebuild_mu_);
  bool rebuild_wake_ ABSL_GUARDED_BY(rebuild_mu_) = false;
  // Failed-over primaries whose partitions were lost with the task that had taken them over
  // (background_ only): the job must restart from its newest checkpoint.
  std::set<int> stranded_;
  int64_t chief_epoch_ = 0;  // this chief's fencing epoch; background_ only
  absl::Mutex metrics_mu_;   // serializes appends to options_.metrics_path

  // Held for the whole of a checkpoint or a recovery: one at a time. Taken before mu_.
  absl::Mutex operation_mu_ ABSL_ACQUIRED_BEFORE(mu_);

  struct WorkerProgress {
    int64_t steps = 0;
    int32_t epoch = 0;
    bool finished = false;
    // ASYNC and SSP: see WorkerView::granted_steps.
    int64_t granted_steps = 0;
  };
  // Moves to `phase` (logged with the one it leaves); `detail` says why or on what.
  void SetPhase(v1::ChiefPhase phase, const std::string& detail) ABSL_LOCKS_EXCLUDED(mu_);
  void SetPhaseLocked(v1::ChiefPhase phase, const std::string& detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TRAINING, or MODEL_READY when there is nothing to train.
  v1::ChiefPhase ServingPhase() const;
  // Records that worker `w` may now have done `steps` steps (a token was granted).
  void NoteGranted(int w, int64_t steps);
  // A worker's heartbeat says it finished after `step` steps, and its final report went to a
  // chief before this one: counted as that report (ReportStep) once the model is ready.
  void NoteWorkerFinished(int worker, int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  // exit_after_training: has every task but the chief heard `stop` (said so), or gone for
  // good? Lists the others.
  bool AllTasksToldToStop(std::vector<std::string>* waiting) const;
  // exit_after_training, after FINISHED: tells every task to stop, waits (exit_grace at most),
  // then stops the chief.
  void StopTheCluster();
  mutable absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool model_ready_ ABSL_GUARDED_BY(mu_) = false;
  std::string address_ ABSL_GUARDED_BY(mu_);
  // Where the chief's calls to each ps task go (the address it registered with last).
  std::vector<std::string> ps_addresses_ ABSL_GUARDED_BY(mu_);
  // What the chief is doing (SetPhaseLocked), and the same in words for messages.
  v1::ChiefPhase phase_ ABSL_GUARDED_BY(mu_) = v1::WAITING_FOR_PS;
  std::string phase_detail_ ABSL_GUARDED_BY(mu_);
  absl::Time phase_since_ ABSL_GUARDED_BY(mu_);
  std::string init_state_ ABSL_GUARDED_BY(mu_) = "waiting for the ps tasks";
  v1::GetModelResponse model_ ABSL_GUARDED_BY(mu_);
  std::map<int, WorkerProgress> workers_ ABSL_GUARDED_BY(mu_);
  v1::TrainingProgress progress_ ABSL_GUARDED_BY(mu_);
  int64_t total_examples_ ABSL_GUARDED_BY(mu_) = 0;
  // ASYNC: the global step of the checkpoint this run started from; the workers' steps add up
  // from there.
  int64_t steps_before_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time rate_window_start_ ABSL_GUARDED_BY(mu_);
  int64_t rate_window_examples_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time first_report_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // FINAL_EVALUATION: the step whose model the evaluator must evaluate, and whether it has.
  int64_t final_step_ ABSL_GUARDED_BY(mu_) = -1;
  bool final_evaluated_ ABSL_GUARDED_BY(mu_) = false;
  // exit_after_training: heartbeats are answered with `stop`, and who has said it heard it.
  bool telling_tasks_to_stop_ ABSL_GUARDED_BY(mu_) = false;
  int64_t recoveries_ ABSL_GUARDED_BY(mu_) = 0;
  // Task name -> the incarnation that said it is stopping.
  absl::flat_hash_map<std::string, uint64_t> told_to_stop_ ABSL_GUARDED_BY(mu_);
  // Workers whose finish (NoteWorkerFinished) was refused, each logged once.
  absl::flat_hash_set<int> refused_finish_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_COORDINATOR_H_
