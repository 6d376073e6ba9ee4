#include "worker/in_process_step_source.h"

#include "absl/time/clock.h"

namespace pscluster {

InProcessStepSource::InProcessStepSource(v1::UpdateMode mode, int32_t worker,
                                         SyncCoordinator* coordinator, StepGate* gate)
    : mode_(mode), worker_(worker), coordinator_(coordinator), gate_(gate) {}

absl::Status InProcessStepSource::Acquire(int64_t last_done_step, int64_t generation,
                                          int pushes_in_flight, const std::function<bool()>& stop,
                                          StepGrant* grant) {
  *grant = StepGrant();
  while (true) {
    const absl::Time slice = absl::Now() + absl::Milliseconds(50);
    if (mode_ == v1::ASYNC) {
      const StepGate::Result r = gate_->Pass(worker_, slice, pushes_in_flight);
      if (r == StepGate::Result::kPassed) {
        grant->step = last_done_step + 1;
        return absl::OkStatus();
      }
      if (r == StepGate::Result::kDrain) {
        absl::MutexLock lock(&mu_);
        ++drains_;
        grant->drain = true;
        return absl::OkStatus();
      }
    } else {
      SyncCoordinator::Token token =
          coordinator_->AcquireToken(worker_, last_done_step, generation, slice);
      if (token.granted || token.finished) {
        grant->step = token.step;
        grant->generation = token.generation;
        grant->finished = token.finished;
        return absl::OkStatus();
      }
    }
    if (stop()) {
      grant->step = -1;
      return absl::OkStatus();
    }
  }
}

absl::Status InProcessStepSource::Report(const StepReport& report) {
  if (mode_ != v1::ASYNC && report.examples > 0) {
    coordinator_->ReportStep(worker_, report.step - 1, report.generation);
  }
  if (report.finished) {
    if (coordinator_ != nullptr) coordinator_->WorkerFinished(worker_);
    if (gate_ != nullptr) gate_->Leave(worker_);
  }
  absl::MutexLock lock(&mu_);
  reports_.push_back(report);
  return absl::OkStatus();
}

std::vector<StepReport> InProcessStepSource::reports() const {
  absl::MutexLock lock(&mu_);
  return reports_;
}

int InProcessStepSource::drains() const {
  absl::MutexLock lock(&mu_);
  return drains_;
}

}  // namespace pscluster
