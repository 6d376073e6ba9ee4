#ifndef PSCLUSTER_CHIEF_IN_PROCESS_CHIEF_CLIENT_H_
#define PSCLUSTER_CHIEF_IN_PROCESS_CHIEF_CLIENT_H_

#include <memory>
#include <string>

#include "chief/coordinator.h"
#include "client/chief_client.h"
#include "common/clock.h"

namespace pscluster {

// A ChiefClient over a Coordinator in this process: the in-process fake of the chief, for
// unit tests of what talks to it (the registrar, the worker's step source, psctl's commands).
// Deadlines are ChiefClientOptions' on `clock` (the coordinator's), and every call is the
// coordinator's own method, so answers and errors are the real chief's. Thread-safe.
class InProcessChiefClient : public ChiefClient {
 public:
  // Neither is owned; both must outlive the client.
  InProcessChiefClient(Coordinator* chief, Clock* clock, const ChiefClientOptions& options = {})
      : ChiefClient(options), chief_(chief), clock_(clock) {}

  std::string address() const override { return "in-process"; }
  absl::Status RegisterTask(const v1::RegisterTaskRequest& req,
                            v1::RegisterTaskResponse* resp) override;
  absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) override;
  absl::Status GetClusterStatus(v1::ClusterStatus* status) override;
  absl::Status ReportStep(const v1::ReportStepRequest& req, v1::ReportStepResponse* resp) override;
  absl::Status ReportEvaluation(const v1::ReportEvaluationRequest& req,
                                v1::ReportEvaluationResponse* resp) override;
  absl::Status Checkpoint(v1::CheckpointResponse* resp) override;

 protected:
  absl::Status PollModel(absl::Duration wait, v1::GetModelResponse* model) override;
  absl::Status PollToken(const v1::AcquireTokenRequest& req, absl::Duration wait,
                         v1::AcquireTokenResponse* resp) override;

 private:
  CallContext Within(absl::Duration timeout) const;

  Coordinator* const chief_;
  Clock* const clock_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_IN_PROCESS_CHIEF_CLIENT_H_
