#ifndef PSCLUSTER_CHIEF_CHIEF_SERVER_H_
#define PSCLUSTER_CHIEF_CHIEF_SERVER_H_

#include <map>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chief/step_gate.h"
#include "chief/step_reports.h"
#include "chief/sync_coordinator.h"
#include "chief/task_registry.h"
#include "client/grpc_ps_transport.h"
#include "client/parameter_client.h"
#include "common/clock.h"
#include "evaluator/evaluation.h"
#include "proto/cluster.pb.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "proto/model.pb.h"
#include "proto/model_config.pb.h"
#include "runtime/daemon.h"
#include "runtime/service_host.h"
#include "storage/crash_points.h"

namespace pscluster {

struct ChiefOptions {
  // The cluster; the task must be chief:0.
  v1::ClusterConfig cluster;
  // Server settings; `address` is taken from the cluster spec.
  ServiceHostOptions host;
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
  // With an evaluator task: how long to wait for its evaluation of the final model before
  // the chief evaluates it itself.
  absl::Duration final_eval_timeout = absl::Seconds(60);
  // Each evaluation is appended here as a JSON line (empty: not written).
  std::string metrics_path;
  // Settings of the chief's own calls to the ps tasks.
  GrpcPsTransportOptions ps_transport;
  // Checkpoints go here (empty: none). The newest committed one is restored when the chief
  // starts with freshly created variables, and when a ps task restarts.
  std::string checkpoint_dir;
  // Take a checkpoint every this many global steps and/or this often (0: not on that trigger),
  // and once when training ends.
  int64_t checkpoint_every_steps = 0;
  absl::Duration checkpoint_every = absl::ZeroDuration();
  // Committed checkpoints kept; older ones are deleted.
  int keep_checkpoints = 3;
  // Fault injection for tests (chief --crash_at). Not owned; null in real use.
  CrashPoints* crash_points = nullptr;
};

// The chief daemon: serves the Coordinator service. It waits until every ps task has
// registered, computes the placement of the model's variables, creates and initializes every
// variable on its ps tasks (harmless if repeated), then serves the model, the placement and
// the ps addresses to workers (GetModel). It owns the global step and the sync tokens, gathers
// the workers' progress, evaluates the model periodically and at the end, and reports all of
// it in GetClusterStatus.
//
// Lifecycle: Create() -> Start() -> Stop() (any thread) -> Wait(). Thread-safe.
class ChiefServer : public Daemon, private v1::Coordinator::Service {
 public:
  static absl::StatusOr<std::unique_ptr<ChiefServer>> Create(const ChiefOptions& options);
  ~ChiefServer() override;

  absl::Status Start() override;
  void Stop() override;
  absl::Status Wait() override;

  // The address actually served (valid after Start).
  std::string address() const;

 private:
  explicit ChiefServer(const ChiefOptions& options);

  grpc::Status RegisterTask(grpc::ServerContext* ctx, const v1::RegisterTaskRequest* req,
                            v1::RegisterTaskResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status GetClusterStatus(grpc::ServerContext* ctx, const v1::GetClusterStatusRequest* req,
                                v1::ClusterStatus* resp) override;
  grpc::Status GetModel(grpc::ServerContext* ctx, const v1::GetModelRequest* req,
                        v1::GetModelResponse* resp) override;
  grpc::Status AcquireToken(grpc::ServerContext* ctx, const v1::AcquireTokenRequest* req,
                            v1::AcquireTokenResponse* resp) override;
  grpc::Status ReportStep(grpc::ServerContext* ctx, const v1::ReportStepRequest* req,
                          v1::ReportStepResponse* resp) override;
  grpc::Status Checkpoint(grpc::ServerContext* ctx, const v1::CheckpointRequest* req,
                          v1::CheckpointResponse* resp) override;
  grpc::Status ReportEvaluation(grpc::ServerContext* ctx, const v1::ReportEvaluationRequest* req,
                                v1::ReportEvaluationResponse* resp) override;
  // INVALID_ARGUMENT for a report not from evaluator:0 or with impossible values (a step past
  // the global step, no examples, a loss, accuracy or AUC out of range); FAILED_PRECONDITION
  // when the cluster has no evaluator.
  absl::Status CheckEvaluationReport(const v1::ReportEvaluationRequest& req) const;

  // Writes a checkpoint of the current model (sync: at a step boundary) and commits its
  // manifest. One at a time.
  // Stops new steps and waits until none is under way (SYNC: the current step closed; ASYNC:
  // every live worker is back at the gate). UNAVAILABLE naming the workers still inside after
  // `timeout`; the workers stay held either way until ResumeWorkers().
  absl::Status HoldWorkersAtStepBoundary(absl::Duration timeout);
  void ResumeWorkers();
  // `require_ready`: refuse (UNAVAILABLE) until the model is ready; InitializeModel's first
  // checkpoint is taken just before.
  absl::StatusOr<v1::CheckpointResponse> TakeCheckpoint(const std::string& reason,
                                                        bool require_ready = true);
  // Restores the newest committed checkpoint that verifies, falling back to older ones.
  // Sync accumulators continue at `accumulator_step` (or the checkpoint's step when < 0).
  // Returns the checkpoint's step; NOT_FOUND when there is none, DATA_LOSS when none restores,
  // UNAVAILABLE when a ps task cannot be reached. With an `intent`, the recovery record is
  // rewritten before a fallback to an older checkpoint.
  absl::StatusOr<int64_t> RestoreLatestCheckpoint(int64_t accumulator_step,
                                                  v1::RecoveryIntent* intent = nullptr);
  // Brings every ps task to the newest checkpoint as one recorded operation: writes the
  // RecoveryIntent (`why`, `step_before`), re-creates lost shards held until restored, then
  // RestoreLatestCheckpoint. The caller sets the global step and then calls FinishRecovery;
  // until then a chief that starts redoes it. Errors as RestoreLatestCheckpoint's (after
  // DATA_LOSS the held shards are released); UNAVAILABLE and others leave the record.
  absl::StatusOr<int64_t> RestoreEveryPs(const std::vector<std::string>& why, int64_t step_before,
                                         int64_t accumulator_step);
  // The committed checkpoints, newest first; NOT_FOUND when there is none (or no directory).
  absl::StatusOr<std::vector<std::string>> CommittedCheckpoints() const;
  // Deletes the recovery record: the recovery is complete.
  void FinishRecovery();
  // Points the chief's calls, and the addresses GetModel serves, at the address each of the
  // `restarted` ps tasks registered with last.
  void FollowMovedPs(const std::vector<int>& restarted);
  // Takes periodic checkpoints and restores every ps task when one restarts. Runs on
  // background_ after initialization.
  void MaintenanceLoop();
  void RecoverRestartedPs(const std::vector<int>& restarted);
  int64_t CurrentStep() const;

  // Waits for the ps tasks, places and creates the variables, then evaluates periodically.
  // Runs on background_.
  void Run();
  absl::Status InitializeModel();
  // Evaluates periodically (without an evaluator task), then, once every worker is done,
  // takes the final checkpoint, has the final model evaluated (by the evaluator, or by the
  // chief if it has none or it does not answer in time) and marks training finished.
  void EvaluationLoop();
  // The chief's own evaluation (its Evaluator is made on first use); background_ only.
  absl::StatusOr<EvalResult> OwnEvaluation(int64_t step);
  // Shows `r`, computed by task `by`, in the status, and appends it to the metrics file.
  void RecordEvaluation(const EvalResult& r, const std::string& by) ABSL_LOCKS_EXCLUDED(mu_);
  bool stop_requested() const;

  const ChiefOptions options_;
  const absl::Time start_time_;
  const int num_workers_;
  const bool has_evaluator_;  // the cluster has an evaluator task
  TaskRegistry registry_;
  SyncCoordinator sync_;
  StepGate gate_;  // ASYNC: where workers are held for a checkpoint or a recovery
  std::unique_ptr<ServiceHost> host_;
  std::thread background_;
  // Set once (under mu_, so that Stop() can cancel it), before model_ready_; read without the
  // lock after that.
  std::unique_ptr<ParameterClient> client_;
  std::vector<uint64_t> ps_incarnations_;     // as of the last (re)creation; background_ only
  std::unique_ptr<Evaluator> own_evaluator_;  // OwnEvaluation's; the evaluation thread only
  absl::Mutex metrics_mu_;                    // serializes appends to options_.metrics_path

  struct WorkerProgress {
    int64_t steps = 0;
    int32_t epoch = 0;
    bool finished = false;
    // ASYNC and SSP: see WorkerView::granted_steps.
    int64_t granted_steps = 0;
  };
  // Moves to `phase` (logged with the one it leaves); `detail` says why or on what.
  void SetPhaseLocked(v1::ChiefPhase phase, const std::string& detail)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // TRAINING, or MODEL_READY when there is nothing to train.
  v1::ChiefPhase ServingPhase() const;
  // Records that worker `w` may now have done `steps` steps (a token was granted).
  void NoteGranted(int w, int64_t steps);
  mutable absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool model_ready_ ABSL_GUARDED_BY(mu_) = false;
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
  // A checkpoint or recovery is running.
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  // FINAL_EVALUATION: the step whose model the evaluator must evaluate, and whether it has.
  int64_t final_step_ ABSL_GUARDED_BY(mu_) = -1;
  bool final_evaluated_ ABSL_GUARDED_BY(mu_) = false;
  std::string last_checkpoint_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_CHIEF_SERVER_H_
