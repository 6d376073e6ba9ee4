#include "chief/coordinator.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/chief_epoch.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"
#include "evaluator/eval_result.h"
#include "glog/logging.h"
#include "model/model.h"
#include "sharding/placement.h"
#include "storage/checkpoint.h"

namespace pscluster {
namespace {

// Long waits are cut in slices this long, so that a stopping chief or a cancelled call ends
// them.
constexpr absl::Duration kWaitSlice = absl::Milliseconds(200);

SyncCoordinatorOptions SyncOptionsFor(const CoordinatorOptions& o, int num_workers) {
  SyncCoordinatorOptions s;
  s.num_workers = num_workers;
  s.replicas_to_aggregate =
      o.sync.replicas_to_aggregate() > 0 ? o.sync.replicas_to_aggregate() : num_workers;
  s.staleness = o.sync.mode() == v1::SSP ? o.sync.staleness() : -1;
  s.first_generation = absl::ToUnixMicros(o.clock->Now());
  return s;
}

// What replication 2 covers so far (docs/replication.md): dense variables in every mode, and
// tables in async and SSP mode, without admission or eviction. A sync step's table gradients,
// and the rows admission and eviction create and drop, are not forwarded yet: such a table's
// backup would fall behind, and a failover onto it would lose updates, so the chief refuses
// those models up front.
absl::Status CheckReplication(const CoordinatorOptions& options, int num_ps) {
  const int r = options.placement.replication();
  if (r < 0 || r > 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("replication must be 1 (no backup) or 2 (a primary and a backup), not ", r));
  }
  if (r < 2) return absl::OkStatus();
  if (num_ps < 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replication 2 needs at least 2 ps tasks (a backup on another task), the cluster has ",
        num_ps));
  }
  for (const v1::TableSpec& t : options.model.tables()) {
    if (options.sync.mode() == v1::SYNC) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replication 2 covers embedding tables in async and SSP mode only so far: table ",
          t.name(), "'s sync steps are not forwarded to backups yet (docs/replication.md)"));
    }
    if (t.has_admission() || t.has_eviction()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replication 2 covers embedding tables without admission or eviction only so far: "
          "table ",
          t.name(), " has ", t.has_admission() ? "admission" : "eviction",
          ", whose decisions are not forwarded to backups yet (docs/replication.md)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    const CoordinatorOptions& options) {
  if (options.cluster.task().job() != kChiefJob || options.cluster.task().index() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the chief must run as task chief:0, not ", TaskName(options.cluster.task())));
  }
  if (options.clock == nullptr || !options.make_ps_transport) {
    return absl::InvalidArgumentError("the coordinator needs a clock and a ps transport factory");
  }
  CoordinatorOptions resolved = options;
  if (HasNetwork(options.config)) {
    PS_ASSIGN_OR_RETURN(resolved.model, ModelSpecFromConfig(options.config));
  }
  const int workers = NumTasks(options.cluster.cluster(), kWorkerJob);
  if (options.sync.mode() == v1::SYNC && options.sync.replicas_to_aggregate() > workers) {
    return absl::InvalidArgumentError(absl::StrCat("replicas_to_aggregate is ",
                                                   options.sync.replicas_to_aggregate(),
                                                   " but the cluster has ", workers, " workers"));
  }
  PS_RETURN_IF_ERROR(CheckReplication(resolved, NumTasks(options.cluster.cluster(), kPsJob)));
  if (resolved.sync.mode() == v1::SYNC && resolved.sync.replicas_to_aggregate() == 0) {
    resolved.sync.set_replicas_to_aggregate(workers);
  }
  return std::unique_ptr<Coordinator>(new Coordinator(resolved));
}

Coordinator::Coordinator(const CoordinatorOptions& options)
    : options_(options),
      clock_(options.clock),
      start_time_(clock_->Now()),
      num_ps_(NumTasks(options.cluster.cluster(), kPsJob)),
      num_workers_(NumTasks(options.cluster.cluster(), kWorkerJob)),
      has_evaluator_(NumTasks(options.cluster.cluster(), kEvaluatorJob) > 0),
      registry_(options.cluster.cluster(), options.heartbeat_timeout, clock_),
      sync_(SyncOptionsFor(options, num_workers_), clock_),
      gate_(clock_) {
  absl::MutexLock lock(&mu_);
  progress_.set_epochs(std::max(1, options.training.epochs()));
  progress_.set_test_accuracy(-1);
  progress_.set_test_auc(-1);
  progress_.set_metrics_path(options.metrics_path);
  rate_window_start_ = start_time_;
  phase_since_ = start_time_;
}

Coordinator::~Coordinator() {
  Stop();
  Join();
}

void Coordinator::Start() {
  background_ = std::thread([this] { Run(); });
}

void Coordinator::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_requested_ = true;
    // Calls to ps tasks that are gone retry for a long time; a stopping chief gives up at once.
    if (client_ != nullptr) client_->Cancel();
  }
  sync_.Finish();  // wake workers waiting for tokens
}

bool Coordinator::stop_requested() const {
  absl::MutexLock lock(&mu_);
  return stop_requested_;
}

void Coordinator::Join() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&stop_requested_));
  }
  if (background_.joinable()) background_.join();
}

bool Coordinator::StopIfSuperseded(const absl::Status& s) {
  if (!IsSupersededChief(s)) return false;
  LOG(ERROR) << "another chief has replaced this one (" << s.message()
             << "): this chief does nothing more and stops";
  {
    // FAILED and the stop in one step: whoever sees this phase also sees the stop.
    absl::MutexLock lock(&mu_);
    SetPhaseLocked(v1::FAILED, absl::StrCat("replaced by a newer chief: ", s.message()));
    stop_requested_ = true;
  }
  Stop();  // cancels the calls under way and wakes the workers waiting for tokens
  return true;
}

void Coordinator::set_address(const std::string& address) {
  absl::MutexLock lock(&mu_);
  address_ = address;
}

v1::ChiefPhase Coordinator::phase() const {
  absl::MutexLock lock(&mu_);
  return phase_;
}

void Coordinator::Run() {
  while (true) {
    absl::Status s = InitializeModel();
    if (s.ok()) break;
    if (StopIfSuperseded(s)) return;
    if (s.code() != absl::StatusCode::kUnavailable &&
        s.code() != absl::StatusCode::kDeadlineExceeded) {
      LOG(ERROR) << s;
      SetPhase(v1::FAILED, std::string(s.message()));
      return;
    }
    // A ps task gone for longer than the client's retries: start again, with the addresses
    // the tasks have registered since.
    LOG(WARNING) << s << "; initializing again";
    SetPhase(v1::WAITING_FOR_PS, absl::StrCat("initializing again after: ", s.message()));
    absl::MutexLock lock(&mu_);
    clock_->AwaitWithDeadline(&mu_, absl::Condition(&stop_requested_), clock_->Now() + kWaitSlice);
    if (stop_requested_) return;
  }
  if (stop_requested()) return;
  std::thread evaluation;
  if (HasNetwork(options_.config)) evaluation = std::thread([this] { EvaluationLoop(); });
  std::thread rebuilder, loss_watch;
  if (options_.placement.replication() >= 2) {
    rebuilder = std::thread([this] { RebuildLoop(); });
    loss_watch = std::thread([this] { LossWatchLoop(); });
  }
  MaintenanceLoop();
  if (evaluation.joinable()) evaluation.join();
  if (rebuilder.joinable()) rebuilder.join();
  if (loss_watch.joinable()) loss_watch.join();
}

int64_t Coordinator::CurrentStep() const {
  if (options_.sync.mode() == v1::SYNC) return sync_.global_step();
  absl::MutexLock lock(&mu_);
  return progress_.global_step();
}

void Coordinator::MaintenanceLoop() {
  const int64_t every = options_.checkpoint_every_steps;
  // SYNC checkpoints every N steps are cut exactly at multiples of N: the coordinator pauses
  // itself there. ASYNC has no global step order; it checkpoints once N more steps are done.
  const bool exact = checkpoints_ != nullptr && every > 0 && options_.sync.mode() == v1::SYNC;
  int64_t last_step = CurrentStep();
  int64_t next_due = 0;
  auto schedule = [&](int64_t from) {
    last_step = from;
    next_due = exact ? (from / every + 1) * every : from + every;
    if (exact) sync_.PauseAtStep(next_due);
  };
  schedule(last_step);
  absl::Time last_time = clock_->Now();
  while (!stop_requested()) {
    if (exact && CurrentStep() < next_due) {
      sync_.AwaitStep(next_due, clock_->Now() + kWaitSlice);
    } else {
      absl::MutexLock lock(&mu_);
      clock_->AwaitWithDeadline(&mu_, absl::Condition(&stop_requested_),
                                clock_->Now() + kWaitSlice);
    }
    if (stop_requested()) return;
    std::vector<int> restarted;
    for (int i = 0; i < num_ps_; ++i) {
      const uint64_t now = registry_.IncarnationOf(MakeTaskId(kPsJob, i));
      if (now != 0 && now != ps_incarnations_[i]) restarted.push_back(i);
    }
    if (options_.placement.replication() >= 2) restarted = FailOverLostPs(restarted);
    if (!restarted.empty()) {
      RecoverRestartedPs(restarted);
      schedule(CurrentStep());  // the step may have gone back
      last_time = clock_->Now();
      continue;
    }
    if (checkpoints_ == nullptr) continue;
    bool finished;
    {
      absl::MutexLock lock(&mu_);
      finished = progress_.finished();
    }
    const int64_t step = CurrentStep();
    const bool due_steps = every > 0 && step >= next_due;
    const bool due_time = options_.checkpoint_every > absl::ZeroDuration() &&
                          clock_->Now() >= last_time + options_.checkpoint_every &&
                          step > last_step;
    if (finished || (!due_steps && !due_time)) continue;
    // The workers go on once the cut is taken, while it is written: the next exact cut's pause
    // is set now, or a write longer than N steps would let them pass it.
    if (exact && due_steps) sync_.PauseAtStep((step / every + 1) * every);
    absl::StatusOr<v1::CheckpointResponse> r =
        TakeCheckpoint(due_steps ? "every N steps" : "periodic");
    if (!r.ok()) LOG(WARNING) << "checkpoint skipped: " << r.status();
    schedule(r.ok() ? r->step() : step);
    last_time = clock_->Now();
  }
}

void Coordinator::RecoverRestartedPs(const std::vector<int>& restarted) {
  std::vector<std::string> names;
  for (int i : restarted) names.push_back(absl::StrCat("ps:", i));
  const absl::Time start = clock_->Now();
  LOG(WARNING) << absl::StrJoin(names, ", ")
               << " restarted and lost its shards: holding the workers"
               << (checkpoints_ == nullptr
                       ? " and creating them again from initial values (no --checkpoint_dir)"
                       : " and restoring every ps task to the latest checkpoint");
  absl::MutexLock operation(&operation_mu_);
  SetPhase(v1::RECOVERING, absl::StrCat(absl::StrJoin(names, ", "), " restarted"));
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
  for (int i = 0; i < num_ps_; ++i) {
    ps_incarnations_[i] = registry_.IncarnationOf(MakeTaskId(kPsJob, i));
  }
  FollowMovedPs(restarted);
  RecoveryDriver::Result r = recovery_->AfterRestart(names, step_before, rewind);
  if (r.done && rewind) {
    // SYNC: the global step goes back to the restored one (the step under way starts over
    // when nothing was restored); a new token generation starts.
    const int64_t resume_step = r.restored_step >= 0 ? r.restored_step : step_before;
    sync_.Rewind(resume_step);
    absl::MutexLock lock(&mu_);
    progress_.set_global_step(resume_step);
  }
  if (r.done) r.error = recovery_->Finish();
  if (StopIfSuperseded(r.error)) {
    ResumeWorkers();
    return;
  }
  if (!r.done) {
    // The maintenance loop tries again; the recovery record, if written, stays until then.
    for (int i : restarted) ps_incarnations_[i] = 0;
  }
  LOG(WARNING) << "recovery of " << absl::StrJoin(names, ", ") << ": " << r.summary << " (took "
               << absl::FormatDuration(clock_->Now() - start) << ")";
  ResumeWorkers();
  bool finished;
  {
    absl::MutexLock lock(&mu_);
    finished = progress_.finished();
  }
  // A ps task restored after training ended serves the final model again: still FINISHED.
  SetPhase(finished ? v1::FINISHED : ServingPhase(), "");
}

std::vector<int> Coordinator::FailedOver() const {
  absl::MutexLock lock(&mu_);
  return {model_.placement().failed_over_ps().begin(), model_.placement().failed_over_ps().end()};
}

std::vector<int> Coordinator::FailOverLostPs(const std::vector<int>& restarted) {
  std::vector<char> lost(num_ps_, 0), gone(num_ps_, 0), was_failed_over(num_ps_, 0);
  for (int ps : restarted) lost[ps] = 1;
  for (const v1::TaskId& t : registry_.NotServing(std::string(kPsJob))) {
    lost[t.index()] = 1;
    gone[t.index()] = 1;
  }
  for (int ps : FailedOver()) was_failed_over[ps] = 1;
  const bool sync = options_.sync.mode() == v1::SYNC;
  const v1::Placement& placement = client_->placement();
  // A failed-over task given backups again and lost again: its primaries stop forwarding to it
  // (the rebuilder tells them) before anything below counts on those backups, and it is
  // rebuilt once it serves again. What it had taken over is lost with it.
  for (int ps = 0; ps < num_ps_; ++ps) {
    if (!lost[ps] || !was_failed_over[ps]) continue;
    {
      absl::MutexLock lock(&rebuild_mu_);
      auto it = rebuild_.find(ps);
      if (it == rebuild_.end() || it->second.drop) continue;
      if (it->second.rebuilt.empty() && it->second.asked.empty()) {
        // Nothing to drop; a rebuild done with nothing on it is no longer done.
        if (!it->second.pending) it->second.done = absl::InfinitePast();
        continue;
      }
      it->second.rebuilt.clear();
      it->second.drop = true;
      if (!sync) ResetRebuildLocked(&it->second);
      rebuild_wake_ = true;
    }
    LOG(WARNING) << "ps:" << ps << ", which held rebuilt backups, is lost again: their primaries "
                 << "go on without a backup until it is rebuilt";
    // Told now, not behind a rebuild: until a primary drops it, its pushes wait for forwards
    // to a dead task. (The rebuilder tells them again, after any rebuild of `ps` under way.)
    DropBackupsOn(ps, /*keep_for_rebuilder=*/true);
    for (const v1::DensePartition& p : placement.partitions()) {
      if (was_failed_over[p.ps_task()] && p.ps_task() != ps && p.backup_ps_task() == ps &&
          stranded_.insert(p.ps_task()).second) {
        LOG(ERROR) << "ps:" << ps << " is lost, and with it the only copy of the partitions it "
                   << "took over from ps:" << p.ps_task() << "; restart the job from its newest "
                   << "checkpoint (docs/replication.md)";
      }
    }
  }
  if (!stranded_.empty()) {
    std::vector<std::string> names;
    for (int primary : stranded_) names.push_back(absl::StrCat("ps:", primary));
    LOG_EVERY_N(ERROR, 100) << "partitions of " << absl::StrJoin(names, ", ")
                            << " have no copy left since the tasks that had taken them over were "
                            << "lost; restart the job from its newest checkpoint";
  }
  std::vector<int> left;
  for (int ps : restarted) {
    if (!was_failed_over[ps]) continue;
    // Its partitions stay with the tasks that took them over; it gets backups again.
    ps_incarnations_[ps] = registry_.IncarnationOf(MakeTaskId(kPsJob, ps));
    FollowPs(ps);
    if (sync) {
      LOG(WARNING) << "ps:" << ps << " came back after its failover: it holds nothing (backups "
                   << "are not rebuilt in sync mode yet: docs/replication.md)";
    } else {
      LOG(WARNING) << "ps:" << ps << " came back after its failover: rebuilding onto it the "
                   << "backups it held of the tasks still serving";
      ScheduleRebuild(ps);
    }
  }
  // Which primaries' partitions each failed-over task backs up again.
  std::map<int, std::set<int>> rebuilt;
  {
    absl::MutexLock lock(&rebuild_mu_);
    for (const auto& [task, state] : rebuild_) rebuilt[task] = state.rebuilt;
  }
  // A dense partition's backup is there when its task is neither lost nor failed over, or was
  // rebuilt from the partition's primary.
  auto backup_gone = [&](int backup, int primary) {
    return lost[backup] || (was_failed_over[backup] && rebuilt[backup].count(primary) == 0);
  };
  for (int ps = 0; ps < num_ps_; ++ps) {
    if (!lost[ps] || was_failed_over[ps]) continue;
    // Both copies of a partition lost: the checkpoint's restore, as without replication.
    std::string missing;  // the first partition found without a copy
    auto note = [&missing](std::string why) {
      if (missing.empty()) missing = std::move(why);
    };
    for (const v1::DensePartition& p : placement.partitions()) {
      if (p.ps_task() == ps && backup_gone(p.backup_ps_task(), ps)) {
        note(absl::StrCat("ps:", p.backup_ps_task(), ", which backs up partition ", p.partition(),
                          " of ", p.variable()));
      }
    }
    // What it took over from a task failed over earlier has no other copy.
    for (const v1::DensePartition& p : placement.partitions()) {
      if (was_failed_over[p.ps_task()] && p.backup_ps_task() == ps) {
        note(absl::StrCat("the only copy of partition ", p.partition(), " of ", p.variable(),
                          ", which it took over from ps:", p.ps_task()));
      }
    }
    for (const auto& [v, backup] : TableBackupsOf(ps)) {
      if (backup_gone(backup, ps)) {  // (rebuilt with the primary's dense backups)
        note(absl::StrCat("ps:", backup, ", which backs up virtual shard ", v, " of the tables"));
      }
    }
    if (client_->model().tables_size() > 0) {
      for (int v = 0; v < placement.virtual_shard_to_ps_size() &&
                      v < placement.virtual_shard_to_backup_ps_size();
           ++v) {
        if (was_failed_over[placement.virtual_shard_to_ps(v)] &&
            placement.virtual_shard_to_backup_ps(v) == ps) {
          note(absl::StrCat(
              "the only copy of virtual shard ", v,
              " of the tables, which it took over from ps:", placement.virtual_shard_to_ps(v)));
        }
      }
    }
    const bool restarted_now = !gone[ps];
    if (!missing.empty()) {
      const bool after_a_failover =
          std::find(was_failed_over.begin(), was_failed_over.end(), 1) != was_failed_over.end();
      if (after_a_failover) {
        // A restore re-creates each task's shards as first placed, not as the failover moved
        // them (a restarted task does not know which backups it had taken over): it would
        // leave part of the model behind or roll it back. The job restarts from its newest
        // checkpoint instead, which covers the shards taken over when taken after the failover.
        if (restarted_now) {
          ps_incarnations_[ps] = registry_.IncarnationOf(MakeTaskId(kPsJob, ps));
          LOG(ERROR) << "ps:" << ps << " came back, empty: nothing is restored into it or "
                     << "created again (its partitions have no copy left after the failover)";
        }
        LOG_EVERY_N(ERROR, 20) << "ps:" << ps << " is lost and so is " << missing
                               << ", after an earlier failover: the partitions they held have no "
                                  "copy left; restart the job from its newest checkpoint "
                                  "(docs/replication.md)";
        continue;
      }
      LOG(WARNING) << "ps:" << ps << " is lost and so is " << missing << ": it cannot fail over; "
                   << (restarted_now ? "restoring from the checkpoint"
                                     : "waiting for it to come back");
      if (restarted_now) left.push_back(ps);
      continue;
    }
    // When a task does not take the failover, it is tried again on the next round (a restarted
    // task's incarnation is taken only once it failed over).
    absl::MutexLock operation(&operation_mu_);
    if (FailOver(ps)) {
      ps_incarnations_[ps] = registry_.IncarnationOf(MakeTaskId(kPsJob, ps));
      if (restarted_now && !sync) {  // back already
        FollowPs(ps);
        ScheduleRebuild(ps);
      }
    }
  }
  return left;
}

void Coordinator::LossWatchLoop() {
  std::vector<char> logged(num_ps_, 0);  // since the task was last heard from
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      // (Real time, as the rebuilder's: a test's clock may stand still.)
      mu_.AwaitWithTimeout(absl::Condition(&stop_requested_), absl::Milliseconds(100));
      if (stop_requested_) return;
    }
    const std::vector<char> down = PsDown();
    for (int ps = 0; ps < num_ps_; ++ps) {
      if (!down[ps]) {
        logged[ps] = 0;
        continue;
      }
      // The maintenance thread fails it over next, unless it is held in a call to it: one
      // that hangs (a frozen task, or one cut off without a reset) would hold it, and the
      // failover, until the call's deadline (a save's: --checkpoint_timeout_secs). Every round
      // while it is down: a call begun after the last one (a save's next phase) hangs too.
      if (!logged[ps]) {
        logged[ps] = 1;
        LOG(WARNING) << "ps:" << ps << " missed its heartbeats: ending the chief's calls to it";
      }
      client_->AbortCalls(ps);
    }
  }
}

void Coordinator::ScheduleRebuild(int ps) {
  absl::MutexLock lock(&rebuild_mu_);
  ResetRebuildLocked(&rebuild_[ps]);
  rebuild_wake_ = true;
}

void Coordinator::ResetRebuildLocked(RebuildState* state) {
  state->pending = true;
  state->shards = 0;
  state->bytes = 0;
  state->primaries = 0;
  state->tries = 0;
  state->last_error.clear();
  state->since = clock_->Now();
  state->done = absl::InfinitePast();
  state->next_try = state->since;
  state->pause = absl::Milliseconds(500);
}

void Coordinator::RebuildLoop() {
  while (!stop_requested()) {
    std::vector<std::pair<int, bool>> work;  // (task, drop)
    {
      absl::MutexLock lock(&rebuild_mu_);
      rebuild_mu_.AwaitWithTimeout(absl::Condition(&rebuild_wake_), absl::Milliseconds(200));
      rebuild_wake_ = false;
      for (const auto& [task, state] : rebuild_) {
        if (state.drop || state.pending) work.emplace_back(task, state.drop);
      }
    }
    // Drops first: a primary that still forwards to a lost task answers no push.
    for (const auto& [ps, drop] : work) {
      if (stop_requested()) return;
      if (drop) DropBackupsOn(ps, /*keep_for_rebuilder=*/false);
    }
    for (const auto& [ps, drop] : work) {
      if (stop_requested()) return;
      if (!drop) RebuildOnto(ps);
    }
  }
}

bool Coordinator::DropBackupsOn(int ps, bool keep_for_rebuilder) {
  std::map<int, uint64_t> asked;
  {
    absl::MutexLock lock(&rebuild_mu_);
    RebuildState& state = rebuild_[ps];
    if (!keep_for_rebuilder && clock_->Now() < state.drop_next_try) return false;
    asked = state.asked;
    // (While it is telling them, no rebuild of `ps` starts: a late drop would undo it.)
    if (keep_for_rebuilder) ++state.drops_in_flight;
  }
  std::vector<char> failed(num_ps_, 0), down(num_ps_, 0);
  for (int t : FailedOver()) failed[t] = 1;
  for (const v1::TaskId& t : registry_.NotServing(std::string(kPsJob))) down[t.index()] = 1;
  // Told: those that answered, those failed over (they serve nothing of their own any more)
  // and those restarted since they were asked (a new process forwards nothing to `ps`).
  std::vector<int> to_tell, told;
  for (const auto& [t, incarnation] : asked) {
    if (failed[t] || registry_.IncarnationOf(MakeTaskId(kPsJob, t)) != incarnation) {
      told.push_back(t);
    } else if (!down[t]) {
      to_tell.push_back(t);
    }
  }
  // One attempt each, all at once: the retries are the rebuilder's, after a pause, so that
  // neither thread waits long on a task that does not answer.
  std::vector<absl::Status> results(to_tell.size());
  std::vector<std::thread> calls;
  for (size_t i = 0; i < to_tell.size(); ++i) {
    calls.emplace_back([&, i] {
      // FailOverPs promotes nothing more (what the task held of `ps` was promoted at its
      // failover) and drops the backups rebuilt on it.
      v1::FailOverPsResponse r;
      results[i] = client_->FailOverPs(to_tell[i], ps, &r, /*min_dense_shards=*/0,
                                       /*once=*/true);
    });
  }
  for (std::thread& t : calls) t.join();
  for (size_t i = 0; i < to_tell.size(); ++i) {
    if (StopIfSuperseded(results[i])) break;
    if (results[i].ok()) {
      told.push_back(to_tell[i]);
    } else {
      LOG_EVERY_N(WARNING, 10) << "ps:" << to_tell[i] << " did not drop its backups on ps:" << ps
                               << " (tried again): " << results[i];
    }
  }
  absl::MutexLock lock(&rebuild_mu_);
  RebuildState& state = rebuild_[ps];
  if (keep_for_rebuilder) {
    // The rebuilder tells them all again, after any rebuild of `ps` under way.
    --state.drops_in_flight;
    return told.size() == asked.size();
  }
  for (int t : told) state.asked.erase(t);
  if (state.asked.empty()) {
    state.drop = false;
    state.drop_pause = absl::Milliseconds(200);
    return true;
  }
  state.drop_next_try = clock_->Now() + state.drop_pause;
  state.drop_pause = std::min(2 * state.drop_pause, absl::Seconds(10));
  return false;
}

void Coordinator::RebuildOnto(int ps) {
  const absl::Time now = clock_->Now();
  std::set<int> done;
  {
    absl::MutexLock lock(&rebuild_mu_);
    const RebuildState& state = rebuild_[ps];
    if (!state.pending || state.drop || state.drops_in_flight > 0 || now < state.next_try) {
      return;
    }
    done = state.rebuilt;
  }
  std::vector<char> failed(num_ps_, 0), down(num_ps_, 0);
  for (int t : FailedOver()) failed[t] = 1;
  for (const v1::TaskId& t : registry_.NotServing(std::string(kPsJob))) down[t.index()] = 1;
  if (down[ps]) return;  // once it serves
  // The primaries still serving their own shards whose partitions or table virtual shards it
  // backs up.
  std::set<int> primaries;
  for (const v1::DensePartition& p : client_->placement().partitions()) {
    if (p.backup_ps_task() == ps && !failed[p.ps_task()] && done.count(p.ps_task()) == 0) {
      primaries.insert(p.ps_task());
    }
  }
  for (int primary = 0; primary < num_ps_; ++primary) {
    if (failed[primary] || done.count(primary) > 0) continue;
    for (const auto& [v, backup] : TableBackupsOf(primary)) {
      if (backup == ps) primaries.insert(primary);
    }
  }
  {
    absl::MutexLock lock(&rebuild_mu_);
    RebuildState& state = rebuild_[ps];
    state.primaries = static_cast<int>(done.size() + primaries.size());
    // (A try: one that asks a primary; those down are only waited for.)
    for (int primary : primaries) {
      if (!down[primary]) {
        ++state.tries;
        break;
      }
    }
  }
  CreateShardsOptions create;
  {
    absl::MutexLock lock(&mu_);
    create.ps_addresses = ps_addresses_;
  }
  bool all = true;
  for (int primary : primaries) {
    if (down[primary]) {
      all = false;
      continue;
    }
    {
      absl::MutexLock lock(&rebuild_mu_);
      if (rebuild_[ps].drop || rebuild_[ps].drops_in_flight > 0) return;  // lost again
      rebuild_[ps].asked[primary] = registry_.IncarnationOf(MakeTaskId(kPsJob, primary));
    }
    int64_t shards = 0, bytes = 0, rows = 0;
    absl::Status s =
        client_->RebuildBackupOnto(ps, primary, options_.sync, create, &shards, &bytes, &rows);
    if (StopIfSuperseded(s)) return;
    absl::MutexLock lock(&rebuild_mu_);
    RebuildState& state = rebuild_[ps];
    if (state.drop) return;
    if (!s.ok()) {
      all = false;
      state.last_error = absl::StrCat("ps:", primary, ": ", s.ToString());
      LOG_EVERY_N(WARNING, 10) << "rebuild of ps:" << primary << "'s backups on ps:" << ps
                               << " failed (tried again): " << s;
      continue;
    }
    state.rebuilt.insert(primary);
    state.shards += shards;
    state.bytes += bytes;
    state.rows += rows;
  }
  absl::MutexLock lock(&rebuild_mu_);
  RebuildState& state = rebuild_[ps];
  if (state.drop) return;
  if (!all) {
    state.next_try = clock_->Now() + state.pause;
    state.pause = std::min(2 * state.pause, absl::Seconds(30));
    return;
  }
  state.pending = false;
  state.done = clock_->Now();
  state.last_error.clear();
  LOG(WARNING) << "backups rebuilt on ps:" << ps << ": " << state.shards << " dense shards and "
               << state.rows << " table rows, " << state.bytes
               << " bytes copied from their primaries while pushes went on, in "
               << absl::FormatDuration(clock_->Now() - state.since) << " since it was scheduled";
}

void Coordinator::FillRebuilds(v1::ClusterStatus* resp) const {
  absl::MutexLock lock(&rebuild_mu_);
  for (const auto& [ps, state] : rebuild_) {
    if (!state.pending && !state.drop && state.done == absl::InfinitePast()) continue;
    v1::BackupRebuild* r = resp->add_rebuilds();
    r->set_ps_task(ps);
    r->set_state(state.drop      ? v1::BACKUP_REBUILD_DROPPING
                 : state.pending ? v1::BACKUP_REBUILD_COPYING
                                 : v1::BACKUP_REBUILD_DONE);
    r->set_primaries_done(static_cast<int32_t>(state.rebuilt.size()));
    r->set_primaries(std::max(state.primaries, static_cast<int>(state.rebuilt.size())));
    r->set_shards_copied(state.shards);
    r->set_bytes_copied(state.bytes);
    r->set_rows_copied(state.rows);
    r->set_tries(state.tries);
    r->set_last_error(state.last_error);
    r->set_since_unix_micros(absl::ToUnixMicros(state.since));
    const bool done = !state.pending && !state.drop;
    if (done) r->set_done_unix_micros(absl::ToUnixMicros(state.done));
    r->set_elapsed_micros(
        absl::ToInt64Microseconds((done ? state.done : clock_->Now()) - state.since));
  }
}

std::vector<std::pair<int, int>> Coordinator::TableBackupsOf(int ps) const {
  std::vector<std::pair<int, int>> out;
  if (client_->model().tables_size() == 0) return out;
  const v1::Placement& placement = client_->placement();
  for (int v = 0;
       v < placement.virtual_shard_to_ps_size() && v < placement.virtual_shard_to_backup_ps_size();
       ++v) {
    if (placement.virtual_shard_to_ps(v) == ps) {
      out.emplace_back(v, placement.virtual_shard_to_backup_ps(v));
    }
  }
  return out;
}

bool Coordinator::FailOver(int ps) {
  const absl::Time start = clock_->Now();
  const absl::Time heard = registry_.LastHeardOf(MakeTaskId(kPsJob, ps));
  std::set<int> backups;
  std::map<int, int> expected;  // dense partitions of `ps` each backup task must promote
  for (const v1::DensePartition& p : client_->placement().partitions()) {
    if (p.ps_task() == ps) {
      backups.insert(p.backup_ps_task());
      ++expected[p.backup_ps_task()];
    }
  }
  for (const auto& [v, backup] : TableBackupsOf(ps)) backups.insert(backup);
  std::vector<char> failed_before(num_ps_, 0);
  for (int t : FailedOver()) failed_before[t] = 1;
  SetPhase(v1::RECOVERING, absl::StrCat("ps:", ps, " failing over to its backups"));
  // Every live task: those backing up its partitions promote them, those it backed up stop
  // forwarding to it. Its backups first, so that the primaries keep waiting for a forward
  // (and answer no push) until nobody will take one from the dead task any more.
  std::vector<int> order(backups.begin(), backups.end());
  for (int t = 0; t < num_ps_; ++t) {
    if (t != ps && !failed_before[t] && backups.count(t) == 0) order.push_back(t);
  }
  int promoted = 0, unreplicated = 0;
  for (int task : order) {
    v1::FailOverPsResponse r;
    absl::Status s = client_->FailOverPs(task, ps, &r, expected[task]);
    if (StopIfSuperseded(s)) return false;
    if (s.code() == absl::StatusCode::kFailedPrecondition) {
      LOG_EVERY_N(ERROR, 20) << "failover of ps:" << ps << ": ps:" << task << " refused it: " << s;
      SetPhase(ServingPhase(), "");
      return false;
    }
    if (!s.ok()) {
      LOG(WARNING) << "failover of ps:" << ps << ": ps:" << task
                   << " did not take it (tried again): " << s;
      SetPhase(ServingPhase(), "");
      return false;
    }
    if (r.dense_promoted() < expected[task]) {
      // Its routes would lead to a task that does not hold what they route.
      LOG_EVERY_N(ERROR, 20) << "failover of ps:" << ps << ": ps:" << task << " holds "
                             << r.dense_promoted() << " of the " << expected[task]
                             << " partitions it backs up; not publishing the failover";
      SetPhase(ServingPhase(), "");
      return false;
    }
    promoted += r.dense_promoted();
    unreplicated += r.dense_unreplicated();
    MaybeCrash(options_.crash_points, kCrashFailoverMidway);
  }
  std::vector<int> failed_over;
  {
    absl::MutexLock lock(&mu_);
    model_.mutable_placement()->add_failed_over_ps(ps);
    failed_over.assign(model_.placement().failed_over_ps().begin(),
                       model_.placement().failed_over_ps().end());
  }
  client_->SetFailedOver(failed_over).IgnoreError();  // validated: every partition has a backup
  std::vector<std::string> names;
  for (int b : backups) names.push_back(absl::StrCat("ps:", b));
  LOG(WARNING) << "ps:" << ps << " failed over: " << promoted << " dense shards promoted on "
               << absl::StrJoin(names, ", ") << ", " << unreplicated
               << " shards it backed up left without a backup, in "
               << absl::FormatDuration(clock_->Now() - start) << " ("
               << absl::FormatDuration(clock_->Now() - heard)
               << " after its last heartbeat); no checkpoint restored, nothing rolled back";
  bool finished;
  {
    absl::MutexLock lock(&mu_);
    finished = progress_.finished();
  }
  SetPhase(finished ? v1::FINISHED : ServingPhase(), "");
  return true;
}

void Coordinator::FollowMovedPs(const std::vector<int>& restarted) {
  for (int ps : restarted) FollowPs(ps);
}

void Coordinator::FollowPs(int ps) {
  // (Called from the maintenance thread and from the client's retries on any thread: one at a
  // time, so that two moves are applied in their order.)
  absl::MutexLock follow(&follow_mu_);
  absl::StatusOr<std::string> now = registry_.AddressOf(MakeTaskId(kPsJob, ps));
  if (!now.ok()) return;
  std::string before;
  ParameterClient* client;
  {
    absl::MutexLock lock(&mu_);
    if (ps >= static_cast<int>(ps_addresses_.size()) || ps_addresses_[ps] == *now) return;
    before = ps_addresses_[ps];
    ps_addresses_[ps] = *now;
    // Workers that cannot reach the old address find this one through GetModel.
    if (ps < model_.ps_addresses_size()) model_.set_ps_addresses(ps, *now);
    client = client_.get();
  }
  absl::Status s = client == nullptr ? absl::FailedPreconditionError("no client yet")
                                     : client->SetPsAddress(ps, *now);
  LOG(WARNING) << "ps:" << ps << " came back at " << *now << " (was " << before << ")"
               << (s.ok() ? "" : absl::StrCat(": cannot follow it: ", s.message()));
}

absl::Status Coordinator::HoldWorkersAtStepBoundary(absl::Duration timeout) {
  const absl::Time deadline = clock_->Now() + timeout;
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
  while (!gate_.Close(std::min(deadline, clock_->Now() + kWaitSlice))) {
    for (const v1::TaskId& t : registry_.NotServing()) {
      if (t.job() == kWorkerJob) gate_.Leave(t.index());
    }
    if (stop_requested()) return absl::CancelledError("the chief is stopping");
    if (clock_->Now() >= deadline) {
      std::vector<std::string> slow;
      for (int w : gate_.inside()) slow.push_back(absl::StrCat("worker:", w));
      return absl::UnavailableError(
          absl::StrCat("no step boundary within ", absl::FormatDuration(timeout), " (",
                       absl::StrJoin(slow, ", "), " still inside a step)"));
    }
  }
  return absl::OkStatus();
}

void Coordinator::ResumeWorkers() {
  sync_.Resume();
  gate_.Open();
}

absl::StatusOr<v1::CheckpointResponse> Coordinator::TakeCheckpoint(const std::string& reason,
                                                                   bool require_ready) {
  if (options_.checkpoint_dir.empty()) {
    return absl::FailedPreconditionError("the chief has no --checkpoint_dir: checkpoints are off");
  }
  {
    absl::MutexLock lock(&mu_);
    if (require_ready && !model_ready_) {
      return absl::UnavailableError("the model is not ready yet");
    }
  }
  absl::MutexLock operation(&operation_mu_);
  // The workers are held only while the ps tasks copy their shards, into memory made before;
  // the copies are written while training goes on, and committed once written.
  if (absl::Status prepared = checkpoints_->Prepare(); !prepared.ok()) {
    LOG(WARNING) << "the ps tasks could not prepare the checkpoint's memory (the cut will): "
                 << prepared;
  }
  const absl::Time hold_start = clock_->Now();
  absl::Status held = HoldWorkersAtStepBoundary(options_.checkpoint_hold_timeout);
  absl::StatusOr<CheckpointManager::PendingCheckpoint> cut =
      held.ok() ? checkpoints_->Cut(CurrentStep(), reason) : held;
  ResumeWorkers();
  const absl::Duration held_for = clock_->Now() - hold_start;
  absl::StatusOr<v1::CheckpointResponse> r = cut.ok() ? checkpoints_->Commit(*cut) : cut.status();
  if (r.ok() && !cut->committed) {
    r->set_held_micros(absl::ToInt64Microseconds(held_for));
    LOG(INFO) << "checkpoint of step " << r->step() << ": the workers were held for "
              << absl::FormatDuration(held_for) << " (to the step boundary and the cut), "
              << "the save took " << absl::FormatDuration(absl::Microseconds(r->micros()));
  }
  StopIfSuperseded(r.status());
  return r;
}

absl::Status Coordinator::Checkpoint(const v1::CheckpointRequest&, v1::CheckpointResponse* resp) {
  PS_ASSIGN_OR_RETURN(*resp, TakeCheckpoint("requested"));
  return absl::OkStatus();
}

std::vector<char> Coordinator::PsDown() const {
  std::vector<char> down(num_ps_, 0);
  for (const v1::TaskId& t : registry_.NotServing(std::string(kPsJob))) down[t.index()] = 1;
  return down;
}

absl::StatusOr<Coordinator::FailoversFound> Coordinator::FailedOverEarlier(
    const std::vector<std::string>& addresses, const v1::Placement& placement, bool down_is_lost) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<PsTransport> transport,
                      options_.make_ps_transport(addresses));
  const std::vector<char> down = PsDown();
  std::vector<char> holds_own(num_ps_, 0), trained_backup(num_ps_, 0);
  std::set<int> promoted;
  v1::ListShardsRequest request;
  request.set_include_backups(true);
  for (int ps = 0; ps < num_ps_; ++ps) {
    if (down[ps]) continue;
    absl::StatusOr<v1::ListShardsResponse> listed = transport->ListShards(ps, request);
    if (!listed.ok()) {
      return absl::UnavailableError(absl::StrCat("cannot list the shards of ps:", ps,
                                                 " to learn which tasks an earlier "
                                                 "chief failed over: ",
                                                 listed.status().message()));
    }
    for (const v1::ShardStats& s : listed->shards()) {
      if (!s.backup()) {
        holds_own[ps] = 1;
      } else if (s.promoted()) {
        promoted.insert(s.primary_ps_task());
      } else if (s.primary_ps_task() >= 0 && s.primary_ps_task() < num_ps_ &&
                 (s.applied_step() > 0 || s.rows() > 0)) {
        trained_backup[s.primary_ps_task()] = 1;
      }
    }
  }
  // Whose backups are on a task failed over earlier: that task's backups may be a rebuild
  // the earlier chief did not finish (this chief does not know which it finished), and the
  // running chief fails such a task over only once its rebuild is done.
  std::vector<char> backed_up_on_failed(num_ps_, 0);
  for (const v1::DensePartition& p : placement.partitions()) {
    if (promoted.count(p.backup_ps_task()) > 0) backed_up_on_failed[p.ps_task()] = 1;
  }
  if (options_.model.tables_size() > 0) {
    for (int v = 0; v < placement.virtual_shard_to_ps_size() &&
                    v < placement.virtual_shard_to_backup_ps_size();
         ++v) {
      if (promoted.count(placement.virtual_shard_to_backup_ps(v)) > 0) {
        backed_up_on_failed[placement.virtual_shard_to_ps(v)] = 1;
      }
    }
  }
  FailoversFound found;
  found.promoted.assign(promoted.begin(), promoted.end());
  for (int ps = 0; ps < num_ps_; ++ps) {
    // Its backups were trained, so the model was, and it holds nothing of its own: it
    // restarted, or is gone, while no chief ran.
    if (promoted.count(ps) == 0 && trained_backup[ps] && !backed_up_on_failed[ps] &&
        (down[ps] ? down_is_lost : !holds_own[ps])) {
      found.lost.push_back(ps);
    }
  }
  return found;
}

absl::Status Coordinator::AdoptFailovers(const std::vector<int>& failed) {
  const std::vector<char> down = PsDown();
  for (int ps : failed) {
    std::map<int, int> expected;  // dense partitions of `ps` each backup task must promote
    for (const v1::DensePartition& p : client_->placement().partitions()) {
      if (p.ps_task() == ps) ++expected[p.backup_ps_task()];
    }
    for (const auto& [backup, count] : expected) {
      if (down[backup]) {
        return absl::UnavailableError(absl::StrCat(
            "ps:", ps, " failed over, and ps:", backup, ", which backs up ", count,
            " of its partitions, is down: no copy of them serves until it comes back"));
      }
    }
    for (const auto& [v, backup] : TableBackupsOf(ps)) {
      if (down[backup]) {
        return absl::UnavailableError(absl::StrCat(
            "ps:", ps, " failed over, and ps:", backup, ", which backs up virtual ", "shard ", v,
            " of its tables, is down: no copy of it serves until it ", "comes back"));
      }
    }
    // Every task that serves (one failed over earlier and back included, which may have taken
    // partitions of `ps` over), as FailOver tells them; a task told before answers as it did.
    // The backups promote what an earlier chief that died mid-failover had not, the primaries
    // stop forwarding to `ps`.
    for (int task = 0; task < num_ps_; ++task) {
      if (task == ps || down[task]) continue;
      v1::FailOverPsResponse r;
      absl::Status s = client_->FailOverPs(task, ps, &r, expected[task]);
      if (s.code() == absl::StatusCode::kFailedPrecondition) {
        return absl::FailedPreconditionError(absl::StrCat(
            "ps:", ps, " failed over, but ps:", task,
            " no longer holds the partitions of it "
            "that it backs up (it restarted since?): no copy of them is left; restart the job "
            "from its newest checkpoint (",
            s.message(), ")"));
      }
      if (!s.ok()) {
        return absl::Status(s.code(), absl::StrCat("cannot complete the failover of ps:", ps,
                                                   " on ps:", task, ": ", s.message()));
      }
      if (r.dense_promoted() < expected[task]) {
        return absl::UnavailableError(absl::StrCat("ps:", task, " holds ", r.dense_promoted(),
                                                   " of the ", expected[task],
                                                   " partitions of ps:", ps, " it took over"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::InitializeModel() {
  const bool replicated = options_.placement.replication() >= 2;
  // Replication 2: the ps tasks an earlier chief failed over. Their partitions are served by
  // the tasks that took them over, so a task among them that is down is not waited for, and
  // nothing is created on one that is back (which would restore every task from the checkpoint
  // and roll back what was pushed since).
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(options_.model, num_ps_, options_.placement);
  if (!placement.ok()) {
    return absl::Status(placement.status().code(),
                        absl::StrCat("cannot place the model: ", placement.status().message()));
  }
  std::vector<int> failed_earlier;
  // Also replication 2: tasks lost while no chief ran (restarted empty, or down for a
  // heartbeat timeout since this chief began waiting) whose backups were trained: failed over
  // now, as the running chief would have, instead of created again and restored.
  std::vector<int> lost_meanwhile;
  absl::Time next_look = absl::InfinitePast();
  const absl::Time waiting_since = clock_->Now();
  // A task that serves re-registers within its reconnect backoff (up to 1 s) and a retry
  // after it: one not heard of for longer than this is down.
  const absl::Duration grace =
      std::max(2 * options_.heartbeat_timeout, options_.heartbeat_timeout + absl::Seconds(2));
  while (true) {
    const bool all = registry_.AwaitServing({std::string(kPsJob)}, clock_->Now() + kWaitSlice);
    if (stop_requested()) return absl::OkStatus();
    if (!replicated) {
      if (all) break;
      continue;
    }
    if (!all && clock_->Now() < next_look) continue;
    next_look = clock_->Now() + absl::Seconds(1);
    std::vector<std::string> now;
    for (int i = 0; i < num_ps_; ++i) now.push_back(*registry_.AddressOf(MakeTaskId(kPsJob, i)));
    absl::StatusOr<FailoversFound> found =
        FailedOverEarlier(now, *placement, /*down_is_lost=*/clock_->Now() - waiting_since >= grace);
    if (!found.ok()) {
      if (all) return found.status();
      continue;
    }
    lost_meanwhile = found->lost;
    failed_earlier = found->promoted;
    failed_earlier.insert(failed_earlier.end(), found->lost.begin(), found->lost.end());
    std::sort(failed_earlier.begin(), failed_earlier.end());
    {
      // Known at once to Heartbeat, which tells such a task it was failed over: one cut off
      // from the earlier chief (and never told) must not renew its lease and serve its own
      // shards again. (Not the lost ones, which are empty or down, until they are failed over:
      // the fence is for good, and a later look may find one whole.)
      absl::MutexLock lock(&mu_);
      model_.mutable_placement()->clear_failed_over_ps();
      for (int ps : found->promoted) model_.mutable_placement()->add_failed_over_ps(ps);
    }
    if (all) break;
    std::vector<char> waiting = PsDown();  // down and not failed over
    for (int ps : failed_earlier) waiting[ps] = 0;
    if (std::find(waiting.begin(), waiting.end(), 1) == waiting.end()) break;
  }
  std::vector<std::string> addresses;
  for (int i = 0; i < num_ps_; ++i) {
    addresses.push_back(*registry_.AddressOf(MakeTaskId(kPsJob, i)));
  }
  LOG(INFO) << "placement of " << options_.model.variables_size() << " variables and "
            << options_.model.tables_size() << " tables on " << num_ps_ << " ps tasks:\n"
            << PlacementDebugString(*placement);
  SetPhase(v1::CREATING_VARIABLES, "");
  if (chief_epoch_ == 0) {
    // Higher than any earlier chief's: recorded beside the checkpoints when there are any (so
    // a clock that went back cannot lower it), else the start time.
    chief_epoch_ = absl::ToUnixMicros(start_time_);
    if (!options_.checkpoint_dir.empty()) {
      PS_ASSIGN_OR_RETURN(chief_epoch_, NextChiefEpoch(options_.checkpoint_dir, chief_epoch_));
    }
    LOG(INFO) << "chief epoch " << chief_epoch_
              << ": ps tasks refuse control requests of earlier chiefs";
  }
  {
    absl::MutexLock lock(&mu_);
    ps_addresses_ = addresses;
  }
  ParameterClientOptions client_options;
  client_options.max_attempts = options_.ps_call_attempts;
  client_options.max_backoff = options_.ps_call_max_backoff;
  client_options.chief_epoch = chief_epoch_;
  // A ps task restarted elsewhere while the chief calls it is followed at its new address.
  client_options.before_retry = [this](int ps) { FollowPs(ps); };
  if (replicated) {
    // A call to a task whose heartbeats stopped is not retried for the client's 20 attempts
    // (about 30 s): with backups, the maintenance thread fails the task over instead, which a
    // checkpoint's save waiting for the task would hold up as long.
    client_options.lost = [this](int ps) { return PsDown()[ps] != 0; };
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<PsTransport> transport,
                      options_.make_ps_transport(addresses));
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<ParameterClient> client,
      ParameterClient::Create(options_.model, *placement, std::move(transport), client_options));
  std::unique_ptr<CheckpointManager> checkpoints;
  if (!options_.checkpoint_dir.empty()) {
    CheckpointManagerOptions c;
    c.dir = options_.checkpoint_dir;
    c.keep = options_.keep_checkpoints;
    c.full_every = options_.full_checkpoint_every;
    c.config = options_.config;
    c.sync = options_.sync;
    c.cluster = options_.cluster.cluster();
    c.crash_points = options_.crash_points;
    c.clock = clock_;
    c.chief_epoch = chief_epoch_;
    checkpoints = std::make_unique<CheckpointManager>(c, client.get());
  }
  recovery_ = std::make_unique<RecoveryDriver>(checkpoints.get(), client.get(), options_.sync);
  {
    // Stop() cancels the client's retries; one that came first cancels it here.
    absl::MutexLock lock(&mu_);
    client_ = std::move(client);
    checkpoints_ = std::move(checkpoints);
    if (stop_requested_) client_->Cancel();
  }
  ps_incarnations_.clear();
  for (int i = 0; i < num_ps_; ++i) {
    ps_incarnations_.push_back(registry_.IncarnationOf(MakeTaskId(kPsJob, i)));
  }
  if (!lost_meanwhile.empty() && checkpoints_ != nullptr &&
      checkpoints_->UnfinishedRecovery().ok()) {
    // Shards a recovery re-created count steps and rows that are not training: their backups
    // are no proof (ReasonsToRestoreAtStart redoes the recovery).
    LOG(WARNING) << "ps:" << absl::StrJoin(lost_meanwhile, ", ps:")
                 << " holds nothing, but an earlier chief's recovery was under way: not failing "
                    "it over";
    for (int ps : lost_meanwhile) {
      failed_earlier.erase(std::find(failed_earlier.begin(), failed_earlier.end(), ps));
    }
    lost_meanwhile.clear();
  }
  for (int ps : failed_earlier) placement->add_failed_over_ps(ps);
  if (!failed_earlier.empty()) {
    // Routed around from the start: CreateAll sends them nothing.
    PS_RETURN_IF_ERROR(client_->SetFailedOver(failed_earlier));
    std::vector<int> before;
    for (int ps : failed_earlier) {
      if (std::find(lost_meanwhile.begin(), lost_meanwhile.end(), ps) == lost_meanwhile.end()) {
        before.push_back(ps);
      }
    }
    if (!before.empty()) {
      LOG(WARNING) << "ps:" << absl::StrJoin(before, ", ps:")
                   << " failed over under an earlier chief: their partitions stay on the tasks "
                      "that took them over (not waiting for them, creating nothing on them, "
                      "restoring nothing)";
    }
    if (!lost_meanwhile.empty()) {
      LOG(WARNING) << "ps:" << absl::StrJoin(lost_meanwhile, ", ps:")
                   << " lost its shards while no chief ran (restarted empty, or down since "
                      "this chief started) and its backups hold trained state: failing it "
                      "over to them (creating nothing on it, restoring nothing)";
    }
  }
  // With a checkpoint to start from, new shards wait for it (held): a chief that dies before
  // restoring leaves them refusing service, never serving initial values as if trained.
  const bool have_checkpoint = checkpoints_ != nullptr && checkpoints_->HasCheckpoint();
  CreateShardsOptions create;
  create.hold_until_restored = have_checkpoint;
  // Where each primary forwards its updates to its backups (replication 2).
  if (placement->options().replication() >= 2) create.ps_addresses = addresses;
  int64_t fresh = 0;
  std::vector<int> awaiting;
  absl::Status created = client_->CreateAll(options_.sync, &fresh, create, &awaiting);
  if (!created.ok()) {
    return absl::Status(created.code(),
                        absl::StrCat("cannot create the variables: ", created.message()));
  }
  // After CreateAll, which set every primary's backups as placed: told again, the primaries
  // stop forwarding to the failed-over tasks (and psctl shows those backups lost).
  PS_RETURN_IF_ERROR(AdoptFailovers(failed_earlier));
  int64_t restored_step = -1;
  const std::vector<std::string> why = recovery_->ReasonsToRestoreAtStart(fresh, awaiting);
  if (!why.empty() && !failed_earlier.empty()) {
    // A restore re-creates every task's shards as first placed, which the failovers moved
    // (as FailOverLostPs refuses it after a failover).
    return absl::FailedPreconditionError(absl::StrCat(
        "the ps tasks need a restore (", absl::StrJoin(why, ", "),
        "), but ps:", absl::StrJoin(failed_earlier, ", ps:"),
        " failed over under an earlier chief, and a "
        "restore cannot put their partitions back where the failover moved them; restart the "
        "job from its newest checkpoint"));
  }
  if (!why.empty()) {
    absl::MutexLock operation(&operation_mu_);
    SetPhase(v1::RESTORING, absl::StrJoin(why, ", "));
    PS_ASSIGN_OR_RETURN(restored_step, recovery_->RestoreAtStart(why));
    // A new generation: workers drop whatever they computed for the steps after it.
    if (restored_step >= 0) sync_.Rewind(restored_step);
    PS_RETURN_IF_ERROR(recovery_->Finish());
    absl::MutexLock lock(&mu_);
    if (restored_step >= 0) {
      progress_.set_global_step(restored_step);
      steps_before_ = restored_step;
    }
  } else if (fresh == 0) {
    LOG(INFO) << "the ps tasks already hold every variable: resuming from the cluster's state";
  }
  if (options_.sync.mode() == v1::SYNC && restored_step < 0) {
    // After a chief restart the ps tasks still hold the model: the steps their accumulators
    // have applied are the global step, so workers neither repeat nor skip steps.
    // (A failed-over task's partitions are counted where they were promoted.)
    int64_t applied = 0;
    for (int ps = 0; ps < num_ps_; ++ps) {
      if (std::find(failed_earlier.begin(), failed_earlier.end(), ps) != failed_earlier.end()) {
        continue;
      }
      absl::StatusOr<v1::ListShardsResponse> shards =
          client_->ListShards(ps, /*include_backups=*/replicated);
      if (!shards.ok()) return shards.status();
      for (const v1::ShardStats& s : shards->shards()) {
        if (!s.is_table() && (!s.backup() || s.promoted())) {
          applied = std::max(applied, s.applied_step());
        }
      }
    }
    if (applied > 0) {
      LOG(INFO) << "recovered global step " << applied
                << " from the ps tasks (steps their shards have applied)";
      sync_.SetGlobalStep(applied);
    }
  }
  if (checkpoints_ != nullptr && !have_checkpoint) {
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
  for (const std::string& a : ps_addresses_) model_.add_ps_addresses(a);
  *model_.mutable_sync() = options_.sync;
  *model_.mutable_config() = options_.config;
  *model_.mutable_training() = options_.training;
  model_ready_ = true;
  SetPhaseLocked(ServingPhase(), "");
  LOG(INFO) << "every variable is created and initialized on its ps task";
  // A failed-over task that serves again gets its backups rebuilt, as when it comes back under
  // the chief that failed it over (one down now is, once it registers: MaintenanceLoop).
  for (int ps : failed_earlier) {
    if (options_.sync.mode() != v1::SYNC && registry_.IncarnationOf(MakeTaskId(kPsJob, ps)) != 0) {
      LOG(WARNING) << "ps:" << ps << " serves again after its failover: rebuilding onto it the "
                   << "backups it held of the tasks still serving";
      ScheduleRebuild(ps);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> Coordinator::OwnEvaluation(int64_t step) {
  if (!options_.evaluate) {
    return absl::FailedPreconditionError(
        "this chief has no evaluation of its own (CoordinatorOptions::evaluate is unset)");
  }
  const double training_seconds = TrainingSeconds();  // as the pull begins
  PS_ASSIGN_OR_RETURN(EvalResult r, options_.evaluate(step, client_.get()));
  r.training_seconds = training_seconds;
  return r;
}

void Coordinator::RecordEvaluation(const EvalResult& r, const std::string& by) {
  std::string line;
  {
    absl::MutexLock lock(&mu_);
    progress_.set_test_accuracy(r.accuracy);
    progress_.set_test_loss(r.loss);
    progress_.set_test_auc(r.auc);
    progress_.set_test_step(r.step);
    progress_.set_test_evaluated_by(by);
    const double elapsed = absl::ToDoubleSeconds(clock_->Now() - start_time_);
    line = MetricsJsonLine(r, progress_.loss(), progress_.examples_per_second(), elapsed, by);
  }
  LOG(INFO) << absl::StrFormat(
      "evaluation at step %d by %s: test loss %.4f, accuracy %.4f%s%s", r.step, by, r.loss,
      r.accuracy, r.auc >= 0 ? absl::StrFormat(", AUC %.4f", r.auc) : "",
      r.training_seconds >= 0
          ? absl::StrFormat(" (model read at %.3f s of training)", r.training_seconds)
          : "");
  if (options_.metrics_path.empty()) return;
  absl::MutexLock lock(&metrics_mu_);
  std::ofstream metrics(options_.metrics_path, std::ios::app);
  metrics << line << std::endl;
  if (!metrics) LOG(WARNING) << "cannot append to the metrics file " << options_.metrics_path;
}

void Coordinator::EvaluationLoop() {
  // With an evaluator task the chief computes nothing: the evaluator reports (ReportEvaluation)
  // and is asked for the final evaluation; the chief evaluates only if that does not come.
  absl::Time next_eval =
      has_evaluator_ ? absl::InfiniteFuture() : clock_->Now() + options_.eval_every;
  while (true) {
    bool all_finished = false;
    {
      absl::MutexLock lock(&mu_);
      auto wake = [this, next_eval]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_requested_ || progress_.workers_finished() >= num_workers_ ||
               clock_->Now() >= next_eval;
      };
      clock_->AwaitWithDeadline(&mu_, absl::Condition(&wake), next_eval);
      if (stop_requested_) return;
      all_finished = num_workers_ > 0 && progress_.workers_finished() >= num_workers_;
    }
    const int64_t step = CurrentStep();
    if (!all_finished) {
      absl::StatusOr<EvalResult> r = OwnEvaluation(step);
      next_eval = clock_->Now() + options_.eval_every;
      if (r.ok()) {
        RecordEvaluation(*r, "chief");
      } else {
        LOG(WARNING) << "evaluation failed: " << r.status();
      }
      continue;
    }
    // The trained model is saved before anyone is told training is over.
    MaybeCrash(options_.crash_points, kCrashTrainingEnded);
    if (checkpoints_ != nullptr) {
      absl::StatusOr<v1::CheckpointResponse> c = TakeCheckpoint("training finished");
      if (!c.ok()) LOG(WARNING) << "final checkpoint failed: " << c.status();
      MaybeCrash(options_.crash_points, kCrashFinalCheckpointDone);
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
      clock_->AwaitWithDeadline(&mu_, absl::Condition(&done),
                                clock_->Now() + options_.final_eval_timeout);
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
    {
      absl::MutexLock lock(&mu_);
      progress_.set_finished(true);
      SetPhaseLocked(v1::FINISHED, "");
      LOG(INFO) << absl::StrFormat("training finished: final test accuracy %.4f (by %s)",
                                   progress_.test_accuracy(), progress_.test_evaluated_by());
    }
    if (options_.exit_after_training) StopTheCluster();
    return;
  }
}

absl::Status Coordinator::ReportEvaluation(const v1::ReportEvaluationRequest& request,
                                           v1::ReportEvaluationResponse* resp) {
  const v1::ReportEvaluationRequest* req = &request;
  PS_RETURN_IF_ERROR(CheckEvaluationReport(*req));
  EvalResult r;
  r.step = req->step();
  r.examples = req->examples();
  r.loss = req->loss();
  r.accuracy = req->accuracy();
  r.auc = req->auc();
  if (req->has_training_seconds()) r.training_seconds = req->training_seconds();
  {
    absl::MutexLock lock(&mu_);
    if (req->final()) {
      if (progress_.finished() && progress_.test_evaluated_by() == TaskName(req->task()) &&
          progress_.test_step() == req->step()) {
        resp->set_finished(true);  // a retry of the final report already taken
        return absl::OkStatus();
      }
      if (phase_ != v1::FINAL_EVALUATION || final_evaluated_) {
        return absl::FailedPreconditionError(absl::StrCat(
            "a final evaluation is not expected: the chief is ", v1::ChiefPhase_Name(phase_)));
      }
      if (req->step() != final_step_) {
        return absl::FailedPreconditionError(
            absl::StrCat("the final model is that of step ", final_step_, ", not ", req->step()));
      }
    }
  }
  RecordEvaluation(r, TaskName(req->task()));
  absl::MutexLock lock(&mu_);
  if (req->final()) final_evaluated_ = true;
  resp->set_finished(progress_.finished());
  return absl::OkStatus();
}

absl::Status Coordinator::CheckEvaluationReport(const v1::ReportEvaluationRequest& req) const {
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
  if (req.has_training_seconds()) {
    const double elapsed = TrainingSeconds();
    if (!(req.training_seconds() >= 0 && req.training_seconds() <= elapsed)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "evaluation of the model read at ", req.training_seconds(),
          " s of training: expected a time in [0, ", elapsed, "], the training time so far"));
    }
  }
  return absl::OkStatus();
}

absl::Status Coordinator::RegisterTask(const v1::RegisterTaskRequest& req,
                                       v1::RegisterTaskResponse* resp) {
  PS_RETURN_IF_ERROR(registry_.Register(req.task(), req.address(), req.incarnation()));
  resp->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(options_.heartbeat_interval));
  resp->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(options_.heartbeat_timeout));
  return absl::OkStatus();
}

absl::Status Coordinator::Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) {
  PS_ASSIGN_OR_RETURN(bool known,
                      registry_.Heartbeat(req.task(), req.incarnation(), req.step(), req.detail()));
  resp->set_reregister(!known);
  if (known && req.finished() && req.task().job() == kWorkerJob) {
    NoteWorkerFinished(req.task().index(), req.finished_step());
  }
  if (known) {
    absl::MutexLock lock(&mu_);
    const auto& failed = model_.placement().failed_over_ps();
    if (req.task().job() == kPsJob &&
        std::find(failed.begin(), failed.end(), req.task().index()) != failed.end()) {
      resp->set_failed_over(true);
    }
    *resp->mutable_failed_over_ps() = failed;
    if (telling_tasks_to_stop_) resp->set_stop(true);
    // Counted as told only once the task says it is stopping (an answer with `stop` may never
    // reach it); a task that ends by itself once training is over says so too.
    if (req.stopping()) told_to_stop_[TaskName(req.task())] = req.incarnation();
  }
  return absl::OkStatus();
}

void Coordinator::NoteWorkerFinished(int worker, int64_t step) {
  {
    absl::MutexLock lock(&mu_);
    if (!model_ready_) return;  // the next heartbeat says it again
    auto it = workers_.find(worker);
    if (it != workers_.end() && it->second.finished) return;
  }
  v1::ReportStepRequest report;
  report.set_worker(worker);
  report.set_step(step);
  report.set_finished(true);
  v1::ReportStepResponse ignored;
  absl::Status s = ReportStep(report, &ignored);
  absl::MutexLock lock(&mu_);
  if (s.ok()) {
    LOG(INFO) << "worker:" << worker << " had finished training after " << step
              << " steps before this chief started (its heartbeat says so)";
  } else if (refused_finish_.insert(worker).second) {
    LOG(WARNING) << "worker:" << worker << " says it finished training after " << step
                 << " steps; not counted: " << s;
  }
}

bool Coordinator::AllTasksToldToStop(std::vector<std::string>* waiting) const {
  // The registry's lock is not taken under mu_.
  std::vector<v1::TaskStatus> tasks = registry_.Snapshot();
  // A task missing for a moment (its network cut off, or TCP still backing off after a cut)
  // is waited for: it would never hear `stop` once the chief is gone, and wait for it for
  // ever. One missing for longer is taken as gone (killed, its node lost).
  const absl::Duration gone_after = std::max(4 * options_.heartbeat_timeout, absl::Seconds(10));
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  waiting->clear();
  for (const v1::TaskStatus& t : tasks) {
    const std::string name = TaskName(t.task());
    if (t.task().job() == kChiefJob || t.health() == v1::HEALTH_UNKNOWN) continue;
    if (t.health() != v1::HEALTH_SERVING &&
        now - absl::FromUnixMicros(t.last_heartbeat_unix_micros()) > gone_after) {
      continue;
    }
    // (Said by this incarnation: one that restarted since has heard nothing.)
    auto told = told_to_stop_.find(name);
    if (told == told_to_stop_.end() || told->second != t.incarnation()) waiting->push_back(name);
  }
  return waiting->empty();
}

void Coordinator::StopTheCluster() {
  {
    absl::MutexLock lock(&mu_);
    telling_tasks_to_stop_ = true;
  }
  LOG(INFO) << "training is over (--exit_after_training): telling every task to stop";
  const absl::Time deadline = clock_->Now() + options_.exit_grace;
  std::vector<std::string> waiting;
  while (!AllTasksToldToStop(&waiting)) {
    absl::MutexLock lock(&mu_);
    if (stop_requested_) return;
    if (clock_->Now() >= deadline) {
      LOG(WARNING) << "after " << absl::FormatDuration(options_.exit_grace) << ", "
                   << absl::StrJoin(waiting, ", ")
                   << " had not heard that training is over; the chief stops anyway";
      break;
    }
    clock_->AwaitWithDeadline(&mu_, absl::Condition(&stop_requested_),
                              std::min(deadline, clock_->Now() + absl::Milliseconds(100)));
  }
  LOG(INFO) << "every task has been told to stop; the chief stops";
  Stop();
}

absl::Status Coordinator::GetModel(const v1::GetModelRequest& req, const CallContext& call,
                                   v1::GetModelResponse* resp) {
  absl::MutexLock lock(&mu_);
  auto done = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return model_ready_ || stop_requested_; };
  while (req.wait_until_ready() && !done() && !call.cancelled() && clock_->Now() < call.deadline) {
    clock_->AwaitWithDeadline(&mu_, absl::Condition(&done),
                              std::min(call.deadline, clock_->Now() + kWaitSlice));
  }
  if (!model_ready_) {
    return absl::UnavailableError(absl::StrCat("the model is not ready: ", init_state_));
  }
  *resp = model_;
  resp->set_global_step(sync_.global_step());
  return absl::OkStatus();
}

absl::Status Coordinator::AcquireToken(const v1::AcquireTokenRequest& request,
                                       const CallContext& call, v1::AcquireTokenResponse* resp) {
  const v1::AcquireTokenRequest* req = &request;
  if (req->worker() < 0 || req->worker() >= num_workers_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker ", req->worker(), " is not in the cluster (", num_workers_, " workers)"));
  }
  {
    // Until the chief knows the global step (a restarted chief reads it from the ps tasks),
    // no token is granted and no report is counted.
    absl::MutexLock lock(&mu_);
    if (!model_ready_) {
      return absl::UnavailableError(absl::StrCat("the chief is starting: ", init_state_));
    }
  }
  // Wait in slices so a cancelled call or a stopping chief ends the wait.
  const absl::Time deadline = call.deadline;
  if (options_.sync.mode() == v1::ASYNC) {
    // No waiting for other workers; only a checkpoint or a recovery closes the gate.
    while (true) {
      const StepGate::Result r = gate_.Pass(
          req->worker(), std::min(deadline, clock_->Now() + kWaitSlice), req->pushes_in_flight());
      if (r == StepGate::Result::kPassed) break;
      if (r == StepGate::Result::kDrain) {
        resp->set_drain(true);
        return absl::OkStatus();
      }
      if (call.cancelled() || clock_->Now() >= deadline || stop_requested()) {
        return absl::DeadlineExceededError(absl::StrCat(
            "worker ", req->worker(), " is held: a checkpoint or a recovery is under way"));
      }
    }
    resp->set_step(req->step() + 1);
    NoteGranted(req->worker(), AsyncGrantedSteps(resp->step(), req->pushes_in_flight(),
                                                 options_.sync.local_steps()));
    return absl::OkStatus();
  }
  while (true) {
    const absl::Time slice = std::min(deadline, clock_->Now() + kWaitSlice);
    SyncCoordinator::Token token =
        sync_.AcquireToken(req->worker(), req->step(), req->generation(), slice);
    if (token.granted || token.finished) {
      if (token.granted) NoteGranted(req->worker(), token.step + 1);
      resp->set_step(token.step);
      resp->set_generation(token.generation);
      resp->set_finished(token.finished && !token.granted);
      if (token.finished) resp->set_finished(true);
      return absl::OkStatus();
    }
    if (call.cancelled() || clock_->Now() >= deadline || stop_requested()) {
      return absl::DeadlineExceededError(
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

void Coordinator::SetPhase(v1::ChiefPhase phase, const std::string& detail) {
  absl::MutexLock lock(&mu_);
  SetPhaseLocked(phase, detail);
}

void Coordinator::SetPhaseLocked(v1::ChiefPhase phase, const std::string& detail) {
  if (phase != phase_ || detail != phase_detail_) {
    LOG(INFO) << "chief: " << PhaseName(phase_) << " -> " << PhaseName(phase)
              << (detail.empty() ? "" : absl::StrCat(" (", detail, ")"));
  }
  if (phase != phase_) phase_since_ = clock_->Now();
  if (phase == v1::RECOVERING && phase_ != v1::RECOVERING) ++recoveries_;
  phase_ = phase;
  phase_detail_ = detail;
  init_state_ = detail.empty() ? PhaseName(phase) : absl::StrCat(PhaseName(phase), ": ", detail);
}

int64_t Coordinator::recoveries() const {
  absl::MutexLock lock(&mu_);
  return recoveries_;
}

v1::ChiefPhase Coordinator::ServingPhase() const {
  return num_workers_ > 0 && HasNetwork(options_.config) ? v1::TRAINING : v1::MODEL_READY;
}

void Coordinator::NoteGranted(int w, int64_t steps) {
  absl::MutexLock lock(&mu_);
  WorkerProgress& p = workers_[w];
  p.granted_steps = std::max(p.granted_steps, steps);
}

absl::Status Coordinator::ReportStep(const v1::ReportStepRequest& request,
                                     v1::ReportStepResponse* resp) {
  const v1::ReportStepRequest* req = &request;
  {
    absl::MutexLock lock(&mu_);
    if (!model_ready_) {
      return absl::UnavailableError(absl::StrCat("the chief is starting: ", init_state_));
    }
    // Checked before anything is counted: a refused report changes nothing.
    WorkerView view;
    if (req->worker() >= 0 && req->worker() < num_workers_) {
      view.registered = registry_.IncarnationOf(MakeTaskId(kWorkerJob, req->worker())) != 0;
      auto it = workers_.find(req->worker());
      if (it != workers_.end()) view.granted_steps = it->second.granted_steps;
    }
    PS_RETURN_IF_ERROR(
        CheckStepReport(*req, options_.sync.mode(), num_workers_, sync_.global_step(), view));
    // The worker's progress is recorded before its report can release another worker's token
    // below: a status never shows a worker ahead of what the steps it waited for allowed.
    WorkerProgress& w = workers_[req->worker()];
    w.steps = std::max(w.steps, req->step());
  }
  if (options_.sync.mode() != v1::ASYNC && req->examples() > 0) {
    sync_.ReportStep(req->worker(), req->step() - 1, req->generation());
  }
  if (req->finished()) {
    sync_.WorkerFinished(req->worker());
    gate_.Leave(req->worker());
  }
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
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
    // The training clock at the finish (from the first step report): the time the workers
    // trained, without what the chief does after (a final checkpoint, the final evaluation).
    LOG(INFO) << "worker:" << req->worker() << " finished after " << w.steps << " steps ("
              << progress_.workers_finished() << " of " << num_workers_ << " done) at "
              << absl::StrFormat("%.3f", TrainingSecondsLocked(now)) << " s of training";
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
  return absl::OkStatus();
}

void Coordinator::GetClusterStatus(v1::ClusterStatus* resp) const {
  const absl::Time now = clock_->Now();
  std::string address;
  {
    absl::MutexLock lock(&mu_);
    address = address_;
  }
  for (v1::TaskStatus& t : registry_.Snapshot()) {
    if (t.task().job() == kChiefJob) {
      // The chief does not heartbeat itself: if it answers, it is serving.
      t.set_address(address);
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
  FillRebuilds(resp);
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
  resp->set_last_checkpoint(checkpoints_ == nullptr ? "" : checkpoints_->last());
  resp->set_phase(phase_);
  resp->set_phase_detail(phase_detail_);
  resp->set_phase_since_unix_micros(absl::ToUnixMicros(phase_since_));
  *resp->mutable_progress() = progress_;
  for (int w = 0; w < num_workers_; ++w) {
    auto it = workers_.find(w);
    resp->mutable_progress()->add_worker_steps(it == workers_.end() ? 0 : it->second.steps);
  }
  resp->mutable_progress()->set_max_lead(sync_.max_lead());
  resp->mutable_progress()->set_elapsed_seconds(TrainingSecondsLocked(now));
}

double Coordinator::TrainingSecondsLocked(absl::Time now) const {
  return first_report_ == absl::InfinitePast() ? 0 : absl::ToDoubleSeconds(now - first_report_);
}

double Coordinator::TrainingSeconds() const {
  absl::MutexLock lock(&mu_);
  return TrainingSecondsLocked(clock_->Now());
}

}  // namespace pscluster
