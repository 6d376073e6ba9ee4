#include "chief/step_reports.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace pscluster {

absl::Status CheckStepReport(const v1::ReportStepRequest& report, v1::UpdateMode mode,
                             int num_workers, int64_t global_step, const WorkerView& view) {
  const int w = report.worker();
  if (w < 0 || w >= num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker ", w, " is not in the cluster (", num_workers, " workers)"));
  }
  const std::string who = absl::StrCat("worker:", w);
  auto negative = [&who](const char* field, int64_t value) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " reports ", field, " ", value, "; expected a count >= 0"));
  };
  if (report.step() < 0) return negative("step", report.step());
  if (report.examples() < 0) return negative("examples", report.examples());
  if (report.epoch() < 0) return negative("epoch", report.epoch());
  if (report.max_staleness() < 0) return negative("max_staleness", report.max_staleness());
  if (report.step() > kMaxReportedSteps || report.examples() > kMaxReportedExamples) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, " reports ", report.step(), " steps and ", report.examples(),
        " examples; expected at most ", kMaxReportedSteps, " and ", kMaxReportedExamples));
  }
  if (!std::isfinite(report.mean_staleness()) || report.mean_staleness() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(who, " reports mean_staleness ",
                                                   report.mean_staleness(),
                                                   "; expected a finite value >= 0"));
  }
  if (!view.registered) {
    return absl::UnavailableError(
        absl::StrCat(who, " has not registered with this chief; a report is counted once it has"));
  }
  if (mode == v1::SYNC) {
    // `step` counts steps done: the newest one, step - 1, is at most the global step.
    if (report.step() - 1 > global_step) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, " reports ", report.step(), " steps done, past the global step ",
                       global_step, "; expected at most ", global_step + 1));
    }
  } else if (view.granted_steps > 0 && report.step() > view.granted_steps) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " reports ", report.step(), " steps done, but this chief's tokens allow ",
                     view.granted_steps, "; expected at most ", view.granted_steps));
  }
  return absl::OkStatus();
}

int64_t AsyncGrantedSteps(int64_t step, int pushes_in_flight, int local_steps) {
  const int64_t running = std::clamp<int64_t>(pushes_in_flight, 0, 64);
  return step + std::max(1, local_steps) + running;
}

}  // namespace pscluster
