#include "client/task_registrar.h"

#include <chrono>

#include "absl/random/random.h"
#include "common/cluster_spec.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

uint64_t NewIncarnation() {
  absl::BitGen gen;
  return absl::Uniform<uint64_t>(gen, 1, UINT64_MAX);
}

void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) {
  ctx->set_deadline(std::chrono::system_clock::now() +
                    std::chrono::microseconds(absl::ToInt64Microseconds(timeout)));
}

}  // namespace

TaskRegistrar::TaskRegistrar(std::unique_ptr<v1::Coordinator::StubInterface> stub,
                             const TaskRegistrarOptions& options, StatusFiller filler)
    : stub_(std::move(stub)),
      options_(options),
      filler_(std::move(filler)),
      incarnation_(NewIncarnation()),
      interval_(options.heartbeat_interval) {}

TaskRegistrar::~TaskRegistrar() { Stop(); }

void TaskRegistrar::Start() {
  thread_ = std::thread([this] { Run(); });
}

void TaskRegistrar::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

bool TaskRegistrar::AwaitRegistered(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(&registered_), deadline);
}

bool TaskRegistrar::RegisterOnce() {
  v1::RegisterTaskRequest req;
  *req.mutable_task() = options_.task;
  req.set_address(options_.address);
  req.set_incarnation(incarnation_);
  v1::RegisterTaskResponse resp;
  grpc::ClientContext ctx;
  SetDeadline(&ctx, options_.rpc_timeout);
  grpc::Status s = stub_->RegisterTask(&ctx, req, &resp);
  if (!s.ok()) {
    LOG_EVERY_N(WARNING, 10) << TaskName(options_.task)
                             << ": cannot register with the chief: " << s.error_message()
                             << " (retrying)";
    return false;
  }
  {
    absl::MutexLock lock(&mu_);
    if (resp.heartbeat_interval_ms() > 0) {
      interval_ = absl::Milliseconds(resp.heartbeat_interval_ms());
    }
    registered_ = true;
  }
  LOG(INFO) << TaskName(options_.task) << ": registered with the chief as " << options_.address;
  if (options_.on_registered) options_.on_registered();
  return true;
}

void TaskRegistrar::Run() {
  // While unregistered, retry every kRetry; then heartbeat every interval_.
  constexpr absl::Duration kRetry = absl::Milliseconds(200);
  bool need_register = true;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (need_register) {
      need_register = !RegisterOnce();
    } else {
      v1::HeartbeatRequest req;
      if (filler_) filler_(&req);
      *req.mutable_task() = options_.task;
      req.set_incarnation(incarnation_);
      v1::HeartbeatResponse resp;
      grpc::ClientContext ctx;
      SetDeadline(&ctx, options_.rpc_timeout);
      grpc::Status s = stub_->Heartbeat(&ctx, req, &resp);
      if (s.ok() && resp.reregister()) {
        LOG(INFO) << TaskName(options_.task) << ": the chief does not know us; registering again";
        need_register = true;
        continue;
      }
      if (!s.ok()) {
        LOG_EVERY_N(WARNING, 10) << TaskName(options_.task)
                                 << ": heartbeat failed: " << s.error_message();
      }
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), need_register ? kRetry : interval_);
  }
}

}  // namespace pscluster
