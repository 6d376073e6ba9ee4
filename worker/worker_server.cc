#include "worker/worker_server.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/chief_client.h"
#include "client/cluster_client.h"
#include "client/grpc_chief_client.h"
#include "client/parameter_client.h"
#include "client/ps_follower.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "model/data/shard.h"
#include "model/input.h"
#include "runtime/metrics.h"
#include "worker/step_source.h"
#include "worker/trainer.h"

namespace pscluster {

absl::StatusOr<std::vector<int>> ParseDevices(const std::string& device) {
  std::vector<int> gpus;
  if (device == "cpu") return gpus;
  for (absl::string_view part : absl::StrSplit(device, ',')) {
    int n = -1;
    if (!absl::StartsWith(part, "gpu:") || !absl::SimpleAtoi(part.substr(4), &n) || n < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--device must be cpu, gpu:N, or GPUs gpu:N,gpu:M,..., not \"", device, "\""));
    }
    if (std::find(gpus.begin(), gpus.end(), n) != gpus.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--device names gpu:", n, " twice in \"", device, "\""));
    }
    gpus.push_back(n);
  }
  return gpus;
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Create(const WorkerOptions& options) {
  if (options.cluster.task().job() != kWorkerJob) {
    return absl::InvalidArgumentError(absl::StrCat("the worker must run as a worker task, not ",
                                                   TaskName(options.cluster.task())));
  }
  PS_ASSIGN_OR_RETURN(std::vector<int> gpus, ParseDevices(options.device));
  if (options.pipeline_staleness < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--pipeline_staleness must be >= 0, got ", options.pipeline_staleness));
  }
  std::vector<std::unique_ptr<Kernels>> kernels;
  if (gpus.empty()) kernels.push_back(NewCpuKernels());
  for (int gpu : gpus) {
    CudaKernelsOptions cuda;
    cuda.device = gpu;
    cuda.memory_limit_bytes = options.gpu_memory_limit_bytes;
    PS_ASSIGN_OR_RETURN(std::unique_ptr<Kernels> k, NewCudaKernels(cuda));
    kernels.push_back(std::move(k));
  }
  for (const auto& k : kernels) {
    LOG(INFO) << TaskName(options.cluster.task()) << " computes on " << k->name();
  }
  PS_ASSIGN_OR_RETURN(Authorizer authorizer,
                      AuthorizerForTask(options.host.tls, options.cluster.task()));
  return std::unique_ptr<WorkerServer>(
      new WorkerServer(options, std::move(kernels), std::move(authorizer)));
}

WorkerServer::WorkerServer(const WorkerOptions& options,
                           std::vector<std::unique_ptr<Kernels>> kernels, Authorizer authorizer)
    : options_(options),
      start_time_(absl::Now()),
      kernels_(std::move(kernels)),
      authorizer_(std::move(authorizer)) {}

WorkerServer::~WorkerServer() {
  if (options_.host.metrics != nullptr) options_.host.metrics->RemoveCollectors();
  if (task_) {
    task_->RequestStop();
    task_->Wait();
  }
}

absl::Status WorkerServer::Start() {
  if (options_.host.metrics != nullptr) {
    options_.host.metrics->AddCollector([this] {
      using prometheus::MetricType;
      std::vector<prometheus::MetricFamily> families;
      families.push_back(FamilyBuilder("pscluster_worker_steps_total",
                                       "Steps this worker has completed", MetricType::Counter)
                             .Add(static_cast<double>(steps_.load()))
                             .Build());
      families.push_back(FamilyBuilder("pscluster_worker_staleness",
                                       "Pushes of its own the last step's parameters missed",
                                       MetricType::Gauge)
                             .Add(max_staleness_.load())
                             .Build());
      families.push_back(
          FamilyBuilder("pscluster_worker_finished", "1 once training is done", MetricType::Gauge)
              .Add(finished_.load() ? 1 : 0)
              .Build());
      FamilyBuilder used("pscluster_worker_gpu_memory_used_bytes",
                         "Memory in use on each GPU this worker trains on (every process's)",
                         MetricType::Gauge);
      FamilyBuilder total("pscluster_worker_gpu_memory_total_bytes",
                          "Memory of each GPU this worker trains on", MetricType::Gauge);
      for (const std::unique_ptr<Kernels>& k : kernels_) {
        if (k->device_is_host()) continue;
        const Kernels::MemoryInfo m = k->DeviceMemory();
        used.Add(static_cast<double>(m.used_bytes), {{"device", k->name()}});
        total.Add(static_cast<double>(m.total_bytes), {{"device", k->name()}});
      }
      families.push_back(used.Build());
      families.push_back(total.Build());
      return families;
    });
  }
  ServingTaskOptions serving;
  serving.cluster = options_.cluster;
  serving.host = options_.host;
  serving.heartbeat_interval = options_.heartbeat_interval;
  serving.give_up_on_chief_after = options_.give_up_on_chief_after;
  serving.on_chief_answer = [this](const TaskRegistrarOptions::Answer& answer) {
    if (!answer.failed_over_ps.empty()) failovers_.Heard(answer.failed_over_ps);
  };
  PS_ASSIGN_OR_RETURN(task_, ServingTask::Start(serving, {this}, [this](v1::HeartbeatRequest* r) {
                        r->set_step(steps_.load());
                        r->set_detail(Detail());
                        // The final report, for a chief that started after it.
                        if (finished_.load()) {
                          r->set_finished(true);
                          r->set_finished_step(finished_step_.load());
                        }
                      }));
  task_->RunInBackground([this] { TrainLoop(); });
  return absl::OkStatus();
}

void WorkerServer::Stop() {
  if (task_) task_->RequestStop();
}

absl::Status WorkerServer::Wait() {
  if (!task_) return absl::FailedPreconditionError("the worker was not started");
  task_->Wait();
  return task_->exit_status();
}

void WorkerServer::TrainLoop() {
  while (!task_->stop_requested()) {
    absl::Status s = TrainOnce();
    if (s.ok()) {
      if (!task_->stop_requested()) {
        finished_ = true;
        if (options_.exit_after_training) {
          AwaitTrainingOver();
          task_->RequestStop();
        }
      }
      return;
    }
    LOG(WARNING) << TaskName(options_.cluster.task()) << ": training interrupted: " << s
                 << "; starting again from the chief's model";
    task_->AwaitStopRequested(absl::Now() + absl::Seconds(1));
  }
}

absl::StatusOr<std::unique_ptr<ChiefClient>> WorkerServer::ChiefOfCluster() const {
  PS_ASSIGN_OR_RETURN(std::string chief_address,
                      TaskAddress(options_.cluster.cluster(), kChiefJob, 0));
  GrpcChannelOptions channel;
  channel.tls = options_.host.tls;
  channel.max_message_bytes = options_.host.max_message_bytes;
  return NewGrpcChiefClient(chief_address, {}, channel);
}

void WorkerServer::AwaitTrainingOver() {
  absl::StatusOr<std::unique_ptr<ChiefClient>> chief = ChiefOfCluster();
  if (!chief.ok()) return;
  const std::string name = TaskName(options_.cluster.task());
  LOG(INFO) << name << ": done; exiting once the chief has the final model (its status says "
            << "training finished, or it tells this task to stop)";
  absl::Time last_answer = absl::Now();
  while (!task_->stop_requested()) {
    v1::ClusterStatus status;
    const absl::Status s = (*chief)->GetClusterStatus(&status);
    if (s.ok()) {
      last_answer = absl::Now();
      if (status.progress().finished()) {
        // (A chief telling every task to stop waits for this.)
        task_->SayStopping();
        return;
      }
    } else if (absl::Now() - last_answer > options_.chief_gone_after) {
      LOG(WARNING) << name << ": the chief has not answered for "
                   << absl::FormatDuration(absl::Now() - last_answer) << " (" << s << "); exiting";
      return;
    }
    task_->AwaitStopRequested(absl::Now() + absl::Seconds(1));
  }
}

absl::Status WorkerServer::TrainOnce() {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ChiefClient> chief, ChiefOfCluster());
  absl::StatusOr<v1::GetModelResponse> fetched =
      chief->AwaitModel([this] { return task_->stop_requested(); });
  if (!fetched.ok()) return absl::OkStatus();  // stopping
  const v1::GetModelResponse& model = *fetched;
  v1::DataConfig data = model.training().data();
  if (!options_.data_path.empty()) data.set_path(options_.data_path);
  PS_ASSIGN_OR_RETURN(Dataset all, LoadDataset(data, model.config(), /*train=*/true));
  const int index = options_.cluster.task().index();
  const int count = NumTasks(options_.cluster.cluster(), kWorkerJob);
  Dataset shard = ShardDataset(all, index, count);
  LOG(INFO) << TaskName(options_.cluster.task()) << ": " << shard.num_examples << " of "
            << all.num_examples << " training examples are this worker's shard";

  std::vector<std::string> addresses(model.ps_addresses().begin(), model.ps_addresses().end());
  // Where the ps tasks are now (moved, or failed over to their backups), looked up while a
  // call to a ps task is retried and when a step fails.
  PsFollower follower(chief.get(), addresses, TaskName(options_.cluster.task()));
  ParameterClientOptions client_options;
  client_options.wire_dtype = options_.wire_dtype;
  client_options.worker = index;
  client_options.before_retry = [&follower](int) { follower.Follow(); };
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<ParameterClient> client,
      ParameterClient::Create(model.model(), model.placement(),
                              NewPsTransport(addresses, options_.tensor_wire, options_.host.tls),
                              client_options));
  follower.Attach(client.get());
  // A failover the chief's heartbeat answers tell of is followed at once, even while every
  // call of this worker hangs on the task that was failed over.
  failovers_.Set(&follower);
  const absl::Cleanup unwatch = [this] { failovers_.Set(nullptr); };
  TrainerOptions trainer_options;
  trainer_options.before_retry = [&follower] { follower.Follow(); };
  trainer_options.worker = index;
  trainer_options.num_workers = count;
  trainer_options.step_delay = options_.step_delay;
  trainer_options.report_every = options_.report_every;
  trainer_options.step_counter = &steps_;
  trainer_options.staleness = options_.pipeline_staleness;
  trainer_options.cuda_graphs = options_.cuda_graphs;
  ChiefStepSource source(chief.get(), index);
  std::vector<Kernels*> towers;
  for (const auto& k : kernels_) towers.push_back(k.get());
  Trainer trainer(model, std::move(shard), client.get(), towers, &source, trainer_options);
  absl::Status s = trainer.Run([this, &trainer] {
    max_staleness_ = trainer.max_staleness();
    return task_->stop_requested();
  });
  max_staleness_ = trainer.max_staleness();
  finished_step_ = trainer.finished_step();
  return s;
}

grpc::Status WorkerServer::GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest*,
                                     v1::TaskStatus* resp) {
  PS_RETURN_IF_DENIED(authorizer_.Check(*ctx, "Worker.GetStatus"));
  *resp->mutable_task() = options_.cluster.task();
  resp->set_address(task_->address());
  resp->set_health(v1::HEALTH_SERVING);
  resp->set_start_unix_micros(absl::ToUnixMicros(start_time_));
  resp->set_uptime_micros(absl::ToInt64Microseconds(absl::Now() - start_time_));
  resp->set_step(steps_.load());
  resp->set_detail(Detail());
  return grpc::Status::OK;
}

std::string WorkerServer::Detail() const {
  return absl::StrCat(finished_.load() ? "finished" : "training", " on ", kernels_.size(),
                      " device(s); pipeline staleness max ", max_staleness_.load(), " (bound ",
                      options_.pipeline_staleness, ")");
}

}  // namespace pscluster
