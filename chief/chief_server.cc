#include "chief/chief_server.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/cluster_spec.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "evaluator/evaluation.h"
#include "glog/logging.h"
#include "model/input.h"
#include "model/model.h"
#include "sharding/placement.h"
#include "storage/checkpoint.h"

namespace pscluster {
namespace {

constexpr absl::Duration kShutdownDrain = absl::Milliseconds(500);

SyncCoordinatorOptions SyncOptionsFor(const ChiefOptions& o, int num_workers) {
  SyncCoordinatorOptions s;
  s.num_workers = num_workers;
  s.replicas_to_aggregate =
      o.sync.replicas_to_aggregate() > 0 ? o.sync.replicas_to_aggregate() : num_workers;
  s.staleness = o.sync.mode() == v1::SSP ? o.sync.staleness() : -1;
  s.first_generation = absl::ToUnixMicros(absl::Now());
  return s;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ChiefServer>> ChiefServer::Create(const ChiefOptions& options) {
  if (options.cluster.task().job() != kChiefJob || options.cluster.task().index() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the chief must run as task chief:0, not ", TaskName(options.cluster.task())));
  }
  ChiefOptions resolved = options;
  if (options.config.layers_size() > 0) {
    PS_ASSIGN_OR_RETURN(resolved.model, ModelSpecFromConfig(options.config));
  }
  const int workers = NumTasks(options.cluster.cluster(), kWorkerJob);
  if (options.sync.mode() == v1::SYNC && options.sync.replicas_to_aggregate() > workers) {
    return absl::InvalidArgumentError(absl::StrCat("replicas_to_aggregate is ",
                                                   options.sync.replicas_to_aggregate(),
                                                   " but the cluster has ", workers, " workers"));
  }
  if (resolved.sync.mode() == v1::SYNC && resolved.sync.replicas_to_aggregate() == 0) {
    resolved.sync.set_replicas_to_aggregate(workers);
  }
  return std::unique_ptr<ChiefServer>(new ChiefServer(resolved));
}

ChiefServer::ChiefServer(const ChiefOptions& options)
    : options_(options),
      start_time_(absl::Now()),
      num_workers_(NumTasks(options.cluster.cluster(), kWorkerJob)),
      has_evaluator_(NumTasks(options.cluster.cluster(), kEvaluatorJob) > 0),
      registry_(options.cluster.cluster(), options.heartbeat_timeout, Clock::Real()),
      sync_(SyncOptionsFor(options, NumTasks(options.cluster.cluster(), kWorkerJob)),
            Clock::Real()),
      gate_(Clock::Real()) {
  absl::MutexLock lock(&mu_);
  progress_.set_epochs(std::max(1, options.training.epochs()));
  progress_.set_test_accuracy(-1);
  progress_.set_test_auc(-1);
  progress_.set_metrics_path(options.metrics_path);
  rate_window_start_ = absl::Now();
  phase_since_ = absl::Now();
}

ChiefServer::~ChiefServer() {
  Stop();
  if (background_.joinable()) background_.join();
  if (host_) host_->Shutdown();
}

absl::Status ChiefServer::Start() {
  ServiceHostOptions host_options = options_.host;
  // Every handler of the chief returns within 200 ms of Stop() (long waits are sliced), so the
  // server needs little time to drain; with the default 2 s, gRPC's Shutdown waited the whole
  // grace on every SIGTERM with no handler running (seen in gdb), and the chief overran a 2 s
  // termination grace period.
  host_options.shutdown_grace = std::min(host_options.shutdown_grace, kShutdownDrain);
  PS_ASSIGN_OR_RETURN(host_options.address, TaskAddress(options_.cluster.cluster(), kChiefJob, 0));
  PS_ASSIGN_OR_RETURN(host_, ServiceHost::Start(host_options, {this}));
  LOG(INFO) << "chief:0 serving on " << host_->address();
  host_->SetServing(true);
  background_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void ChiefServer::Stop() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
  // Calls to ps tasks that are gone retry for a long time; a stopping chief gives up at once.
  if (client_ != nullptr) client_->Cancel();
}

bool ChiefServer::stop_requested() const {
  absl::MutexLock lock(&mu_);
  return stop_requested_;
}

absl::Status ChiefServer::Wait() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&stop_requested_));
  }
  sync_.Finish();  // wake workers waiting for tokens
  if (background_.joinable()) background_.join();
  LOG(INFO) << "chief:0: background work stopped; closing the RPC server";
  if (host_) host_->Shutdown();
  return absl::OkStatus();
}

std::string ChiefServer::address() const { return host_ ? host_->address() : ""; }

void ChiefServer::Run() {
  absl::Status s = InitializeModel();
  if (!s.ok()) {
    LOG(ERROR) << s;
    absl::MutexLock lock(&mu_);
    SetPhaseLocked(v1::FAILED, std::string(s.message()));
    return;
  }
  if (stop_requested()) return;
  std::thread evaluation;
  if (options_.config.layers_size() > 0) evaluation = std::thread([this] { EvaluationLoop(); });
  MaintenanceLoop();
  if (evaluation.joinable()) evaluation.join();
}

int64_t ChiefServer::CurrentStep() const {
  if (options_.sync.mode() == v1::SYNC) return sync_.global_step();
  absl::MutexLock lock(&mu_);
  return progress_.global_step();
}

void ChiefServer::MaintenanceLoop() {
  const int num_ps = NumTasks(options_.cluster.cluster(), kPsJob);
  const int64_t every = options_.checkpoint_every_steps;
  // SYNC checkpoints every N steps are cut exactly at multiples of N: the coordinator pauses
  // itself there. ASYNC has no global step order; it checkpoints once N more steps are done.
  const bool exact =
      !options_.checkpoint_dir.empty() && every > 0 && options_.sync.mode() == v1::SYNC;
  int64_t last_step = CurrentStep();
  int64_t next_due = 0;
  auto schedule = [&](int64_t from) {
    last_step = from;
    next_due = exact ? (from / every + 1) * every : from + every;
    if (exact) sync_.PauseAtStep(next_due);
  };
  schedule(last_step);
  absl::Time last_time = absl::Now();
  while (!stop_requested()) {
    if (exact && CurrentStep() < next_due) {
      sync_.AwaitStep(next_due, absl::Now() + absl::Milliseconds(200));
    } else {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_requested_), absl::Milliseconds(200));
    }
    if (stop_requested()) return;
    std::vector<int> restarted;
    for (int i = 0; i < num_ps; ++i) {
      const uint64_t now = registry_.IncarnationOf(MakeTaskId(kPsJob, i));
      if (now != 0 && now != ps_incarnations_[i]) restarted.push_back(i);
    }
    if (!restarted.empty()) {
      RecoverRestartedPs(restarted);
      schedule(CurrentStep());  // the step may have gone back
      last_time = absl::Now();
      continue;
    }
    if (options_.checkpoint_dir.empty()) continue;
    bool finished;
    {
      absl::MutexLock lock(&mu_);
      finished = progress_.finished();
    }
    const int64_t step = CurrentStep();
    const bool due_steps = every > 0 && step >= next_due;
    const bool due_time = options_.checkpoint_every > absl::ZeroDuration() &&
                          absl::Now() >= last_time + options_.checkpoint_every && step > last_step;
    if (finished || (!due_steps && !due_time)) continue;
    absl::StatusOr<v1::CheckpointResponse> r =
        TakeCheckpoint(due_steps ? "every N steps" : "periodic");
    if (!r.ok()) LOG(WARNING) << "checkpoint skipped: " << r.status();
    schedule(r.ok() ? r->step() : step);
    last_time = absl::Now();
  }
}

void ChiefServer::RecoverRestartedPs(const std::vector<int>& restarted) {
  std::vector<std::string> names;
  for (int i : restarted) names.push_back(absl::StrCat("ps:", i));
  const absl::Time start = absl::Now();
  LOG(WARNING) << absl::StrJoin(names, ", ")
               << " restarted and lost its shards: holding the workers"
               << (options_.checkpoint_dir.empty()
                       ? " and creating them again from initial values (no --checkpoint_dir)"
                       : " and restoring every ps task to the latest checkpoint");
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](bool* busy) { return !*busy; }, &busy_));
    busy_ = true;
    SetPhaseLocked(v1::RECOVERING, absl::StrCat(absl::StrJoin(names, ", "), " restarted"));
  }
  // SYNC goes back to the restored step and computes the lost steps again, from the same
  // batches (a worker's batch is a function of the step): the run ends with the model an
  // undisturbed run would have. ASYNC has no global order to replay: the updates since the
  // checkpoint are lost.
  const bool rewind = options_.sync.mode() == v1::SYNC;
  // No new steps. SYNC does not wait for the step under way: it may never close (a gradient
  // went to the dead task), and it is abandoned anyway. ASYNC waits (briefly) for the workers'
  // steps to end, so no push lands on a task after its restore.
  HoldWorkersAtStepBoundary(rewind ? absl::ZeroDuration() : absl::Seconds(2)).IgnoreError();
  const int64_t step_before = CurrentStep();
  const int num_ps = NumTasks(options_.cluster.cluster(), kPsJob);
  for (int i = 0; i < num_ps; ++i) {
    ps_incarnations_[i] = registry_.IncarnationOf(MakeTaskId(kPsJob, i));
  }
  FollowMovedPs(restarted);
  absl::StatusOr<int64_t> restored = RestoreEveryPs(names, step_before, rewind ? -1 : step_before);
  std::string outcome;
  bool done = true;
  int64_t resume_step = step_before;
  if (restored.ok() && rewind) {
    resume_step = *restored;
    outcome = absl::StrCat("restored every ps task to the checkpoint of step ", *restored,
                           "; the global step goes back from ", step_before, " to ", *restored,
                           ": steps ", *restored, "..", step_before - 1,
                           " are computed again from the same batches (", step_before - *restored,
                           " steps of work lost)");
  } else if (restored.ok()) {
    outcome = absl::StrCat("restored every ps task to the checkpoint of step ", *restored,
                           "; progress lost: the updates of steps ", *restored, "..", step_before);
  } else if (restored.status().code() == absl::StatusCode::kNotFound ||
             restored.status().code() == absl::StatusCode::kDataLoss) {
    // Nothing to restore: the lost shards start again from their initial values. (After
    // DATA_LOSS, RestoreEveryPs has created them already and released its hold.)
    absl::Status created;
    if (restored.status().code() == absl::StatusCode::kNotFound) {
      CreateShardsOptions create;
      create.start_step = step_before;
      created = client_->CreateAll(options_.sync, nullptr, create);
    }
    outcome = restored.status().code() == absl::StatusCode::kNotFound
                  ? "no checkpoint to restore: the restarted shards start from their initial "
                    "values"
                  : absl::StrCat("restore failed: ", restored.status().message(),
                                 "; the restarted shards start from their initial values");
    if (!created.ok()) {
      outcome = absl::StrCat("cannot re-create the shards: ", created.message());
      done = false;
    } else if (rewind) {
      absl::StrAppend(&outcome, "; step ", step_before, " starts over");
    }
  } else {
    outcome = absl::StrCat("not finished (tried again shortly): ", restored.status().message());
    done = false;
  }
  if (!done) {
    // The maintenance loop tries again; the recovery record, if written, stays until then.
    for (int i : restarted) ps_incarnations_[i] = 0;
  }
  if (rewind && done) {
    sync_.Rewind(resume_step);
    absl::MutexLock lock(&mu_);
    progress_.set_global_step(resume_step);
  }
  if (done) FinishRecovery();
  LOG(WARNING) << "recovery of " << absl::StrJoin(names, ", ") << ": " << outcome << " (took "
               << absl::FormatDuration(absl::Now() - start) << ")";
  ResumeWorkers();
  absl::MutexLock lock(&mu_);
  busy_ = false;
  SetPhaseLocked(ServingPhase(), "");
}

void ChiefServer::FollowMovedPs(const std::vector<int>& restarted) {
  for (int ps : restarted) {
    absl::StatusOr<std::string> now = registry_.AddressOf(MakeTaskId(kPsJob, ps));
    if (!now.ok()) continue;
    std::string before;
    {
      absl::MutexLock lock(&mu_);
      if (ps >= model_.ps_addresses_size() || model_.ps_addresses(ps) == *now) continue;
      before = model_.ps_addresses(ps);
      // Workers that cannot reach the old address find this one through GetModel.
      model_.set_ps_addresses(ps, *now);
    }
    absl::Status s = client_->SetPsAddress(ps, *now);
    LOG(WARNING) << "ps:" << ps << " came back at " << *now << " (was " << before << ")"
                 << (s.ok() ? "" : absl::StrCat(": cannot follow it: ", s.message()));
  }
}

absl::StatusOr<std::vector<std::string>> ChiefServer::CommittedCheckpoints() const {
  if (options_.checkpoint_dir.empty()) return absl::NotFoundError("no --checkpoint_dir");
  PS_ASSIGN_OR_RETURN(std::vector<std::string> checkpoints,
                      ListCheckpoints(options_.checkpoint_dir));
  if (checkpoints.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no committed checkpoint in ", options_.checkpoint_dir));
  }
  return checkpoints;
}

absl::StatusOr<int64_t> ChiefServer::RestoreEveryPs(const std::vector<std::string>& why,
                                                    int64_t step_before, int64_t accumulator_step) {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> checkpoints, CommittedCheckpoints());
  // First the record, then the changes: a chief that dies from here on leaves the record, and
  // its successor restores every ps task again (RestoreEveryPs is idempotent).
  v1::RecoveryIntent intent;
  intent.set_step_before(step_before);
  for (const std::string& w : why) intent.add_restarted(w);
  intent.set_started_unix_micros(absl::ToUnixMicros(absl::Now()));
  intent.set_checkpoint_path(checkpoints.front());
  if (absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(checkpoints.front()); m.ok()) {
    intent.set_checkpoint_step(m->step());
  }
  if (absl::Status s = WriteRecoveryIntent(options_.checkpoint_dir, intent); !s.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot record the recovery before starting it: ", s.message()));
  }
  MaybeCrash(options_.crash_points, kCrashRecoveryIntentWritten);
  // Tasks that lost their shards get them again, held: no worker sees initial values.
  CreateShardsOptions create;
  create.start_step = std::max<int64_t>(step_before, 0);
  create.hold_until_restored = true;
  if (absl::Status s = client_->CreateAll(options_.sync, nullptr, create); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat("cannot re-create the shards: ", s.message()));
  }
  MaybeCrash(options_.crash_points, kCrashRecoveryCreated);
  absl::StatusOr<int64_t> restored = RestoreLatestCheckpoint(accumulator_step, &intent);
  if (restored.ok()) MaybeCrash(options_.crash_points, kCrashRecoveryRestored);
  if (restored.status().code() == absl::StatusCode::kDataLoss) {
    // No checkpoint restores: let the held shards serve what they have.
    create.hold_until_restored = false;
    absl::Status released = client_->CreateAll(options_.sync, nullptr, create);
    if (!released.ok()) LOG(ERROR) << "cannot release the held shards: " << released;
  }
  return restored;
}

void ChiefServer::FinishRecovery() {
  if (options_.checkpoint_dir.empty()) return;
  if (absl::Status s = ClearRecoveryIntent(options_.checkpoint_dir); !s.ok()) {
    // Harmless but wasteful: the next chief would restore again.
    LOG(ERROR) << "cannot clear the recovery record: " << s;
  }
}

absl::StatusOr<int64_t> ChiefServer::RestoreLatestCheckpoint(int64_t accumulator_step,
                                                             v1::RecoveryIntent* intent) {
  PS_ASSIGN_OR_RETURN(std::vector<std::string> checkpoints, CommittedCheckpoints());
  // With the midway crash point armed, ps:0 is restored alone first, then the crash.
  const bool one_first = options_.crash_points != nullptr &&
                         options_.crash_points->point() == kCrashRecoveryRestoreMidway;
  absl::Status last_error;
  for (const std::string& path : checkpoints) {
    absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(path);
    if (!manifest.ok()) {
      last_error = manifest.status();
      LOG(ERROR) << "checkpoint " << path << " is unreadable: " << manifest.status()
                 << "; falling back to the previous one";
      continue;
    }
    if (intent != nullptr && intent->checkpoint_path() != path) {
      intent->set_checkpoint_path(path);
      intent->set_checkpoint_step(manifest->step());
      if (absl::Status s = WriteRecoveryIntent(options_.checkpoint_dir, *intent); !s.ok()) {
        return absl::UnavailableError(
            absl::StrCat("cannot record the recovery before starting it: ", s.message()));
      }
    }
    const std::vector<v1::SavedShard> saved(manifest->shards().begin(), manifest->shards().end());
    const int64_t acc_step = accumulator_step >= 0 ? accumulator_step : manifest->step();
    const absl::Time start = absl::Now();
    absl::Status s;
    if (one_first) {
      const std::vector<int> first = {0};
      std::vector<int> rest;
      for (int ps = 1; ps < client_->num_ps(); ++ps) rest.push_back(ps);
      s = client_->RestoreShards(path, saved, acc_step, &first);
      if (s.ok()) MaybeCrash(options_.crash_points, kCrashRecoveryRestoreMidway);
      if (s.ok() && !rest.empty()) s = client_->RestoreShards(path, saved, acc_step, &rest);
    } else {
      s = client_->RestoreShards(path, saved, acc_step);
    }
    if (s.ok()) {
      LOG(INFO) << "restored checkpoint " << path << " (step " << manifest->step()
                << ", written by " << manifest->num_ps() << " ps tasks, restored into "
                << NumTasks(options_.cluster.cluster(), kPsJob) << ") in "
                << absl::FormatDuration(absl::Now() - start);
      return manifest->step();
    }
    if (s.code() == absl::StatusCode::kUnavailable || s.code() == absl::StatusCode::kCancelled) {
      // A ps task is unreachable (or the chief is stopping): not the checkpoint's fault.
      return s;
    }
    last_error = s;
    LOG(ERROR) << "checkpoint " << path << " cannot be restored: " << s
               << "; falling back to the previous one";
  }
  return absl::DataLossError(absl::StrCat("no checkpoint in ", options_.checkpoint_dir,
                                          " restores: ", last_error.message()));
}

absl::Status ChiefServer::HoldWorkersAtStepBoundary(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  if (options_.sync.mode() != v1::ASYNC) {
    if (sync_.PauseAtStepBoundary(deadline)) return absl::OkStatus();
    std::vector<std::string> slow;
    for (int w : sync_.waiting_for()) slow.push_back(absl::StrCat("worker:", w));
    return absl::UnavailableError(
        absl::StrCat("no step boundary within ", absl::FormatDuration(timeout), " (step ",
                     sync_.global_step(), " waits for ", absl::StrJoin(slow, ", "), ")"));
  }
  // ASYNC: every worker inside a step comes back to the gate, except those that are gone (no
  // heartbeat): they push nothing more.
  while (!gate_.Close(std::min(deadline, absl::Now() + absl::Milliseconds(200)))) {
    for (const v1::TaskId& t : registry_.NotServing()) {
      if (t.job() == kWorkerJob) gate_.Leave(t.index());
    }
    if (stop_requested()) return absl::CancelledError("the chief is stopping");
    if (absl::Now() >= deadline) {
      std::vector<std::string> slow;
      for (int w : gate_.inside()) slow.push_back(absl::StrCat("worker:", w));
      return absl::UnavailableError(
          absl::StrCat("no step boundary within ", absl::FormatDuration(timeout), " (",
                       absl::StrJoin(slow, ", "), " still inside a step)"));
    }
  }
  return absl::OkStatus();
}

void ChiefServer::ResumeWorkers() {
  sync_.Resume();
  gate_.Open();
}

absl::StatusOr<v1::CheckpointResponse> ChiefServer::TakeCheckpoint(const std::string& reason,
                                                                   bool require_ready) {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError("the chief has no --checkpoint_dir: checkpoints are off");
  }
  {
    absl::MutexLock lock(&mu_);
    if (require_ready && !model_ready_) {
      return absl::UnavailableError("the model is not ready yet");
    }
    mu_.Await(absl::Condition(
        +[](bool* busy) { return !*busy; }, &busy_));
    busy_ = true;
  }
  auto done = [this](absl::StatusOr<v1::CheckpointResponse> r) {
    ResumeWorkers();
    absl::MutexLock lock(&mu_);
    busy_ = false;
    return r;
  };
  if (absl::Status held = HoldWorkersAtStepBoundary(absl::Seconds(10)); !held.ok()) {
    return done(held);
  }
  const int64_t step = CurrentStep();
  std::string path = absl::StrCat(options_.checkpoint_dir, "/", CheckpointDirName(step));
  v1::CheckpointResponse resp;
  resp.set_step(step);
  if (absl::StatusOr<v1::CheckpointManifest> existing = ReadManifest(path); existing.ok()) {
    if (options_.sync.mode() == v1::SYNC) {
      // At a step boundary the model is a function of the step: this one is saved already.
      resp.set_path(path);
      resp.set_bytes(existing->bytes());
      resp.set_micros(existing->write_micros());
      return done(resp);
    }
    // ASYNC and SSP apply updates without moving the global step: a save captures them in a
    // checkpoint of its own, never one written before (and never into a committed one).
    int64_t sequence = 1;
    do {
      path = absl::StrCat(options_.checkpoint_dir, "/", CheckpointDirName(step, sequence++));
    } while (ReadManifest(path).ok());
  }
  resp.set_path(path);
  std::error_code ec;
  std::filesystem::remove_all(path, ec);  // an earlier, uncommitted attempt
  const absl::Time start = absl::Now();
  int64_t bytes = 0;
  absl::StatusOr<std::vector<v1::SavedShard>> saved = client_->SaveShards(path, step, &bytes);
  if (!saved.ok()) return done(saved.status());
  // Commit only a whole model: every partition, and every table from every ps task. A ps task
  // that restarted since its shards were created has nothing to give.
  const int num_ps = NumTasks(options_.cluster.cluster(), kPsJob);
  int64_t dense = 0, tables = 0;
  for (const v1::SavedShard& shard : *saved) (shard.is_table() ? tables : dense) += 1;
  if (dense != client_->placement().partitions_size() ||
      tables != static_cast<int64_t>(client_->model().tables_size()) * num_ps) {
    std::filesystem::remove_all(path, ec);
    return done(absl::FailedPreconditionError(absl::StrCat(
        "the ps tasks gave ", dense, " of ", client_->placement().partitions_size(),
        " dense partitions and ", tables, " of ", client_->model().tables_size() * num_ps,
        " table parts (did a ps task restart?); not committed")));
  }
  v1::CheckpointManifest manifest;
  manifest.set_step(step);
  manifest.set_created_unix_micros(absl::ToUnixMicros(absl::Now()));
  manifest.set_num_ps(NumTasks(options_.cluster.cluster(), kPsJob));
  *manifest.mutable_model() = client_->model();
  *manifest.mutable_placement() = client_->placement();
  *manifest.mutable_config() = options_.config;
  *manifest.mutable_sync() = options_.sync;
  *manifest.mutable_cluster() = options_.cluster.cluster();
  manifest.mutable_shards()->Add(saved->begin(), saved->end());
  manifest.set_bytes(bytes);
  manifest.set_write_micros(absl::ToInt64Microseconds(absl::Now() - start));
  absl::Status committed = CommitManifest(path, manifest, options_.crash_points);
  if (!committed.ok()) return done(committed);
  resp.set_bytes(bytes);
  resp.set_micros(manifest.write_micros());
  LOG(INFO) << absl::StrFormat("checkpoint of step %d committed (%s): %.2f MiB in %.1f ms at %s",
                               step, reason, bytes / 1048576.0, resp.micros() / 1000.0, path);
  absl::Status pruned = PruneCheckpoints(options_.checkpoint_dir, options_.keep_checkpoints);
  if (!pruned.ok()) LOG(WARNING) << "cannot delete old checkpoints: " << pruned;
  {
    absl::MutexLock lock(&mu_);
    last_checkpoint_ = path;
  }
  return done(resp);
}

grpc::Status ChiefServer::Checkpoint(grpc::ServerContext*, const v1::CheckpointRequest*,
                                     v1::CheckpointResponse* resp) {
  absl::StatusOr<v1::CheckpointResponse> r = TakeCheckpoint("requested");
  if (!r.ok()) return ToGrpcStatus(r.status());
  *resp = *std::move(r);
  return grpc::Status::OK;
}

absl::Status ChiefServer::InitializeModel() {
  const int num_ps = NumTasks(options_.cluster.cluster(), kPsJob);
  while (!registry_.AwaitServing({std::string(kPsJob)}, absl::Now() + absl::Milliseconds(200))) {
    if (stop_requested()) return absl::OkStatus();
  }
  std::vector<std::string> addresses;
  for (int i = 0; i < num_ps; ++i) {
    addresses.push_back(*registry_.AddressOf(MakeTaskId(kPsJob, i)));
  }
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(options_.model, num_ps, options_.placement);
  if (!placement.ok()) {
    return absl::Status(placement.status().code(),
                        absl::StrCat("cannot place the model: ", placement.status().message()));
  }
  LOG(INFO) << "placement of " << options_.model.variables_size() << " variables and "
            << options_.model.tables_size() << " tables on " << num_ps << " ps tasks:\n"
            << PlacementDebugString(*placement);
  {
    absl::MutexLock lock(&mu_);
    SetPhaseLocked(v1::CREATING_VARIABLES, "");
  }
  ParameterClientOptions client_options;
  client_options.max_attempts = 20;
  // Higher than any earlier chief's: recorded beside the checkpoints when there are any (so a
  // clock that went back cannot lower it), else the start time.
  client_options.chief_epoch = absl::ToUnixMicros(start_time_);
  if (!options_.checkpoint_dir.empty()) {
    absl::StatusOr<int64_t> epoch =
        NextChiefEpoch(options_.checkpoint_dir, client_options.chief_epoch);
    if (!epoch.ok()) return epoch.status();
    client_options.chief_epoch = *epoch;
  }
  LOG(INFO) << "chief epoch " << client_options.chief_epoch
            << ": ps tasks refuse control requests of earlier chiefs";
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<ParameterClient> client,
      ParameterClient::Create(options_.model, *placement,
                              std::make_unique<GrpcPsTransport>(addresses, options_.ps_transport),
                              client_options));
  {
    // Stop() cancels the client's retries; one that came first cancels it here.
    absl::MutexLock lock(&mu_);
    client_ = std::move(client);
    if (stop_requested_) client_->Cancel();
  }
  for (int i = 0; i < num_ps; ++i) {
    ps_incarnations_.push_back(registry_.IncarnationOf(MakeTaskId(kPsJob, i)));
  }
  // With a checkpoint to start from, new shards wait for it (held): a chief that dies before
  // restoring leaves them refusing service, never serving initial values as if trained.
  bool have_checkpoint = false;
  if (!options_.checkpoint_dir.empty()) {
    absl::StatusOr<std::vector<std::string>> listed = ListCheckpoints(options_.checkpoint_dir);
    have_checkpoint = listed.ok() && !listed->empty();
  }
  CreateShardsOptions create;
  create.hold_until_restored = have_checkpoint;
  int64_t fresh = 0;
  std::vector<int> awaiting;
  absl::Status created = client_->CreateAll(options_.sync, &fresh, create, &awaiting);
  if (!created.ok()) {
    return absl::Status(created.code(),
                        absl::StrCat("cannot create the variables: ", created.message()));
  }
  // Whether the cluster's state can be trusted: not if a recovery was under way when the last
  // chief stopped (its record is there) or a ps task still waits for a restore.
  std::vector<std::string> why;
  if (!options_.checkpoint_dir.empty()) {
    absl::StatusOr<v1::RecoveryIntent> unfinished = ReadRecoveryIntent(options_.checkpoint_dir);
    if (unfinished.ok()) {
      LOG(WARNING) << "the previous chief was recovering ("
                   << absl::StrJoin(unfinished->restarted(), ", ") << " restarted; restoring "
                   << unfinished->checkpoint_path() << ") when it stopped: redoing the recovery";
      why.assign(unfinished->restarted().begin(), unfinished->restarted().end());
    } else if (unfinished.status().code() != absl::StatusCode::kNotFound) {
      LOG(ERROR) << unfinished.status() << ": treating it as a recovery under way";
      why.push_back("an unreadable recovery record");
    }
  }
  for (int ps : awaiting) why.push_back(absl::StrCat("ps:", ps, " waiting for a restore"));
  int64_t restored_step = -1;
  if ((fresh > 0 || !why.empty()) && have_checkpoint) {
    // New variables, or a state half recovered: every ps task goes to the newest checkpoint.
    if (why.empty()) why.push_back("new variables");
    {
      absl::MutexLock lock(&mu_);
      SetPhaseLocked(v1::RESTORING, absl::StrJoin(why, ", "));
    }
    absl::StatusOr<int64_t> restored = RestoreEveryPs(why, -1, -1);
    if (restored.ok()) {
      restored_step = *restored;
      // A new generation: workers drop whatever they computed for the steps after it.
      sync_.Rewind(restored_step);
      FinishRecovery();
      absl::MutexLock lock(&mu_);
      progress_.set_global_step(restored_step);
      steps_before_ = restored_step;
    } else if (restored.status().code() == absl::StatusCode::kDataLoss) {
      LOG(ERROR) << restored.status() << "; starting from the values the ps tasks hold";
      FinishRecovery();
    } else {
      return absl::Status(restored.status().code(), absl::StrCat("cannot restore the checkpoint: ",
                                                                 restored.status().message()));
    }
  } else if (fresh == 0) {
    LOG(INFO) << "the ps tasks already hold every variable: resuming from the cluster's state";
  }
  if (options_.sync.mode() == v1::SYNC && restored_step < 0) {
    // After a chief restart the ps tasks still hold the model: the steps their accumulators
    // have applied are the global step, so workers neither repeat nor skip steps.
    int64_t applied = 0;
    for (int ps = 0; ps < num_ps; ++ps) {
      absl::StatusOr<v1::ListShardsResponse> shards = client_->ListShards(ps);
      if (!shards.ok()) return shards.status();
      for (const v1::ShardStats& s : shards->shards()) {
        if (!s.is_table()) applied = std::max(applied, s.applied_step());
      }
    }
    if (applied > 0) {
      LOG(INFO) << "recovered global step " << applied
                << " from the ps tasks (steps their shards have applied)";
      sync_.SetGlobalStep(applied);
    }
  }
  if (!options_.checkpoint_dir.empty() && !have_checkpoint) {
    // A checkpoint before the first step (as TensorFlow's chief saves one at step 0): a ps task
    // that dies before the first periodic checkpoint is then restored with the others, and sync
    // training replays from the start, instead of a restarted task's initial values meeting the
    // others' trained ones.
    absl::StatusOr<v1::CheckpointResponse> first =
        TakeCheckpoint("before the first step", /*require_ready=*/false);
    if (!first.ok()) LOG(WARNING) << "no checkpoint before the first step: " << first.status();
  }
  absl::MutexLock lock(&mu_);
  *model_.mutable_model() = options_.model;
  *model_.mutable_placement() = *placement;
  for (const std::string& a : addresses) model_.add_ps_addresses(a);
  *model_.mutable_sync() = options_.sync;
  *model_.mutable_config() = options_.config;
  *model_.mutable_training() = options_.training;
  model_ready_ = true;
  SetPhaseLocked(ServingPhase(), "");
  LOG(INFO) << "every variable is created and initialized on its ps task";
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> ChiefServer::OwnEvaluation(int64_t step) {
  if (own_evaluator_ == nullptr) {
    PS_ASSIGN_OR_RETURN(Dataset test, LoadDataset(options_.training.data(),
                                                  options_.config.input_dim(), /*train=*/false));
    PS_ASSIGN_OR_RETURN(own_evaluator_,
                        Evaluator::Create(options_.config, client_.get(), std::move(test)));
  }
  return own_evaluator_->Evaluate(step);
}

void ChiefServer::RecordEvaluation(const EvalResult& r, const std::string& by) {
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    progress_.set_test_accuracy(r.accuracy);
    progress_.set_test_loss(r.loss);
    progress_.set_test_auc(r.auc);
    progress_.set_test_step(r.step);
    progress_.set_test_evaluated_by(by);
    const double elapsed = absl::ToDoubleSeconds(absl::Now() - start_time_);
    line = MetricsJsonLine(r, progress_.loss(), progress_.examples_per_second(), elapsed, by);
  }
  LOG(INFO) << absl::StrFormat("evaluation at step %d by %s: test loss %.4f, accuracy %.4f%s",
                               r.step, by, r.loss, r.accuracy,
                               r.auc >= 0 ? absl::StrFormat(", AUC %.4f", r.auc) : "");
  if (options_.metrics_path.empty()) return;
  absl::MutexLock lock(&metrics_mu_);
  std::ofstream metrics(options_.metrics_path, std::ios::app);
  metrics << line << std::endl;
  if (!metrics) LOG(WARNING) << "cannot append to the metrics file " << options_.metrics_path;
}

void ChiefServer::EvaluationLoop() {
  // With an evaluator task the chief computes nothing: the evaluator reports (ReportEvaluation)
  // and is asked for the final evaluation; the chief evaluates only if that does not come.
  absl::Time next_eval =
      has_evaluator_ ? absl::InfiniteFuture() : absl::Now() + options_.eval_every;
  while (true) {
    bool all_finished = false;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this, next_eval]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_requested_ || progress_.workers_finished() >= num_workers_ ||
               absl::Now() >= next_eval;
      };
      mu_.AwaitWithDeadline(absl::Condition(&wake), next_eval);
      if (stop_requested_) return;
      all_finished = num_workers_ > 0 && progress_.workers_finished() >= num_workers_;
    }
    const int64_t step = CurrentStep();
    if (!all_finished) {
      absl::StatusOr<EvalResult> r = OwnEvaluation(step);
      next_eval = absl::Now() + options_.eval_every;
      if (r.ok()) {
        RecordEvaluation(*r, "chief");
      } else {
        LOG(WARNING) << "evaluation failed: " << r.status();
      }
      continue;
    }
    // The trained model is saved before anyone is told training is over.
    if (!options_.checkpoint_dir.empty()) {
      absl::StatusOr<v1::CheckpointResponse> c = TakeCheckpoint("training finished");
      if (!c.ok()) LOG(WARNING) << "final checkpoint failed: " << c.status();
    }
    bool evaluated = false;
    if (has_evaluator_) {
      absl::MutexLock lock(&mu_);
      final_step_ = step;
      SetPhaseLocked(v1::FINAL_EVALUATION,
                     absl::StrCat("waiting for evaluator:0 to evaluate step ", step));
      auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_requested_ || final_evaluated_;
      };
      mu_.AwaitWithTimeout(absl::Condition(&done), options_.final_eval_timeout);
      if (stop_requested_) return;
      evaluated = final_evaluated_;
      if (!evaluated) {
        LOG(WARNING) << "evaluator:0 sent no evaluation of the final step " << step << " within "
                     << absl::FormatDuration(options_.final_eval_timeout)
                     << ": the chief evaluates it";
      }
    }
    if (!evaluated) {
      absl::StatusOr<EvalResult> r = OwnEvaluation(step);
      if (r.ok()) {
        RecordEvaluation(*r, "chief");
      } else {
        LOG(WARNING) << "final evaluation failed: " << r.status();
      }
    }
    absl::MutexLock lock(&mu_);
    progress_.set_finished(true);
    SetPhaseLocked(v1::FINISHED, "");
    LOG(INFO) << absl::StrFormat("training finished: final test accuracy %.4f (by %s)",
                                 progress_.test_accuracy(), progress_.test_evaluated_by());
    return;
  }
}

grpc::Status ChiefServer::ReportEvaluation(grpc::ServerContext*,
                                           const v1::ReportEvaluationRequest* req,
                                           v1::ReportEvaluationResponse* resp) {
  PS_RETURN_IF_ERROR_GRPC(CheckEvaluationReport(*req));
  EvalResult r;
  r.step = req->step();
  r.examples = req->examples();
  r.loss = req->loss();
  r.accuracy = req->accuracy();
  r.auc = req->auc();
  {
    absl::MutexLock lock(&mu_);
    if (req->final()) {
      if (progress_.finished() && progress_.test_evaluated_by() == TaskName(req->task()) &&
          progress_.test_step() == req->step()) {
        resp->set_finished(true);  // a retry of the final report already taken
        return grpc::Status::OK;
      }
      if (phase_ != v1::FINAL_EVALUATION || final_evaluated_) {
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                            absl::StrCat("a final evaluation is not expected: the chief is ",
                                         v1::ChiefPhase_Name(phase_)));
      }
      if (req->step() != final_step_) {
        return grpc::Status(
            grpc::StatusCode::FAILED_PRECONDITION,
            absl::StrCat("the final model is that of step ", final_step_, ", not ", req->step()));
      }
    }
  }
  RecordEvaluation(r, TaskName(req->task()));
  absl::MutexLock lock(&mu_);
  if (req->final()) final_evaluated_ = true;
  resp->set_finished(progress_.finished());
  return grpc::Status::OK;
}

absl::Status ChiefServer::CheckEvaluationReport(const v1::ReportEvaluationRequest& req) const {
  if (!has_evaluator_) {
    return absl::FailedPreconditionError(
        "this cluster has no evaluator task: the chief evaluates the model itself");
  }
  if (req.task().job() != kEvaluatorJob || req.task().index() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluations are reported by the evaluator task (evaluator:0), not by ",
                     TaskName(req.task())));
  }
  const int64_t now = CurrentStep();
  if (req.step() < 0 || req.step() > now) {
    return absl::InvalidArgumentError(absl::StrCat(
        "evaluation of step ", req.step(), ": expected a step in [0, ", now, "], the global step"));
  }
  if (req.examples() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluation of ", req.examples(), " examples: expected at least 1"));
  }
  if (!std::isfinite(req.loss()) || req.loss() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluation loss ", req.loss(), ": expected a finite value >= 0"));
  }
  if (!(req.accuracy() >= 0 && req.accuracy() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluation accuracy ", req.accuracy(), ": expected a value in [0, 1]"));
  }
  if (req.auc() != -1 && !(req.auc() >= 0 && req.auc() <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluation AUC ", req.auc(), ": expected a value in [0, 1], or -1 for none"));
  }
  return absl::OkStatus();
}

grpc::Status ChiefServer::RegisterTask(grpc::ServerContext*, const v1::RegisterTaskRequest* req,
                                       v1::RegisterTaskResponse* resp) {
  PS_RETURN_IF_ERROR_GRPC(registry_.Register(req->task(), req->address(), req->incarnation()));
  resp->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  return grpc::Status::OK;
}

grpc::Status ChiefServer::Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* req,
                                    v1::HeartbeatResponse* resp) {
  absl::StatusOr<bool> known =
      registry_.Heartbeat(req->task(), req->incarnation(), req->step(), req->detail());
  if (!known.ok()) return ToGrpcStatus(known.status());
  resp->set_reregister(!*known);
  return grpc::Status::OK;
}

grpc::Status ChiefServer::GetModel(grpc::ServerContext* ctx, const v1::GetModelRequest* req,
                                   v1::GetModelResponse* resp) {
  absl::MutexLock lock(&mu_);
  auto done = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return model_ready_ || stop_requested_; };
  while (req->wait_until_ready() && !done() && !ctx->IsCancelled() &&
         std::chrono::system_clock::now() < ctx->deadline()) {
    mu_.AwaitWithTimeout(absl::Condition(&done), absl::Milliseconds(100));
  }
  if (!model_ready_) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        absl::StrCat("the model is not ready: ", init_state_));
  }
  *resp = model_;
  resp->set_global_step(sync_.global_step());
  return grpc::Status::OK;
}

grpc::Status ChiefServer::AcquireToken(grpc::ServerContext* ctx, const v1::AcquireTokenRequest* req,
                                       v1::AcquireTokenResponse* resp) {
  if (req->worker() < 0 || req->worker() >= num_workers_) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("worker ", req->worker(), " is not in the cluster (",
                                     num_workers_, " workers)"));
  }
  {
    // Until the chief knows the global step (a restarted chief reads it from the ps tasks),
    // no token is granted and no report is counted.
    absl::MutexLock lock(&mu_);
    if (!model_ready_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("the chief is starting: ", init_state_));
    }
  }
  // Wait in slices so a cancelled call or a stopping chief ends the wait.
  const absl::Time deadline = absl::FromChrono(ctx->deadline());
  if (options_.sync.mode() == v1::ASYNC) {
    // No waiting for other workers; only a checkpoint or a recovery closes the gate.
    while (true) {
      const StepGate::Result r =
          gate_.Pass(req->worker(), std::min(deadline, absl::Now() + absl::Milliseconds(200)),
                     req->pushes_in_flight());
      if (r == StepGate::Result::kPassed) break;
      if (r == StepGate::Result::kDrain) {
        resp->set_drain(true);
        return grpc::Status::OK;
      }
      if (ctx->IsCancelled() || absl::Now() >= deadline || stop_requested()) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            absl::StrCat("worker ", req->worker(),
                                         " is held: a checkpoint or a recovery is under way"));
      }
    }
    resp->set_step(req->step() + 1);
    NoteGranted(req->worker(), resp->step() + 1);
    return grpc::Status::OK;
  }
  while (true) {
    const absl::Time slice = std::min(deadline, absl::Now() + absl::Milliseconds(200));
    SyncCoordinator::Token token =
        sync_.AcquireToken(req->worker(), req->step(), req->generation(), slice);
    if (token.granted || token.finished) {
      if (token.granted) NoteGranted(req->worker(), token.step + 1);
      resp->set_step(token.step);
      resp->set_generation(token.generation);
      resp->set_finished(token.finished && !token.granted);
      if (token.finished) resp->set_finished(true);
      return grpc::Status::OK;
    }
    if (ctx->IsCancelled() || absl::Now() >= deadline || stop_requested()) {
      return grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          absl::StrCat("no token yet for worker ", req->worker(), " after step ", req->step()));
    }
  }
}

namespace {

std::string PhaseName(v1::ChiefPhase phase) {
  switch (phase) {
    case v1::WAITING_FOR_PS:
      return "waiting for the ps tasks";
    case v1::CREATING_VARIABLES:
      return "creating variables on the ps tasks";
    case v1::RESTORING:
      return "restoring a checkpoint";
    case v1::MODEL_READY:
      return "model ready";
    case v1::TRAINING:
      return "training";
    case v1::RECOVERING:
      return "recovering";
    case v1::FINAL_EVALUATION:
      return "final evaluation";
    case v1::FINISHED:
      return "training finished";
    case v1::FAILED:
      return "failed";
    default:
      return "unknown";
  }
}

}  // namespace

void ChiefServer::SetPhaseLocked(v1::ChiefPhase phase, const std::string& detail) {
  if (phase != phase_ || detail != phase_detail_) {
    LOG(INFO) << "chief: " << PhaseName(phase_) << " -> " << PhaseName(phase)
              << (detail.empty() ? "" : absl::StrCat(" (", detail, ")"));
  }
  if (phase != phase_) phase_since_ = absl::Now();
  phase_ = phase;
  phase_detail_ = detail;
  init_state_ = detail.empty() ? PhaseName(phase) : absl::StrCat(PhaseName(phase), ": ", detail);
}

v1::ChiefPhase ChiefServer::ServingPhase() const {
  return num_workers_ > 0 && options_.config.layers_size() > 0 ? v1::TRAINING : v1::MODEL_READY;
}

void ChiefServer::NoteGranted(int w, int64_t steps) {
  absl::MutexLock lock(&mu_);
  WorkerProgress& p = workers_[w];
  p.granted_steps = std::max(p.granted_steps, steps);
}

grpc::Status ChiefServer::ReportStep(grpc::ServerContext*, const v1::ReportStepRequest* req,
                                     v1::ReportStepResponse* resp) {
  {
    absl::MutexLock lock(&mu_);
    if (!model_ready_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          absl::StrCat("the chief is starting: ", init_state_));
    }
    // Checked before anything is counted: a refused report changes nothing.
    WorkerView view;
    if (req->worker() >= 0 && req->worker() < num_workers_) {
      view.registered = registry_.IncarnationOf(MakeTaskId(kWorkerJob, req->worker())) != 0;
      auto it = workers_.find(req->worker());
      if (it != workers_.end()) view.granted_steps = it->second.granted_steps;
    }
    PS_RETURN_IF_ERROR_GRPC(
        CheckStepReport(*req, options_.sync.mode(), num_workers_, sync_.global_step(), view));
  }
  if (options_.sync.mode() != v1::ASYNC && req->examples() > 0) {
    sync_.ReportStep(req->worker(), req->step() - 1, req->generation());
  }
  if (req->finished()) {
    sync_.WorkerFinished(req->worker());
    gate_.Leave(req->worker());
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  if (first_report_ == absl::InfinitePast()) {
    first_report_ = now;
    rate_window_start_ = now;
  }
  WorkerProgress& w = workers_[req->worker()];
  w.steps = std::max(w.steps, req->step());
  w.epoch = req->epoch();
  if (req->finished() && !w.finished) {
    w.finished = true;
    progress_.set_workers_finished(progress_.workers_finished() + 1);
    LOG(INFO) << "worker:" << req->worker() << " finished after " << w.steps << " steps ("
              << progress_.workers_finished() << " of " << num_workers_ << " done)";
  }
  total_examples_ += req->examples();
  rate_window_examples_ += req->examples();
  const double window = absl::ToDoubleSeconds(now - rate_window_start_);
  if (window >= 2.0) {
    progress_.set_examples_per_second(rate_window_examples_ / window);
    rate_window_start_ = now;
    rate_window_examples_ = 0;
  }
  if (req->examples() > 0) {
    progress_.set_loss(progress_.loss() == 0 ? req->loss()
                                             : 0.8 * progress_.loss() + 0.2 * req->loss());
    progress_.set_max_staleness(std::max(progress_.max_staleness(), req->max_staleness()));
    progress_.set_mean_staleness(0.8 * progress_.mean_staleness() + 0.2 * req->mean_staleness());
  }
  int64_t steps = 0;
  int32_t epoch = 0;
  for (const auto& [i, p] : workers_) {
    steps += p.steps;
    epoch = std::max(epoch, p.epoch);
  }
  progress_.set_global_step(options_.sync.mode() == v1::SYNC ? sync_.global_step()
                                                             : steps_before_ + steps);
  progress_.set_epoch(epoch);
  resp->set_global_step(progress_.global_step());
  return grpc::Status::OK;
}

grpc::Status ChiefServer::GetClusterStatus(grpc::ServerContext*, const v1::GetClusterStatusRequest*,
                                           v1::ClusterStatus* resp) {
  const absl::Time now = absl::Now();
  for (v1::TaskStatus& t : registry_.Snapshot()) {
    if (t.task().job() == kChiefJob) {
      // The chief does not heartbeat itself: if it answers, it is serving.
      t.set_address(address());
      t.set_health(v1::HEALTH_SERVING);
      t.set_start_unix_micros(absl::ToUnixMicros(start_time_));
      t.set_uptime_micros(absl::ToInt64Microseconds(now - start_time_));
      t.set_step(sync_.global_step());
    }
    *resp->add_tasks() = std::move(t);
  }
  std::vector<std::string> names;
  for (const v1::TaskId& t : registry_.NotServing()) {
    if (t.job() == kChiefJob) continue;
    names.push_back(TaskName(t));
    *resp->add_waiting_for() = t;
  }
  resp->set_global_step(CurrentStep());
  *resp->mutable_sync() = options_.sync;
  absl::MutexLock lock(&mu_);
  std::string state = names.empty() ? absl::StrCat("all tasks serving; ", init_state_)
                                    : absl::StrCat("waiting for ", absl::StrJoin(names, ", "),
                                                   " (no heartbeat); ", init_state_);
  if (options_.sync.mode() != v1::ASYNC && model_ready_ && !progress_.finished()) {
    std::vector<std::string> slow;
    for (int w : sync_.waiting_for()) slow.push_back(absl::StrCat("worker:", w));
    if (!slow.empty()) {
      absl::StrAppend(&state, "; step ", sync_.global_step(), " waits for ",
                      absl::StrJoin(slow, ", "));
    }
  }
  for (const auto& [w, n] : sync_.dropped_per_worker()) {
    absl::StrAppend(&state, "; worker:", w, " had ", n, " late gradients dropped");
  }
  resp->set_state(state);
  resp->set_last_checkpoint(last_checkpoint_);
  resp->set_phase(phase_);
  resp->set_phase_detail(phase_detail_);
  resp->set_phase_since_unix_micros(absl::ToUnixMicros(phase_since_));
  *resp->mutable_progress() = progress_;
  for (int w = 0; w < num_workers_; ++w) {
    auto it = workers_.find(w);
    resp->mutable_progress()->add_worker_steps(it == workers_.end() ? 0 : it->second.steps);
  }
  resp->mutable_progress()->set_max_lead(sync_.max_lead());
  resp->mutable_progress()->set_elapsed_seconds(
      first_report_ == absl::InfinitePast() ? 0 : absl::ToDoubleSeconds(now - first_report_));
  return grpc::Status::OK;
}

}  // namespace pscluster
