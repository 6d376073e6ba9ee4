#include "worker/in_process_step_source.h"

#include <algorithm>

#include "absl/time/clock.h"
#include "chief/step_reports.h"
#include "common/status_macros.h"

namespace pscluster {

InProcessStepSource::InProcessStepSource(v1::UpdateMode mode, int32_t worker,
                                         SyncCoordinator* coordinator, StepGate* gate,
                                         int local_steps)
    : mode_(mode),
      worker_(worker),
      coordinator_(coordinator),
      gate_(gate),
      local_steps_(local_steps) {}

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
        absl::MutexLock lock(&mu_);
        granted_steps_ = std::max(granted_steps_,
                                  AsyncGrantedSteps(grant->step, pushes_in_flight, local_steps_));
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
        if (token.granted) {
          absl::MutexLock lock(&mu_);
          granted_steps_ = std::max(granted_steps_, token.step + 1);
        }
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
  const v1::ReportStepRequest request = ToReportStepRequest(worker_, report);
  WorkerView view;
  view.registered = true;
  {
    absl::MutexLock lock(&mu_);
    view.granted_steps = granted_steps_;
  }
  // SYNC's bound is the coordinator's global step, which its own tests check; ASYNC and SSP
  // are bound by the steps granted here.
  if (mode_ != v1::SYNC) {
    PS_RETURN_IF_ERROR(CheckStepReport(request, mode_, worker_ + 1, /*global_step=*/0, view));
  }
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
