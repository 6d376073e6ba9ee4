#ifndef PSCLUSTER_CHIEF_COORDINATOR_SERVICE_H_
#define PSCLUSTER_CHIEF_COORDINATOR_SERVICE_H_

#include "chief/coordinator.h"
#include "common/clock.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "security/authz.h"

namespace pscluster {

// The Coordinator gRPC service over a Coordinator: it converts statuses, and each call's
// deadline and cancellation into a CallContext on the coordinator's clock, and checks the
// caller's role; nothing else.
// Thread-safe.
class CoordinatorService : public v1::Coordinator::Service {
 public:
  // Neither is owned; both must outlive the service. `authorizer` decides who may call what
  // (security/authz.h).
  CoordinatorService(Coordinator* core, Clock* clock,
                     Authorizer authorizer = Authorizer::AllowAll())
      : core_(core), clock_(clock), authorizer_(std::move(authorizer)) {}

  grpc::Status RegisterTask(grpc::ServerContext* ctx, const v1::RegisterTaskRequest* req,
                            v1::RegisterTaskResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status GetClusterStatus(grpc::ServerContext* ctx, const v1::GetClusterStatusRequest* req,
                                v1::ClusterStatus* resp) override;
  grpc::Status GetModel(grpc::ServerContext* ctx, const v1::GetModelRequest* req,
                        v1::GetModelResponse* resp) override;
  grpc::Status AcquireToken(grpc::ServerContext* ctx, const v1::AcquireTokenRequest* req,
                            v1::AcquireTokenResponse* resp) override;
  grpc::Status ReportStep(grpc::ServerContext* ctx, const v1::ReportStepRequest* req,
                          v1::ReportStepResponse* resp) override;
  grpc::Status Checkpoint(grpc::ServerContext* ctx, const v1::CheckpointRequest* req,
                          v1::CheckpointResponse* resp) override;
  grpc::Status ReportEvaluation(grpc::ServerContext* ctx, const v1::ReportEvaluationRequest* req,
                                v1::ReportEvaluationResponse* resp) override;

 private:
  CallContext ContextOf(grpc::ServerContext* ctx) const;

  Coordinator* const core_;
  Clock* const clock_;
  const Authorizer authorizer_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_COORDINATOR_SERVICE_H_
