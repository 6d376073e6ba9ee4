#ifndef PSCLUSTER_CHIEF_STEP_REPORTS_H_
#define PSCLUSTER_CHIEF_STEP_REPORTS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "proto/coordinator_service.pb.h"
#include "proto/ps_service.pb.h"

namespace pscluster {

// What the chief knows of one worker when a report of its progress arrives.
struct WorkerView {
  // The worker has registered with this chief (a chief that restarted knows it again once
  // its next heartbeat re-registers it).
  bool registered = false;
  // ASYNC and SSP: the most steps done that this chief's tokens allow the worker: the newest
  // token's step + 1 (ASYNC: the step the worker asked to go on to, as it walks its own
  // steps). 0 while this chief has granted it none: a worker's first report to a restarted
  // chief may come before its first token, and is taken as it is.
  int64_t granted_steps = 0;
};

// Checks a ReportStep against the chief's state, before anything is counted. OK, or an error
// naming the field, the value and what was expected:
// - INVALID_ARGUMENT: worker outside [0, num_workers); a negative step, examples, epoch or
//   max_staleness; a mean_staleness that is negative or not finite; SYNC: a step past the
//   global step + 1 (no worker can have completed a step that has not started); ASYNC and
//   SSP: more steps done than this chief's tokens allow (view.granted_steps, when not 0);
//   any mode: more than kMaxReportedSteps steps or kMaxReportedExamples examples (sums of
//   them must not overflow).
// - UNAVAILABLE: the worker has not registered with this chief (a real worker retries after
//   its heartbeat re-registers it).
// The values are the worker's own: whether the caller may speak for the worker is the
// transport's concern (mutual TLS), not this check's.
inline constexpr int64_t kMaxReportedSteps = int64_t{1} << 40;
inline constexpr int64_t kMaxReportedExamples = int64_t{1} << 50;

absl::Status CheckStepReport(const v1::ReportStepRequest& report, v1::UpdateMode mode,
                             int num_workers, int64_t global_step, const WorkerView& view);

// ASYNC: the most steps done a worker's reports may count once a gate pass granted it `step`:
// the granted step; the steps a pipelined worker still runs, since it asks for its next pass
// while one runs (`pushes_in_flight`, counted up to 64); and with local steps (SyncOptions
// .local_steps = K > 1) all K steps the pass covers, since such a worker passes the gate once
// per K steps.
int64_t AsyncGrantedSteps(int64_t step, int pushes_in_flight, int local_steps);

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_STEP_REPORTS_H_
