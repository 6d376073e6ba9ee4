#ifndef PSCLUSTER_RUNTIME_SERVING_TASK_H_
#define PSCLUSTER_RUNTIME_SERVING_TASK_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/task_registrar.h"
#include "proto/cluster.pb.h"
#include "runtime/service_host.h"

namespace pscluster {

struct ServingTaskOptions {
  // The cluster and which task this process is.
  v1::ClusterConfig cluster;
  // Server settings; `address` is taken from the cluster spec.
  ServiceHostOptions host;
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Give up on a chief that has not answered for this long: the task stops and exit_status()
  // says why (kExitChiefGone). Infinite: wait for ever.
  absl::Duration give_up_on_chief_after = absl::InfiniteDuration();
  // Called after every registration or heartbeat the chief answered (TaskRegistrarOptions).
  std::function<void(const TaskRegistrarOptions::Answer&)> on_chief_answer;
};

// The part every non-chief daemon shares: serve its gRPC services on the task's address, then
// register with the chief and keep sending heartbeats. Health turns SERVING once the chief
// has accepted the task. When the chief says training is over (it runs with
// --exit_after_training), the task requests its own stop, and its daemon exits 0.
//
// Lifecycle: Start() -> serving (and the daemon's own work, RunInBackground) -> RequestStop()
// (any thread) -> Shutdown(), or Wait() for all of it. Thread-safe.
class ServingTask {
 public:
  // `services` are not owned and must outlive the task. `filler` fills heartbeats.
  static absl::StatusOr<std::unique_ptr<ServingTask>> Start(
      const ServingTaskOptions& options, const std::vector<grpc::Service*>& services,
      TaskRegistrar::StatusFiller filler = nullptr);
  ~ServingTask();

  const std::string& address() const { return host_->address(); }
  const v1::TaskId& task() const { return task_; }

  // Asks the owner to stop (wakes AwaitStopRequested). Idempotent.
  void RequestStop();
  // OK, or UNAVAILABLE with kExitChiefGone once the task stopped because the chief had not
  // answered for give_up_on_chief_after.
  absl::Status exit_status() const;
  bool stop_requested() const;
  // Blocks until RequestStop() or the deadline; returns true if stop was requested.
  bool AwaitStopRequested(absl::Time deadline = absl::InfiniteFuture());

  // Runs the daemon's work (a training or evaluation loop, which returns once
  // stop_requested()) on a thread of its own. At most once.
  void RunInBackground(std::function<void()> work);
  // Blocks until RequestStop(), waits for the background work to return, then Shutdown().
  // Owners call it before destroying the task (also after RequestStop, to stop it now).
  void Wait();

  // Stops heartbeats and the server (calls in flight get the grace period). Idempotent.
  void Shutdown();
  // For a task that ends by itself once training is over: tells the chief it is stopping
  // (TaskRegistrar::SayStopping), before RequestStop.
  void SayStopping() {
    if (registrar_) registrar_->SayStopping();
  }

 private:
  ServingTask(v1::TaskId task, std::unique_ptr<ServiceHost> host);

  const v1::TaskId task_;
  std::unique_ptr<ServiceHost> host_;
  std::unique_ptr<TaskRegistrar> registrar_;
  mutable absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool gave_up_on_chief_ ABSL_GUARDED_BY(mu_) = false;
  std::thread work_;  // RunInBackground's; joined by Wait or the destructor
};

}  // namespace pscluster

#endif  // PSCLUSTER_RUNTIME_SERVING_TASK_H_
