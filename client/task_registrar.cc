#include "client/task_registrar.h"

#include "absl/random/random.h"
#include "common/cluster_spec.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

uint64_t NewIncarnation() {
  absl::BitGen gen;
  return absl::Uniform<uint64_t>(gen, 1, UINT64_MAX);
}

}  // namespace

TaskRegistrar::TaskRegistrar(std::unique_ptr<ChiefClient> chief,
                             const TaskRegistrarOptions& options, StatusFiller filler)
    : chief_(std::move(chief)),
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
  // A heartbeat or registration in flight to a chief that is gone would hold the task's exit
  // for its deadline (seconds, and more while the connection hangs): end it now.
  chief_->CancelCalls();
  if (thread_.joinable()) thread_.join();
}

void TaskRegistrar::SayStopping() {
  if (said_stopping_.exchange(true)) return;
  v1::HeartbeatRequest req;
  if (filler_) filler_(&req);
  *req.mutable_task() = options_.task;
  req.set_incarnation(incarnation_);
  req.set_stopping(true);
  v1::HeartbeatResponse ignored;
  if (absl::Status s = chief_->Heartbeat(req, &ignored); !s.ok()) {
    LOG(WARNING) << TaskName(options_.task)
                 << ": could not tell the chief this task is stopping: " << s.message();
  }
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
  const absl::Time sent = absl::Now();
  absl::Status s = chief_->RegisterTask(req, &resp);
  if (!s.ok()) {
    LOG_EVERY_N(WARNING, 10) << TaskName(options_.task)
                             << ": cannot register with the chief: " << s.message()
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
  heartbeat_timeout_ = absl::Milliseconds(resp.heartbeat_timeout_ms());
  LOG(INFO) << TaskName(options_.task) << ": registered with the chief as " << options_.address;
  if (options_.on_answer) options_.on_answer({sent, heartbeat_timeout_, false});
  if (options_.on_registered) options_.on_registered();
  return true;
}

void TaskRegistrar::Run() {
  // While unregistered, retry every kRetry; then heartbeat every interval_.
  constexpr absl::Duration kRetry = absl::Milliseconds(200);
  bool need_register = true;
  absl::Time last_answer = absl::Now();
  bool gave_up = false;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
    }
    if (!gave_up && absl::Now() - last_answer >= options_.give_up_after) {
      gave_up = true;
      LOG(ERROR) << TaskName(options_.task) << ": the chief has not answered for "
                 << absl::FormatDuration(absl::Now() - last_answer)
                 << " (--give_up_on_chief_secs): giving up on it";
      if (options_.on_chief_gone) options_.on_chief_gone();
    }
    if (need_register) {
      need_register = !RegisterOnce();
      if (!need_register) last_answer = absl::Now();
    } else {
      v1::HeartbeatRequest req;
      if (filler_) filler_(&req);
      *req.mutable_task() = options_.task;
      req.set_incarnation(incarnation_);
      // Said again with every heartbeat (SayStopping's own call may have failed).
      if (said_stopping_.load()) req.set_stopping(true);
      v1::HeartbeatResponse resp;
      const absl::Time sent = absl::Now();
      absl::Status s = chief_->Heartbeat(req, &resp);
      if (s.ok()) last_answer = absl::Now();
      if (s.ok() && !resp.reregister() && options_.on_answer) {
        options_.on_answer({sent,
                            heartbeat_timeout_,
                            resp.failed_over(),
                            {resp.failed_over_ps().begin(), resp.failed_over_ps().end()}});
      }
      if (s.ok() && resp.reregister()) {
        LOG(INFO) << TaskName(options_.task) << ": the chief does not know us; registering again";
        need_register = true;
        continue;
      }
      if (!s.ok() && !absl::IsCancelled(s)) {  // (CANCELLED: Stop ended it)
        LOG_EVERY_N(WARNING, 10) << TaskName(options_.task)
                                 << ": heartbeat failed: " << s.message();
      }
      if (s.ok() && resp.stop() && !told_to_stop_) {
        told_to_stop_ = true;
        LOG(INFO) << TaskName(options_.task) << ": the chief says training is over; stopping";
        // Said back at once: the chief waits for it before it exits (an answer it sent
        // earlier may have been lost with a call this task gave up). If this fails, the chief
        // takes the task as gone once its heartbeats stop.
        SayStopping();
        if (options_.on_stop) options_.on_stop();
      }
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stopping_), need_register ? kRetry : interval_);
  }
}

}  // namespace pscluster
