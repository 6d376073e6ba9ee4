#include "client/grpc_chief_client.h"

#include <chrono>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/grpc_channel.h"
#include "common/grpc_status.h"
#include "grpcpp/grpcpp.h"
#include "proto/coordinator_service.grpc.pb.h"

namespace pscluster {
namespace {

class GrpcChiefClient : public ChiefClient {
 public:
  GrpcChiefClient(const std::string& address, const ChiefClientOptions& options,
                  const GrpcChannelOptions& channel)
      : ChiefClient(options),
        address_(address),
        stub_(v1::Coordinator::NewStub(NewGrpcChannel(address, channel))) {}

  std::string address() const override { return address_; }

  void CancelCalls() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* ctx : live_) ctx->TryCancel();
  }

  absl::Status RegisterTask(const v1::RegisterTaskRequest& req,
                            v1::RegisterTaskResponse* resp) override {
    Call call(this, options().rpc_timeout);
    return Named(stub_->RegisterTask(&call.ctx, req, resp));
  }
  absl::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* resp) override {
    Call call(this, options().rpc_timeout);
    return Named(stub_->Heartbeat(&call.ctx, req, resp));
  }
  absl::Status GetClusterStatus(v1::ClusterStatus* status) override {
    Call call(this, options().rpc_timeout);
    return Named(stub_->GetClusterStatus(&call.ctx, v1::GetClusterStatusRequest(), status));
  }
  absl::Status ReportStep(const v1::ReportStepRequest& req, v1::ReportStepResponse* resp) override {
    Call call(this, options().rpc_timeout);
    return Named(stub_->ReportStep(&call.ctx, req, resp));
  }
  absl::Status ReportEvaluation(const v1::ReportEvaluationRequest& req,
                                v1::ReportEvaluationResponse* resp) override {
    Call call(this, options().rpc_timeout);
    return Named(stub_->ReportEvaluation(&call.ctx, req, resp));
  }
  absl::Status Checkpoint(v1::CheckpointResponse* resp) override {
    Call call(this, options().checkpoint_timeout);
    return Named(stub_->Checkpoint(&call.ctx, v1::CheckpointRequest(), resp));
  }

 protected:
  absl::Status PollModel(absl::Duration wait, v1::GetModelResponse* model) override {
    Call call(this, wait > absl::ZeroDuration() ? wait : options().rpc_timeout);
    v1::GetModelRequest req;
    req.set_wait_until_ready(wait > absl::ZeroDuration());
    return Named(stub_->GetModel(&call.ctx, req, model));
  }
  absl::Status PollToken(const v1::AcquireTokenRequest& req, absl::Duration wait,
                         v1::AcquireTokenResponse* resp) override {
    Call call(this, wait);
    // The deadline of a long poll is its normal end: passed on as it is, for AwaitToken.
    const grpc::Status s = stub_->AcquireToken(&call.ctx, req, resp);
    if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return FromGrpcStatus(s);
    return Named(s);
  }

 private:
  // One call's context with its deadline, known to CancelCalls while the call lives (and
  // cancelled before it starts once CancelCalls was called).
  struct Call {
    Call(GrpcChiefClient* client, absl::Duration timeout) : client(client) {
      ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMicroseconds(timeout));
      absl::MutexLock lock(&client->mu_);
      if (client->cancelled_) ctx.TryCancel();
      client->live_.insert(&ctx);
    }
    ~Call() {
      absl::MutexLock lock(&client->mu_);
      client->live_.erase(&ctx);
    }
    GrpcChiefClient* const client;
    grpc::ClientContext ctx;
  };

  // The chief's own UNAVAILABLE ("the model is not ready") comes with a message of its own; a
  // transport failure or a deadline names the connection.
  absl::Status Named(const grpc::Status& status) const {
    absl::Status s = FromGrpcStatus(status);
    if (s.ok()) return s;
    if (s.code() == absl::StatusCode::kDeadlineExceeded ||
        (s.code() == absl::StatusCode::kUnavailable &&
         !absl::StrContains(s.message(), "not ready") &&
         !absl::StrContains(s.message(), "is starting"))) {
      return absl::Status(s.code(),
                          absl::StrCat("cannot reach the chief at ", address_, ": ", s.message()));
    }
    return absl::Status(s.code(), absl::StrCat("chief at ", address_, ": ", s.message()));
  }

  const std::string address_;
  const std::unique_ptr<v1::Coordinator::Stub> stub_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<grpc::ClientContext*> live_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<ChiefClient> NewGrpcChiefClient(const std::string& address,
                                                const ChiefClientOptions& options,
                                                const GrpcChannelOptions& channel) {
  return std::make_unique<GrpcChiefClient>(address, options, channel);
}

}  // namespace pscluster
