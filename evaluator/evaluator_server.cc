#include "evaluator/evaluator_server.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/chief_client.h"
#include "client/cluster_client.h"
#include "client/grpc_chief_client.h"
#include "client/parameter_client.h"
#include "client/ps_follower.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"
#include "evaluator/evaluation.h"
#include "glog/logging.h"
#include "model/input.h"
#include "model/model.h"
#include "proto/coordinator_service.pb.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<EvaluatorServer>> EvaluatorServer::Create(
    const EvaluatorOptions& options) {
  const v1::TaskId& task = options.cluster.task();
  if (task.job() != kEvaluatorJob || task.index() != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the evaluator must run as task evaluator:0, not ", TaskName(task)));
  }
  if (options.eval_every <= absl::ZeroDuration() || options.poll_every <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the evaluation interval (", absl::FormatDuration(options.eval_every),
                     ") and the polling interval (", absl::FormatDuration(options.poll_every),
                     ") must be positive"));
  }
  if (options.eval_every_steps < 0) {
    return absl::InvalidArgumentError(absl::StrCat("the evaluation interval in steps (",
                                                   options.eval_every_steps,
                                                   ") must be positive, or 0 for none"));
  }
  int gpu = -1;
  if (options.device != "cpu" && (!absl::StartsWith(options.device, "gpu:") ||
                                  !absl::SimpleAtoi(options.device.substr(4), &gpu) || gpu < 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device must be cpu or gpu:N, not \"", options.device, "\""));
  }
  return std::unique_ptr<EvaluatorServer>(new EvaluatorServer(options, gpu));
}

EvaluatorServer::EvaluatorServer(const EvaluatorOptions& options, int gpu)
    : options_(options), gpu_(gpu) {}

EvaluatorServer::~EvaluatorServer() {
  if (task_) {
    task_->RequestStop();
    task_->Wait();
  }
}

absl::Status EvaluatorServer::Start() {
  if (gpu_ >= 0) {
    // Once, before serving: a GPU that cannot be used stops the daemon with the reason, rather
    // than failing every evaluation.
    CudaKernelsOptions cuda;
    cuda.device = gpu_;
    absl::StatusOr<std::unique_ptr<Kernels>> kernels = NewCudaKernels(cuda);
    if (!kernels.ok()) {
      return absl::Status(kernels.status().code(), absl::StrCat("--device=", options_.device, ": ",
                                                                kernels.status().message()));
    }
    gpu_kernels_ = *std::move(kernels);
  }
  ServingTaskOptions serving;
  serving.cluster = options_.cluster;
  serving.host = options_.host;
  serving.heartbeat_interval = options_.heartbeat_interval;
  serving.on_chief_answer = [this](const TaskRegistrarOptions::Answer& answer) {
    if (!answer.failed_over_ps.empty()) failovers_.Heard(answer.failed_over_ps);
  };
  PS_ASSIGN_OR_RETURN(task_, ServingTask::Start(serving, {}, [this](v1::HeartbeatRequest* r) {
                        const int64_t step = evaluated_step_.load();
                        r->set_step(std::max<int64_t>(step, 0));
                        r->set_detail(finished_  ? "finished"
                                      : step < 0 ? "waiting for the model"
                                                 : absl::StrCat("evaluated step ", step));
                      }));
  task_->RunInBackground([this] { EvaluateLoop(); });
  return absl::OkStatus();
}

void EvaluatorServer::Stop() {
  if (task_) task_->RequestStop();
}

absl::Status EvaluatorServer::Wait() {
  if (!task_) return absl::FailedPreconditionError("the evaluator was not started");
  task_->Wait();
  return absl::OkStatus();
}

void EvaluatorServer::EvaluateLoop() {
  while (!task_->stop_requested()) {
    absl::Status s = EvaluateOnce();
    if (s.ok()) {
      if (!task_->stop_requested()) {
        finished_ = true;
        LOG(INFO) << "evaluator:0: training is over";
        if (options_.exit_after_training) {
          task_->SayStopping();  // (a chief telling every task to stop waits for this)
          task_->RequestStop();
        }
      }
      return;
    }
    LOG(WARNING) << "evaluator:0: " << s << "; starting again from the chief's model";
    task_->AwaitStopRequested(absl::Now() + absl::Seconds(1));
  }
}

absl::Status EvaluatorServer::EvaluateOnce() {
  const v1::ClusterSpec& spec = options_.cluster.cluster();
  PS_ASSIGN_OR_RETURN(std::string chief_address, TaskAddress(spec, kChiefJob, 0));
  GrpcChannelOptions channel;
  channel.tls = options_.host.tls;
  channel.max_message_bytes = options_.host.max_message_bytes;
  std::unique_ptr<ChiefClient> chief = NewGrpcChiefClient(chief_address, {}, channel);
  absl::StatusOr<v1::GetModelResponse> fetched =
      chief->AwaitModel([this] { return task_->stop_requested(); });
  if (!fetched.ok()) return absl::OkStatus();  // stopping
  const v1::GetModelResponse& model = *fetched;
  if (!HasNetwork(model.config())) {
    LOG(WARNING) << "evaluator:0: the model has no layers; nothing to evaluate";
    task_->AwaitStopRequested();
    return absl::OkStatus();
  }
  v1::DataConfig data = model.training().data();
  if (!options_.data_path.empty()) data.set_path(options_.data_path);
  PS_ASSIGN_OR_RETURN(Dataset test, LoadDataset(data, model.config(), /*train=*/false));
  std::vector<std::string> addresses(model.ps_addresses().begin(), model.ps_addresses().end());
  // Where the ps tasks are now (moved, or failed over to their backups), looked up while a
  // pull is retried.
  PsFollower follower(chief.get(), addresses, "evaluator:0");
  ParameterClientOptions client_options;  // a reader: worker -1, as tools
  client_options.before_retry = [&follower](int) { follower.Follow(); };
  // On a GPU, as few batches as fit in 1 GiB (at least 1,000 examples): each batch uploads the
  // parameters again, and evaluations every half epoch must keep up with a fast worker.
  int batch_size = 1000;
  if (gpu_kernels_ != nullptr) {
    constexpr int64_t kGpuEvalBytes = int64_t{1} << 30;
    const absl::StatusOr<int64_t> per_example = Model::DeviceBytesPerExample(model.config());
    if (per_example.ok() && *per_example > 0) {
      batch_size = static_cast<int>(std::clamp<int64_t>(
          kGpuEvalBytes / *per_example, 1000, std::max<int64_t>(test.num_examples, 1000)));
    }
  }
  PS_ASSIGN_OR_RETURN(
      std::unique_ptr<ParameterClient> client,
      ParameterClient::Create(model.model(), model.placement(),
                              NewPsTransport(addresses, options_.tensor_wire, options_.host.tls),
                              client_options));
  follower.Attach(client.get());
  failovers_.Set(&follower);  // (as the worker's: docs/replication.md)
  const absl::Cleanup unwatch = [this] { failovers_.Set(nullptr); };
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Evaluator> evaluator,
                      Evaluator::Create(model.config(), client.get(), std::move(test), batch_size,
                                        gpu_kernels_.get()));
  const bool by_steps = options_.eval_every_steps > 0;
  LOG(INFO) << "evaluator:0: evaluating the model on the test set every "
            << (by_steps ? absl::StrCat(options_.eval_every_steps, " steps")
                         : absl::FormatDuration(options_.eval_every))
            << " while training, and at the end";
  const absl::Duration poll_every =
      by_steps ? std::min(options_.poll_every, absl::Milliseconds(10)) : options_.poll_every;

  absl::Time next_eval = absl::Now() + options_.eval_every;
  int64_t last_step = by_steps ? 0 : -1;
  while (!task_->stop_requested()) {
    v1::ClusterStatus status;
    PS_RETURN_IF_ERROR(chief->GetClusterStatus(&status));
    if (status.progress().finished()) return absl::OkStatus();
    const bool final = status.phase() == v1::FINAL_EVALUATION;
    const int64_t step = status.global_step();
    const bool due = by_steps ? step - last_step >= options_.eval_every_steps
                              : absl::Now() >= next_eval && step != last_step;
    if (!final && !due) {
      task_->AwaitStopRequested(absl::Now() + poll_every);
      continue;
    }
    // The chief's training clock as the pull begins: time to accuracy counts no evaluation.
    const double training_seconds = status.progress().elapsed_seconds();
    PS_ASSIGN_OR_RETURN(EvalResult r, evaluator->Evaluate(step));
    next_eval = absl::Now() + options_.eval_every;
    last_step = step;
    evaluated_step_ = step;
    LOG(INFO) << absl::StrFormat(
        "evaluator:0: %sevaluation at step %d: test loss %.4f, accuracy %.4f%s (model read at "
        "%.3f s of training)",
        final ? "final " : "", r.step, r.loss, r.accuracy,
        r.auc >= 0 ? absl::StrFormat(", AUC %.4f", r.auc) : "", training_seconds);
    v1::ReportEvaluationRequest report;
    *report.mutable_task() = options_.cluster.task();
    report.set_step(r.step);
    report.set_examples(r.examples);
    report.set_loss(r.loss);
    report.set_accuracy(r.accuracy);
    report.set_auc(r.auc);
    report.set_final(final);
    report.set_training_seconds(training_seconds);
    v1::ReportEvaluationResponse resp;
    absl::Status reported = chief->ReportEvaluation(report, &resp);
    if (!reported.ok()) {
      // A final evaluation the chief no longer wants (it moved on, or its final step is not
      // this one) is not an error of ours: read its phase again.
      LOG(WARNING) << "evaluator:0: the chief refused the evaluation of step " << r.step << ": "
                   << reported.message();
      if (reported.code() != absl::StatusCode::kFailedPrecondition) return reported;
      task_->AwaitStopRequested(absl::Now() + options_.poll_every);
      continue;
    }
    if (resp.finished()) return absl::OkStatus();
  }
  return absl::OkStatus();
}

}  // namespace pscluster
