#include "ps_server/sync_accumulator.h"

#include <algorithm>

namespace pscluster {

DenseAccumulator::DenseAccumulator(int64_t num_elements, int replicas)
    : n_(num_elements), replicas_(std::max(1, replicas)) {
  absl::MutexLock lock(&mu_);
  sum_.assign(n_, 0.0);
}

void DenseAccumulator::SettleLocked(int64_t before_step, const ApplyFn& apply) {
  // The pending update is step step_ - 1's.
  if (!pending_ || (before_step >= 0 && step_ - 1 >= before_step)) return;
  apply(mean_.data());
  pending_ = false;
}

AccumulateOutcome DenseAccumulator::Add(int64_t step, int worker, const float* grad,
                                        const ApplyFn& apply, int64_t* order) {
  absl::MutexLock lock(&mu_);
  if (step < step_) return AccumulateOutcome::kStale;
  if (step > step_) return AccumulateOutcome::kAhead;
  if (workers_.count(worker)) return AccumulateOutcome::kDuplicate;
  SettleLocked(step, apply);
  workers_.insert(worker);
  ++adds_;
  if (order != nullptr) *order = adds_;
  for (int64_t i = 0; i < n_; ++i) sum_[i] += grad[i];
  if (static_cast<int>(workers_.size()) < replicas_) return AccumulateOutcome::kAccumulated;
  mean_.resize(n_);
  for (int64_t i = 0; i < n_; ++i) mean_[i] = static_cast<float>(sum_[i] / replicas_);
  pending_ = true;
  ++step_;
  workers_.clear();
  std::fill(sum_.begin(), sum_.end(), 0.0);
  return AccumulateOutcome::kComplete;
}

bool DenseAccumulator::Settle(int64_t before_step, const ApplyFn& apply) {
  absl::MutexLock lock(&mu_);
  const bool had = pending_;
  SettleLocked(before_step, apply);
  return had && !pending_;
}

int64_t DenseAccumulator::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

int64_t DenseAccumulator::adds() const {
  absl::MutexLock lock(&mu_);
  return adds_;
}

void DenseAccumulator::SetStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  step_ = step;
  adds_ = 0;
  workers_.clear();
  std::fill(sum_.begin(), sum_.end(), 0.0);
  pending_ = false;
}

SparseAccumulator::SparseAccumulator(int64_t dim, int replicas)
    : dim_(dim), replicas_(std::max(1, replicas)) {}

void SparseAccumulator::ResetLocked() {
  parts_.clear();
  complete_workers_ = 0;
  sums_.clear();
}

void SparseAccumulator::SettleLocked(int64_t before_step, const ApplyFn& apply) {
  if (!pending_ || (before_step >= 0 && step_ - 1 >= before_step)) return;
  apply(step_ - 1, pending_keys_.data(), static_cast<int64_t>(pending_keys_.size()),
        pending_mean_.data());
  pending_ = false;
}

AccumulateOutcome SparseAccumulator::Add(int64_t step, int worker, const int64_t* keys, int64_t n,
                                         const float* grads, const ApplyFn& apply) {
  return Add(step, worker, 0, 1, keys, n, grads, apply);
}

AccumulateOutcome SparseAccumulator::Add(int64_t step, int worker, int part, int num_parts,
                                         const int64_t* keys, int64_t n, const float* grads,
                                         const ApplyFn& apply) {
  num_parts = std::max(1, num_parts);
  absl::MutexLock lock(&mu_);
  if (step < step_) return AccumulateOutcome::kStale;
  if (step > step_) return AccumulateOutcome::kAhead;
  std::set<int>& parts = parts_[worker];
  if (part < 0 || part >= num_parts || parts.count(part) ||
      static_cast<int>(parts.size()) >= num_parts) {
    return AccumulateOutcome::kDuplicate;
  }
  SettleLocked(step, apply);
  parts.insert(part);
  if (static_cast<int>(parts.size()) == num_parts) ++complete_workers_;
  absl::flat_hash_map<int64_t, bool> seen_in_this_gradient;
  for (int64_t i = 0; i < n; ++i) {
    KeySum& ks = sums_[keys[i]];
    if (ks.sum.empty()) ks.sum.assign(dim_, 0.0f);
    for (int64_t j = 0; j < dim_; ++j) ks.sum[j] += grads[i * dim_ + j];
    if (seen_in_this_gradient.emplace(keys[i], true).second) ++ks.count;
  }
  if (complete_workers_ < replicas_) return AccumulateOutcome::kAccumulated;
  pending_keys_.clear();
  pending_mean_.clear();
  for (auto& [key, ks] : sums_) {
    pending_keys_.push_back(key);
    for (int64_t j = 0; j < dim_; ++j) pending_mean_.push_back(ks.sum[j] / ks.count);
  }
  pending_ = true;
  ++step_;
  ResetLocked();
  return AccumulateOutcome::kComplete;
}

bool SparseAccumulator::Settle(int64_t before_step, const ApplyFn& apply) {
  absl::MutexLock lock(&mu_);
  const bool had = pending_;
  SettleLocked(before_step, apply);
  return had && !pending_;
}

int64_t SparseAccumulator::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

void SparseAccumulator::SetStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  step_ = step;
  ResetLocked();
  pending_ = false;
}

}  // namespace pscluster
