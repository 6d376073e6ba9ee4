#ifndef PSCLUSTER_CLIENT_CHIEF_CLIENT_H_
#define PSCLUSTER_CLIENT_CHIEF_CLIENT_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/coordinator_service.pb.h"

namespace pscluster {

// The deadlines of every call to the chief, in one place.
struct ChiefClientOptions {
  // Short calls: RegisterTask, Heartbeat, GetClusterStatus, GetModel (not waiting),
  // ReportStep, ReportEvaluation.
  absl::Duration rpc_timeout = absl::Seconds(5);
  // Long polls (AwaitModel, AwaitToken) wait this long per call, and check between calls
  // whether the caller wants to stop.
  absl::Duration poll_slice = absl::Seconds(1);
  // Checkpoint: the chief holds the workers at a step boundary and every ps task writes.
  absl::Duration checkpoint_timeout = absl::Seconds(120);
};

// What every task (worker, evaluator, ps, psctl) asks the chief, whatever carries it: gRPC to
// a chief daemon (NewGrpcChiefClient), or a Coordinator in this process for unit tests
// (chief/in_process_chief_client.h). Deadlines come from ChiefClientOptions, and the retry
// loops (waiting for the model, long-polling for a token) are written once, here. Errors are
// the chief's, with its address added where the implementation has one. Thread-safe.
class ChiefClient {
 public:
  explicit ChiefClient(const ChiefClientOptions& options) : options_(options) {}
  virtual ~ChiefClient() = default;

  // Where the chief is, for messages ("in-process" for a fake).
  virtual std::string address() const = 0;

  virtual absl::Status RegisterTask(const v1::RegisterTaskRequest& req,
                                    v1::RegisterTaskResponse* resp) = 0;
  virtual absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) = 0;
  virtual absl::Status GetClusterStatus(v1::ClusterStatus* status) = 0;
  // The model as the chief serves it now: UNAVAILABLE until it is ready.
  absl::Status GetModel(v1::GetModelResponse* model) {
    return PollModel(absl::ZeroDuration(), model);
  }
  virtual absl::Status ReportStep(const v1::ReportStepRequest& req,
                                  v1::ReportStepResponse* resp) = 0;
  virtual absl::Status ReportEvaluation(const v1::ReportEvaluationRequest& req,
                                        v1::ReportEvaluationResponse* resp) = 0;
  // Has the chief take a checkpoint now (psctl save).
  virtual absl::Status Checkpoint(v1::CheckpointResponse* resp) = 0;
  // Ends every call in flight at once (CANCELLED), and every later one: for a task that is
  // stopping, so that a call to a chief that is gone (its host dead, the connection hanging)
  // does not hold the task's exit for the call's deadline. A no-op where calls cannot hang.
  virtual void CancelCalls() {}

  // Asks for the model until the chief has it ready, waiting up to poll_slice per call.
  // CANCELLED once `stopped()` is true (checked between calls).
  absl::StatusOr<v1::GetModelResponse> AwaitModel(const std::function<bool()>& stopped);
  // Asks for a token until the chief grants one (or answers drain or finished), waiting up to
  // poll_slice per call. CANCELLED once `stopped()` is true (checked between calls); the
  // chief's errors other than a call's deadline at once.
  absl::Status AwaitToken(const v1::AcquireTokenRequest& req, const std::function<bool()>& stopped,
                          v1::AcquireTokenResponse* resp);

  const ChiefClientOptions& options() const { return options_; }

 protected:
  // One GetModel; with a positive `wait`, the chief holds the call up to that long for the
  // model to be ready (GetModelRequest.wait_until_ready).
  virtual absl::Status PollModel(absl::Duration wait, v1::GetModelResponse* model) = 0;
  // One token request, held by the chief up to `wait` (then DEADLINE_EXCEEDED).
  virtual absl::Status PollToken(const v1::AcquireTokenRequest& req, absl::Duration wait,
                                 v1::AcquireTokenResponse* resp) = 0;

 private:
  const ChiefClientOptions options_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_CHIEF_CLIENT_H_
