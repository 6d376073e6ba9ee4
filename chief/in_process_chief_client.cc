#include "chief/in_process_chief_client.h"

namespace pscluster {

CallContext InProcessChiefClient::Within(absl::Duration timeout) const {
  CallContext call;
  call.deadline = clock_->Now() + timeout;
  return call;
}

absl::Status InProcessChiefClient::RegisterTask(const v1::RegisterTaskRequest& req,
                                                v1::RegisterTaskResponse* resp) {
  return chief_->RegisterTask(req, resp);
}

absl::Status InProcessChiefClient::Heartbeat(const v1::HeartbeatRequest& req,
                                             v1::HeartbeatResponse* resp) {
  return chief_->Heartbeat(req, resp);
}

absl::Status InProcessChiefClient::GetClusterStatus(v1::ClusterStatus* status) {
  chief_->GetClusterStatus(status);
  return absl::OkStatus();
}

absl::Status InProcessChiefClient::ReportStep(const v1::ReportStepRequest& req,
                                              v1::ReportStepResponse* resp) {
  return chief_->ReportStep(req, resp);
}

absl::Status InProcessChiefClient::ReportEvaluation(const v1::ReportEvaluationRequest& req,
                                                    v1::ReportEvaluationResponse* resp) {
  return chief_->ReportEvaluation(req, resp);
}

absl::Status InProcessChiefClient::Checkpoint(v1::CheckpointResponse* resp) {
  return chief_->Checkpoint(v1::CheckpointRequest(), resp);
}

absl::Status InProcessChiefClient::PollModel(absl::Duration wait, v1::GetModelResponse* model) {
  v1::GetModelRequest req;
  req.set_wait_until_ready(wait > absl::ZeroDuration());
  return chief_->GetModel(req, Within(wait), model);
}

absl::Status InProcessChiefClient::PollToken(const v1::AcquireTokenRequest& req,
                                             absl::Duration wait, v1::AcquireTokenResponse* resp) {
  return chief_->AcquireToken(req, Within(wait), resp);
}

}  // namespace pscluster
