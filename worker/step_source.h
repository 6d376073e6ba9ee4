#ifndef PSCLUSTER_WORKER_STEP_SOURCE_H_
#define PSCLUSTER_WORKER_STEP_SOURCE_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/chief_client.h"
#include "proto/coordinator_service.pb.h"

namespace pscluster {

// What the chief answers a worker that wants to run a step.
struct StepGrant {
  // The step to compute (SYNC: the global step; SSP: this worker's next step; ASYNC: the last
  // done + 1, which the worker need not use).
  int64_t step = 0;
  // SYNC: the generation the step belongs to (see AcquireTokenRequest.generation).
  int64_t generation = 0;
  // Training is over: stop.
  bool finished = false;
  // ASYNC: the gate is closed and the worker still pushes: finish the pushes, ask again.
  bool drain = false;
};

// One progress report (ReportStepRequest).
struct StepReport {
  // Steps completed so far (the next step to do).
  int64_t step = 0;
  int64_t examples = 0;
  // Mean training loss of the reported steps.
  float loss = 0;
  int32_t epoch = 0;
  bool finished = false;
  int64_t generation = 0;
  float mean_staleness = 0;
  int32_t max_staleness = 0;
};

// `report` as worker `worker`'s ReportStepRequest.
v1::ReportStepRequest ToReportStepRequest(int32_t worker, const StepReport& report);

// The chief's side of a worker's training loop: tokens (sync), the staleness bound (SSP), the
// gate (async), and progress reports. The loop depends on this interface only; its one
// implementation, ChiefStepSource, reaches the chief over gRPC in a worker and a Coordinator in
// this process in tests (chief/in_process_chief.h), which may wrap it to watch the calls.
// Thread-compatible.
class StepSource {
 public:
  virtual ~StepSource() = default;

  // Waits until this worker may run a step after `last_done_step`, with `pushes_in_flight` of
  // its steps still being pushed. OK with an empty grant (step -1) when stop() turned true.
  // UNAVAILABLE while the chief is gone or starting.
  virtual absl::Status Acquire(int64_t last_done_step, int64_t generation, int pushes_in_flight,
                               const std::function<bool()>& stop, StepGrant* grant) = 0;
  virtual absl::Status Report(const StepReport& report) = 0;
};

// StepSource over a ChiefClient (the chief's Coordinator service, or a Coordinator in this
// process), for worker `worker`. Thread-compatible.
class ChiefStepSource : public StepSource {
 public:
  // `chief` is not owned and must outlive this object.
  ChiefStepSource(ChiefClient* chief, int32_t worker);

  absl::Status Acquire(int64_t last_done_step, int64_t generation, int pushes_in_flight,
                       const std::function<bool()>& stop, StepGrant* grant) override;
  absl::Status Report(const StepReport& report) override;

 private:
  ChiefClient* const chief_;  // Not owned.
  const int32_t worker_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_STEP_SOURCE_H_
