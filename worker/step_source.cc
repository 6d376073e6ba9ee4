#include "worker/step_source.h"

namespace pscluster {
ChiefStepSource::ChiefStepSource(ChiefClient* chief, int32_t worker)
    : chief_(chief), worker_(worker) {}

absl::Status ChiefStepSource::Acquire(int64_t last_done_step, int64_t generation,
                                      int pushes_in_flight, const std::function<bool()>& stop,
                                      StepGrant* grant) {
  v1::AcquireTokenRequest req;
  req.set_worker(worker_);
  req.set_step(last_done_step);
  req.set_generation(generation);
  req.set_pushes_in_flight(pushes_in_flight);
  v1::AcquireTokenResponse resp;
  absl::Status s = chief_->AwaitToken(req, stop, &resp);
  if (s.code() == absl::StatusCode::kCancelled) {
    *grant = StepGrant();
    grant->step = -1;
    return absl::OkStatus();
  }
  if (!s.ok()) return s;
  grant->step = resp.step();
  grant->generation = resp.generation();
  grant->finished = resp.finished();
  grant->drain = resp.drain();
  return s;
}

v1::ReportStepRequest ToReportStepRequest(int32_t worker, const StepReport& report) {
  v1::ReportStepRequest req;
  req.set_worker(worker);
  req.set_step(report.step);
  req.set_examples(report.examples);
  req.set_loss(report.loss);
  req.set_epoch(report.epoch);
  req.set_finished(report.finished);
  req.set_generation(report.generation);
  req.set_mean_staleness(report.mean_staleness);
  req.set_max_staleness(report.max_staleness);
  return req;
}

absl::Status ChiefStepSource::Report(const StepReport& report) {
  v1::ReportStepResponse resp;
  return chief_->ReportStep(ToReportStepRequest(worker_, report), &resp);
}

}  // namespace pscluster
