#include "worker/step_policy.h"

#include <algorithm>

namespace pscluster {
namespace {

class SyncPolicy final : public StepPolicy {
 public:
  SyncPolicy(int64_t per_epoch, int64_t end) : per_epoch_(per_epoch), end_(end) {}

  StepPlan Plan(const StepGrant& grant) override {
    StepPlan p;
    if (grant.finished || grant.step >= end_) {
      p.end = true;
      return p;
    }
    if (grant.generation != generation_) {
      // Everything of the older generation belongs to abandoned steps; this worker's position
      // is now just before its token.
      p.new_generation = true;
      generation_ = grant.generation;
      last_done_ = grant.step - 1;
    }
    p.tag = grant.step;
    p.pull_step = grant.step;
    p.epoch = grant.step / per_epoch_;
    p.batch = grant.step % per_epoch_;
    return p;
  }
  void Done(const StepPlan& plan) override { last_done_ = plan.tag; }
  int64_t last_done() const override { return last_done_; }
  int64_t generation() const override { return generation_; }
  int64_t steps_done() const override { return last_done_ + 1; }
  bool report_every_step() const override { return true; }
  bool allows_overlap() const override { return false; }

 private:
  const int64_t per_epoch_;
  const int64_t end_;
  int64_t last_done_ = -1;
  int64_t generation_ = 0;
};

// ASYNC and SSP: the worker's own walk through its epochs.
class OwnWalkPolicy final : public StepPolicy {
 public:
  OwnWalkPolicy(bool ssp, int64_t per_epoch, int64_t end)
      : ssp_(ssp), per_epoch_(per_epoch), end_(end) {}

  StepPlan Plan(const StepGrant& grant) override {
    StepPlan p;
    if (grant.finished || next_ >= end_) {
      p.end = true;
      return p;
    }
    p.tag = ssp_ ? grant.step : next_;
    p.epoch = next_ / per_epoch_;
    p.batch = next_ % per_epoch_;
    return p;
  }
  void Done(const StepPlan& plan) override {
    ++next_;
    last_done_ = ssp_ ? plan.tag : next_ - 1;
  }
  int64_t last_done() const override { return last_done_; }
  int64_t generation() const override { return 0; }
  int64_t steps_done() const override { return next_; }
  bool report_every_step() const override { return ssp_; }
  bool allows_overlap() const override { return true; }

 private:
  const bool ssp_;
  const int64_t per_epoch_;
  const int64_t end_;
  int64_t next_ = 0;
  int64_t last_done_ = -1;
};

}  // namespace

std::unique_ptr<StepPolicy> NewStepPolicy(v1::UpdateMode mode, int64_t batches_per_epoch,
                                          int epochs, int64_t max_steps) {
  int64_t end = batches_per_epoch * std::max(1, epochs);
  if (max_steps > 0) end = std::min(end, max_steps);
  if (mode == v1::SYNC) return std::make_unique<SyncPolicy>(batches_per_epoch, end);
  return std::make_unique<OwnWalkPolicy>(mode == v1::SSP, batches_per_epoch, end);
}

}  // namespace pscluster
