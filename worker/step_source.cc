#include "worker/step_source.h"

#include <chrono>

#include "common/grpc_status.h"

namespace pscluster {
namespace {

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
}

}  // namespace

ChiefStepSource::ChiefStepSource(v1::Coordinator::StubInterface* chief,
                                 const ChiefStepSourceOptions& options)
    : chief_(chief), options_(options) {}

absl::Status ChiefStepSource::Acquire(int64_t last_done_step, int64_t generation,
                                      int pushes_in_flight, const std::function<bool()>& stop,
                                      StepGrant* grant) {
  // Long-poll: each wait has a deadline, and a stop request ends it.
  while (true) {
    v1::AcquireTokenRequest req;
    req.set_worker(options_.worker);
    req.set_step(last_done_step);
    req.set_generation(generation);
    req.set_pushes_in_flight(pushes_in_flight);
    v1::AcquireTokenResponse resp;
    grpc::ClientContext ctx;
    SetDeadline(&ctx, options_.token_poll);
    absl::Status s = FromGrpcStatus(chief_->AcquireToken(&ctx, req, &resp));
    if (s.ok()) {
      grant->step = resp.step();
      grant->generation = resp.generation();
      grant->finished = resp.finished();
      grant->drain = resp.drain();
      return s;
    }
    if (s.code() != absl::StatusCode::kDeadlineExceeded) return s;
    if (stop()) {
      *grant = StepGrant();
      grant->step = -1;
      return absl::OkStatus();
    }
  }
}

absl::Status ChiefStepSource::Report(const StepReport& report) {
  v1::ReportStepRequest req;
  req.set_worker(options_.worker);
  req.set_step(report.step);
  req.set_examples(report.examples);
  req.set_loss(report.loss);
  req.set_epoch(report.epoch);
  req.set_finished(report.finished);
  req.set_generation(report.generation);
  req.set_mean_staleness(report.mean_staleness);
  req.set_max_staleness(report.max_staleness);
  v1::ReportStepResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.rpc_timeout);
  return FromGrpcStatus(chief_->ReportStep(&ctx, req, &resp));
}

}  // namespace pscluster
