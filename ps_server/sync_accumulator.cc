#include "ps_server/sync_accumulator.h"

#include <algorithm>

namespace pscluster {

DenseAccumulator::DenseAccumulator(int64_t num_elements, int replicas)
    : n_(num_elements), replicas_(std::max(1, replicas)) {
  absl::MutexLock lock(&mu_);
  sum_.assign(n_, 0.0);
}

AccumulateOutcome DenseAccumulator::Add(int64_t step, int worker, const float* grad,
                                        std::vector<float>* mean) {
  absl::MutexLock lock(&mu_);
  if (step < step_) return AccumulateOutcome::kStale;
  if (step > step_) return AccumulateOutcome::kAhead;
  if (!workers_.insert(worker).second) return AccumulateOutcome::kDuplicate;
  for (int64_t i = 0; i < n_; ++i) sum_[i] += grad[i];
  if (static_cast<int>(workers_.size()) < replicas_) return AccumulateOutcome::kAccumulated;
  mean->resize(n_);
  for (int64_t i = 0; i < n_; ++i) (*mean)[i] = static_cast<float>(sum_[i] / replicas_);
  ++step_;
  workers_.clear();
  std::fill(sum_.begin(), sum_.end(), 0.0);
  return AccumulateOutcome::kComplete;
}

int64_t DenseAccumulator::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

void DenseAccumulator::SetStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  step_ = step;
  workers_.clear();
  std::fill(sum_.begin(), sum_.end(), 0.0);
}

SparseAccumulator::SparseAccumulator(int64_t dim, int replicas)
    : dim_(dim), replicas_(std::max(1, replicas)) {}

void SparseAccumulator::ResetLocked() {
  workers_.clear();
  sums_.clear();
}

AccumulateOutcome SparseAccumulator::Add(int64_t step, int worker, const int64_t* keys,
                                         int64_t n, const float* grads,
                                         std::vector<int64_t>* out_keys,
                                         std::vector<float>* mean) {
  absl::MutexLock lock(&mu_);
  if (step < step_) return AccumulateOutcome::kStale;
  if (step > step_) return AccumulateOutcome::kAhead;
  if (!workers_.insert(worker).second) return AccumulateOutcome::kDuplicate;
  absl::flat_hash_map<int64_t, bool> seen_in_this_gradient;
  for (int64_t i = 0; i < n; ++i) {
    KeySum& ks = sums_[keys[i]];
    if (ks.sum.empty()) ks.sum.assign(dim_, 0.0f);
    for (int64_t j = 0; j < dim_; ++j) ks.sum[j] += grads[i * dim_ + j];
    if (seen_in_this_gradient.emplace(keys[i], true).second) ++ks.count;
  }
  if (static_cast<int>(workers_.size()) < replicas_) return AccumulateOutcome::kAccumulated;
  out_keys->clear();
  mean->clear();
  for (auto& [key, ks] : sums_) {
    out_keys->push_back(key);
    for (int64_t j = 0; j < dim_; ++j) mean->push_back(ks.sum[j] / ks.count);
  }
  ++step_;
  ResetLocked();
  return AccumulateOutcome::kComplete;
}

int64_t SparseAccumulator::step() const {
  absl::MutexLock lock(&mu_);
  return step_;
}

void SparseAccumulator::SetStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  step_ = step;
  ResetLocked();
}

}  // namespace pscluster
