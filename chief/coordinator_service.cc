#include "chief/coordinator_service.h"

#include "common/grpc_status.h"

namespace pscluster {

CallContext CoordinatorService::ContextOf(grpc::ServerContext* ctx) const {
  CallContext call;
  // The time left to the call, counted from now on the coordinator's clock.
  call.deadline = clock_->Now() + (absl::FromChrono(ctx->deadline()) - absl::Now());
  call.cancelled = [ctx] { return ctx->IsCancelled(); };
  return call;
}

grpc::Status CoordinatorService::RegisterTask(grpc::ServerContext* ctx,
                                              const v1::RegisterTaskRequest* req,
                                              v1::RegisterTaskResponse* resp) {
  PS_RETURN_IF_DENIED(authorizer_.Check(*ctx, "Coordinator.RegisterTask", &req->task()));
  return ToGrpcStatus(core_->RegisterTask(*req, resp));
}

grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* ctx,
                                           const v1::HeartbeatRequest* req,
                                           v1::HeartbeatResponse* resp) {
  PS_RETURN_IF_DENIED(authorizer_.Check(*ctx, "Coordinator.Heartbeat", &req->task()));
  return ToGrpcStatus(core_->Heartbeat(*req, resp));
}

grpc::Status CoordinatorService::GetClusterStatus(grpc::ServerContext* ctx,
                                                  const v1::GetClusterStatusRequest*,
                                                  v1::ClusterStatus* resp) {
  PS_RETURN_IF_DENIED(authorizer_.Check(*ctx, "Coordinator.GetClusterStatus"));
  core_->GetClusterStatus(resp);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::GetModel(grpc::ServerContext* ctx, const v1::GetModelRequest* req,
                                          v1::GetModelResponse* resp) {
  PS_RETURN_IF_DENIED(authorizer_.Check(*ctx, "Coordinator.GetModel"));
  return ToGrpcStatus(core_->GetModel(*req, ContextOf(ctx), resp));
}

grpc::Status CoordinatorService::AcquireToken(grpc::ServerContext* ctx,
                                              const v1::AcquireTokenRequest* req,
                                              v1::AcquireTokenResponse* resp) {
  const v1::TaskId worker = WorkerTask(req->worker());
  PS_RETURN_IF_DENIED(authorizer_.Check(*ctx, "Coordinator.AcquireToken", &worker));
  return ToGrpcStatus(core_->AcquireToken(*req, ContextOf(ctx), resp));
}

grpc::Status CoordinatorService::ReportStep(grpc::ServerContext* ctx,
                                            const v1::ReportStepRequest* req,
                                            v1::ReportStepResponse* resp) {
  const v1::TaskId worker = WorkerTask(req->worker());
  PS_RETURN_IF_DENIED(authorizer_.Check(*ctx, "Coordinator.ReportStep", &worker));
  return ToGrpcStatus(core_->ReportStep(*req, resp));
}

grpc::Status CoordinatorService::Checkpoint(grpc::ServerContext* ctx,
                                            const v1::CheckpointRequest* req,
                                            v1::CheckpointResponse* resp) {
  PS_RETURN_IF_DENIED(authorizer_.Check(*ctx, "Coordinator.Checkpoint"));
  return ToGrpcStatus(core_->Checkpoint(*req, resp));
}

grpc::Status CoordinatorService::ReportEvaluation(grpc::ServerContext* ctx,
                                                  const v1::ReportEvaluationRequest* req,
                                                  v1::ReportEvaluationResponse* resp) {
  PS_RETURN_IF_DENIED(authorizer_.Check(*ctx, "Coordinator.ReportEvaluation", &req->task()));
  return ToGrpcStatus(core_->ReportEvaluation(*req, resp));
}

}  // namespace pscluster
