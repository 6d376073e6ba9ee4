#include "chief/step_gate.h"

namespace pscluster {

bool StepGate::Pass(int worker, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  inside_.erase(worker);  // its previous step is over
  auto open = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !closed_; };
  if (!clock_->AwaitWithDeadline(&mu_, absl::Condition(&open), deadline)) return false;
  inside_.insert(worker);
  return true;
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
