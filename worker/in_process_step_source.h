#ifndef PSCLUSTER_WORKER_IN_PROCESS_STEP_SOURCE_H_
#define PSCLUSTER_WORKER_IN_PROCESS_STEP_SOURCE_H_

#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "chief/step_gate.h"
#include "chief/sync_coordinator.h"
#include "proto/ps_service.pb.h"
#include "worker/step_source.h"

namespace pscluster {

// A StepSource over the chief's own token and gate logic (SyncCoordinator, StepGate) in this
// process: the in-process fake of the chief for unit tests of the training loop, answering as
// the Coordinator's AcquireToken and ReportStep do, and checking each report as the chief does
// (CheckStepReport, with the steps the gate passes granted: AsyncGrantedSteps): a refused report
// fails the loop as it would against the chief. Thread-safe; several workers' sources may share
// one coordinator and gate.
class InProcessStepSource : public StepSource {
 public:
  // `coordinator` (SYNC, SSP) and `gate` (ASYNC) are not owned and must outlive this object.
  // `local_steps`: the cluster's SyncOptions.local_steps.
  InProcessStepSource(v1::UpdateMode mode, int32_t worker, SyncCoordinator* coordinator,
                      StepGate* gate, int local_steps = 1);

  absl::Status Acquire(int64_t last_done_step, int64_t generation, int pushes_in_flight,
                       const std::function<bool()>& stop, StepGrant* grant) override;
  absl::Status Report(const StepReport& report) override;

  // Every report received, in order.
  std::vector<StepReport> reports() const;
  // Grants answered with drain.
  int drains() const;

 private:
  const v1::UpdateMode mode_;
  const int32_t worker_;
  SyncCoordinator* const coordinator_;  // Not owned.
  StepGate* const gate_;                // Not owned.
  const int local_steps_;
  mutable absl::Mutex mu_;
  int64_t granted_steps_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<StepReport> reports_ ABSL_GUARDED_BY(mu_);
  int drains_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_IN_PROCESS_STEP_SOURCE_H_
