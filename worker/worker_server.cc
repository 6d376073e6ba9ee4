#include "worker/worker_server.h"

#include <chrono>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "client/grpc_ps_transport.h"
#include "client/parameter_client.h"
#include "common/cluster_spec.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "worker/data/shard.h"
#include "worker/input.h"
#include "worker/trainer.h"

namespace pscluster {

absl::StatusOr<int> ParseGpuDevice(const std::string& device) {
  if (device == "cpu") return -1;
  int n = -1;
  if (!absl::StartsWith(device, "gpu:") || !absl::SimpleAtoi(device.substr(4), &n) || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or gpu:N, not \"", device, "\""));
  }
  return n;
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(const WorkerOptions& options) {
  if (options.cluster.task().job() != kWorkerJob) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the worker must run as a worker task, not ", TaskName(options.cluster.task())));
  }
  PS_ASSIGN_OR_RETURN(int gpu, ParseGpuDevice(options.device));
  std::unique_ptr<Kernels> kernels;
  if (gpu < 0) {
    kernels = NewCpuKernels();
  } else {
    CudaKernelsOptions cuda;
    cuda.device = gpu;
    cuda.memory_limit_bytes = options.gpu_memory_limit_bytes;
    PS_ASSIGN_OR_RETURN(kernels, NewCudaKernels(cuda));
  }
  LOG(INFO) << TaskName(options.cluster.task()) << " computes on " << kernels->name();
  return std::unique_ptr<WorkerServer>(new WorkerServer(options, std::move(kernels)));
}

WorkerServer::WorkerServer(const WorkerOptions& options, std::unique_ptr<Kernels> kernels)
    : options_(options), start_time_(absl::Now()), kernels_(std::move(kernels)) {}

WorkerServer::~WorkerServer() {
  if (task_) task_->RequestStop();
  if (train_thread_.joinable()) train_thread_.join();
  if (task_) task_->Shutdown();
}

absl::Status WorkerServer::Start() {
  ServingTaskOptions serving;
  serving.cluster = options_.cluster;
  serving.host = options_.host;
  serving.heartbeat_interval = options_.heartbeat_interval;
  PS_ASSIGN_OR_RETURN(task_, ServingTask::Start(serving, {this}, [this](v1::HeartbeatRequest* r) {
                        r->set_step(steps_.load());
                        r->set_detail(finished_.load() ? "finished" : "training");
                      }));
  train_thread_ = std::thread([this] { TrainLoop(); });
  return absl::OkStatus();
}

void WorkerServer::Stop() {
  if (task_) task_->RequestStop();
}

absl::Status WorkerServer::Wait() {
  if (!task_) return absl::FailedPreconditionError("the worker was not started");
  task_->AwaitStopRequested();
  if (train_thread_.joinable()) train_thread_.join();
  task_->Shutdown();
  return absl::OkStatus();
}

void WorkerServer::TrainLoop() {
  while (!task_->stop_requested()) {
    absl::Status s = TrainOnce();
    if (s.ok()) {
      if (!task_->stop_requested()) {
        finished_ = true;
        if (options_.exit_after_training) task_->RequestStop();
      }
      return;
    }
    LOG(WARNING) << TaskName(options_.cluster.task()) << ": training interrupted: " << s
                 << "; starting again from the chief's model";
    task_->AwaitStopRequested(absl::Now() + absl::Seconds(1));
  }
}

absl::Status WorkerServer::TrainOnce() {
  const v1::ClusterSpec& spec = options_.cluster.cluster();
  PS_ASSIGN_OR_RETURN(std::string chief_address, TaskAddress(spec, kChiefJob, 0));
  auto chief = v1::Coordinator::NewStub(
      grpc::CreateChannel(chief_address, grpc::InsecureChannelCredentials()));
  v1::GetModelResponse model;
  while (true) {
    if (task_->stop_requested()) return absl::OkStatus();
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::GetModelRequest req;
    req.set_wait_until_ready(true);
    grpc::Status s = chief->GetModel(&ctx, req, &model);
    if (s.ok()) break;
  }
  v1::DataConfig data = model.training().data();
  if (!options_.data_path.empty()) data.set_path(options_.data_path);
  PS_ASSIGN_OR_RETURN(Dataset all, LoadDataset(data, model.config().input_dim(), /*train=*/true));
  const int index = options_.cluster.task().index();
  const int count = NumTasks(spec, kWorkerJob);
  Dataset shard = ShardDataset(all, index, count);
  LOG(INFO) << TaskName(options_.cluster.task()) << ": " << shard.num_examples << " of "
            << all.num_examples << " training examples are this worker's shard";

  std::vector<std::string> addresses(model.ps_addresses().begin(), model.ps_addresses().end());
  ParameterClientOptions client_options;
  client_options.wire_dtype = options_.wire_dtype;
  client_options.worker = index;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterClient> client,
                      ParameterClient::Create(model.model(), model.placement(),
                                              std::make_unique<GrpcPsTransport>(
                                                  addresses, GrpcPsTransportOptions()),
                                              client_options));
  TrainerOptions trainer_options;
  trainer_options.worker = index;
  trainer_options.num_workers = count;
  trainer_options.step_delay = options_.step_delay;
  trainer_options.step_counter = &steps_;
  Trainer trainer(model, std::move(shard), client.get(), kernels_.get(), chief.get(),
                  trainer_options);
  return trainer.Run([this] { return task_->stop_requested(); });
}

grpc::Status WorkerServer::GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                                     v1::TaskStatus* resp) {
  *resp->mutable_task() = options_.cluster.task();
  resp->set_address(task_->address());
  resp->set_health(v1::HEALTH_SERVING);
  resp->set_start_unix_micros(absl::ToUnixMicros(start_time_));
  resp->set_uptime_micros(absl::ToInt64Microseconds(absl::Now() - start_time_));
  resp->set_step(steps_.load());
  resp->set_detail(finished_.load() ? "finished" : "training");
  return grpc::Status::OK;
}

}  // namespace pscluster
