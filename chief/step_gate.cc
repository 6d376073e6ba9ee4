#include "chief/step_gate.h"

namespace pscluster {

StepGate::Result StepGate::Pass(int worker, absl::Time deadline, int pushes_in_flight) {
  absl::MutexLock lock(&mu_);
  if (pushes_in_flight > 0) {
    // Its pushes are not over: it stays inside, and only goes on while the gate is open.
    if (closed_) return Result::kDrain;
    inside_.insert(worker);
    return Result::kPassed;
  }
  inside_.erase(worker);  // its previous steps are over
  auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !closed_; };
  if (!clock_->AwaitWithDeadline(&mu_, absl::Condition(&open), deadline)) {
    return Result::kTimedOut;
  }
  inside_.insert(worker);
  return Result::kPassed;
}

bool StepGate::closed() const {
  absl::MutexLock lock(&mu_);
  return closed_;
}

void StepGate::Leave(int worker) {
  absl::MutexLock lock(&mu_);
  inside_.erase(worker);
}

bool StepGate::Close(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  closed_ = true;
  auto empty = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return inside_.empty(); };
  return clock_->AwaitWithDeadline(&mu_, absl::Condition(&empty), deadline);
}

void StepGate::Open() {
  absl::MutexLock lock(&mu_);
  closed_ = false;
}

std::set<int> StepGate::inside() const {
  absl::MutexLock lock(&mu_);
  return inside_;
}

}  // namespace pscluster
