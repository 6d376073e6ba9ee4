#include "chief/sync_coordinator.h"

#include <algorithm>
#include <limits>

#include "glog/logging.h"

namespace pscluster {

SyncCoordinator::SyncCoordinator(const SyncCoordinatorOptions& options, const Clock* clock)
    : options_(options), clock_(clock) {
  absl::MutexLock lock(&mu_);
  generation_ = options.first_generation;
  for (int w = 0; w < options.num_workers; ++w) completed_[w] = 0;
}

int64_t SyncCoordinator::SlowestLocked() const {
  int64_t slowest = std::numeric_limits<int64_t>::max();
  for (const auto& [w, done] : completed_) {
    if (finished_workers_.count(w) == 0) slowest = std::min(slowest, done);
  }
  return slowest;
}

bool SyncCoordinator::OpenStepForLocked(int64_t last_done_step) const {
  if (options_.staleness >= 0 || global_step_ <= last_done_step) return false;
  // Only a step that can still close: enough reports given or still to come.
  int could_report = static_cast<int>(reported_.size());
  for (int w = 0; w < options_.num_workers; ++w) {
    if (!reported_.count(w) && !finished_workers_.count(w)) ++could_report;
  }
  return could_report >= options_.replicas_to_aggregate;
}

bool SyncCoordinator::CanStartLocked(int64_t last_done_step) const {
  // Once training is over, a worker still gets the step that is open for it (the others may
  // have finished while it was on its way), and then the news that it is over.
  if (finished_ && !OpenStepForLocked(last_done_step)) return true;
  if (paused_) return false;
  if (options_.staleness < 0) return global_step_ > last_done_step;
  // SSP: the step to start is last_done_step + 1 (0-based count of completed steps).
  return last_done_step + 1 - options_.staleness <= SlowestLocked();
}

int64_t SyncCoordinator::LastDoneLocked(int64_t reported_last_done, int64_t generation) const {
  // SYNC: in the current generation no worker can be past the global step; one that says so
  // (or is of an older generation) is before the current step. SSP has no global step.
  if (options_.staleness >= 0 ||
      (generation == generation_ && reported_last_done <= global_step_)) {
    return reported_last_done;
  }
  return std::min(reported_last_done, global_step_ - 1);
}

void SyncCoordinator::AdvanceLocked() {
  ++global_step_;
  reported_.clear();
  started_.clear();
  if (global_step_ == pause_at_) paused_ = true;
}

SyncCoordinator::Token SyncCoordinator::AcquireToken(int worker, int64_t last_done_step,
                                                     int64_t generation, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  if (options_.staleness < 0 && generation == generation_ && last_done_step == global_step_ &&
      !reported_.count(worker)) {
    // Asking for the next token says the step is done: a report that went to a chief that has
    // since restarted is not lost.
    reported_.insert(worker);
    completed_[worker] = last_done_step + 1;
    if (static_cast<int>(reported_.size()) >= options_.replicas_to_aggregate) AdvanceLocked();
  }
  auto can_start = [this, last_done_step, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return CanStartLocked(LastDoneLocked(last_done_step, generation));
  };
  Token token;
  token.granted = clock_->AwaitWithDeadline(&mu_, absl::Condition(&can_start), deadline);
  const int64_t last_done = LastDoneLocked(last_done_step, generation);
  token.finished = finished_ && !OpenStepForLocked(last_done);
  token.step = options_.staleness < 0 ? global_step_ : last_done + 1;
  token.generation = generation_;
  if (token.granted && options_.staleness < 0 && !token.finished) started_.insert(worker);
  if (token.granted && options_.staleness >= 0 && !finished_) {
    const int64_t slowest = SlowestLocked();
    if (slowest != std::numeric_limits<int64_t>::max()) {
      max_lead_ = std::max(max_lead_, token.step - slowest);
    }
  }
  return token;
}

bool SyncCoordinator::ReportStep(int worker, int64_t step, int64_t generation) {
  absl::MutexLock lock(&mu_);
  if (options_.staleness >= 0) {
    completed_[worker] = std::max(completed_[worker], step + 1);
    return true;
  }
  if (generation != generation_ || step > global_step_) {
    LOG(INFO) << "worker:" << worker << "'s report of step " << step << " (generation "
              << generation << ") was computed before the global step went back to " << global_step_
              << " (generation " << generation_ << "); dropped";
    return false;
  }
  if (step < global_step_ || (step == global_step_ && reported_.count(worker))) {
    ++dropped_[worker];
    LOG(INFO) << "worker:" << worker << "'s gradient of step " << step
              << " arrived after the step closed; dropped (" << dropped_[worker]
              << " so far from this worker)";
    return false;
  }
  reported_.insert(worker);
  completed_[worker] = step + 1;
  if (static_cast<int>(reported_.size()) >= options_.replicas_to_aggregate) AdvanceLocked();
  return true;
}

void SyncCoordinator::WorkerFinished(int worker) {
  absl::MutexLock lock(&mu_);
  finished_workers_.insert(worker);
  // In sync mode, with fewer active workers than replicas to aggregate nothing could advance.
  if (options_.staleness < 0 && options_.num_workers - static_cast<int>(finished_workers_.size()) <
                                    options_.replicas_to_aggregate) {
    finished_ = true;
  }
}

bool SyncCoordinator::PauseAtStepBoundary(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  paused_ = true;
  if (options_.staleness >= 0) return true;
  // A boundary: nobody holds a token of the current step (or has reported it).
  auto at_boundary = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return (started_.empty() && reported_.empty()) || finished_;
  };
  return clock_->AwaitWithDeadline(&mu_, absl::Condition(&at_boundary), deadline);
}

void SyncCoordinator::Resume() {
  absl::MutexLock lock(&mu_);
  paused_ = false;
}

void SyncCoordinator::PauseAtStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  pause_at_ = step;
}

bool SyncCoordinator::AwaitStep(int64_t step, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto reached = [this, step]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return global_step_ >= step; };
  return clock_->AwaitWithDeadline(&mu_, absl::Condition(&reached), deadline);
}

void SyncCoordinator::SetGlobalStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  global_step_ = step;
  reported_.clear();
  started_.clear();
}

void SyncCoordinator::Rewind(int64_t step) {
  absl::MutexLock lock(&mu_);
  global_step_ = step;
  reported_.clear();
  started_.clear();
  ++generation_;
}

void SyncCoordinator::Finish() {
  absl::MutexLock lock(&mu_);
  finished_ = true;
}

int64_t SyncCoordinator::global_step() const {
  absl::MutexLock lock(&mu_);
  return global_step_;
}

std::map<int, int64_t> SyncCoordinator::dropped_per_worker() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

std::map<int, int64_t> SyncCoordinator::completed() const {
  absl::MutexLock lock(&mu_);
  return completed_;
}

int64_t SyncCoordinator::max_lead() const {
  absl::MutexLock lock(&mu_);
  return max_lead_;
}

std::vector<int> SyncCoordinator::waiting_for() const {
  absl::MutexLock lock(&mu_);
  std::vector<int> out;
  if (finished_) return out;
  if (options_.staleness < 0) {
    for (int w = 0; w < options_.num_workers; ++w) {
      if (!reported_.count(w) && !finished_workers_.count(w)) out.push_back(w);
    }
  } else {
    const int64_t slowest = SlowestLocked();
    for (const auto& [w, done] : completed_) {
      if (done == slowest && !finished_workers_.count(w)) out.push_back(w);
    }
  }
  return out;
}

}  // namespace pscluster
