#include "runtime/serving_task.h"

#include "absl/strings/str_cat.h"
#include "client/grpc_chief_client.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "runtime/daemon.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<ServingTask>> ServingTask::Start(
    const ServingTaskOptions& options, const std::vector<grpc::Service*>& services,
    TaskRegistrar::StatusFiller filler) {
  const v1::TaskId& task = options.cluster.task();
  ServiceHostOptions host_options = options.host;
  PS_ASSIGN_OR_RETURN(host_options.address,
                      TaskAddress(options.cluster.cluster(), task.job(), task.index()));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ServiceHost> host,
                      ServiceHost::Start(host_options, services));
  LOG(INFO) << TaskName(task) << " serving on " << host->address();

  PS_ASSIGN_OR_RETURN(std::string chief, TaskAddress(options.cluster.cluster(), "chief", 0));
  auto st = std::unique_ptr<ServingTask>(new ServingTask(task, std::move(host)));
  TaskRegistrarOptions reg;
  reg.task = task;
  reg.address = st->host_->address();
  reg.heartbeat_interval = options.heartbeat_interval;
  ServiceHost* host_ptr = st->host_.get();
  reg.on_registered = [host_ptr] { host_ptr->SetServing(true); };
  // The registrar is stopped in Shutdown(), before the task goes away.
  ServingTask* task_ptr = st.get();
  reg.on_stop = [task_ptr] { task_ptr->RequestStop(); };
  reg.give_up_after = options.give_up_on_chief_after;
  reg.on_answer = options.on_chief_answer;
  reg.on_chief_gone = [task_ptr] {
    {
      absl::MutexLock lock(&task_ptr->mu_);
      task_ptr->gave_up_on_chief_ = true;
    }
    task_ptr->RequestStop();
  };
  GrpcChannelOptions channel;
  channel.tls = options.host.tls;
  channel.max_message_bytes = options.host.max_message_bytes;
  st->registrar_ = std::make_unique<TaskRegistrar>(NewGrpcChiefClient(chief, {}, channel), reg,
                                                   std::move(filler));
  st->registrar_->Start();
  return st;
}

ServingTask::ServingTask(v1::TaskId task, std::unique_ptr<ServiceHost> host)
    : task_(std::move(task)), host_(std::move(host)) {}

ServingTask::~ServingTask() {
  // (Owners call Wait first: the work may use the task through its owner's pointer.)
  RequestStop();
  if (work_.joinable()) work_.join();
  Shutdown();
}

void ServingTask::RunInBackground(std::function<void()> work) {
  work_ = std::thread(std::move(work));
}

void ServingTask::Wait() {
  AwaitStopRequested();
  if (work_.joinable()) work_.join();
  Shutdown();
}

void ServingTask::RequestStop() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
}

absl::Status ServingTask::exit_status() const {
  absl::MutexLock lock(&mu_);
  if (!gave_up_on_chief_) return absl::OkStatus();
  return WithExitCode(
      absl::UnavailableError(absl::StrCat(TaskName(task_),
                                          ": the chief did not answer for --give_up_on_chief_secs; "
                                          "its Job has failed or it is unreachable")),
      kExitChiefGone);
}

bool ServingTask::stop_requested() const {
  absl::MutexLock lock(&mu_);
  return stop_requested_;
}

bool ServingTask::AwaitStopRequested(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithDeadline(absl::Condition(&stop_requested_), deadline);
}

void ServingTask::Shutdown() {
  RequestStop();
  if (registrar_) registrar_->Stop();
  if (host_) host_->Shutdown();
}

}  // namespace pscluster
