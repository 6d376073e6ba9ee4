#ifndef PSCLUSTER_CLIENT_TASK_REGISTRAR_H_
#define PSCLUSTER_CLIENT_TASK_REGISTRAR_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/chief_client.h"
#include "proto/coordinator_service.pb.h"

namespace pscluster {

struct TaskRegistrarOptions {
  v1::TaskId task;
  // The address this task really serves on (with the bound port).
  std::string address;
  // Between heartbeats; the chief's answer to RegisterTask overrides it.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // Called (on the registrar's thread, no lock held) after every accepted registration.
  std::function<void()> on_registered;
  // Called (on the registrar's thread, no lock held) once, when a heartbeat's answer says
  // training is over and the task should stop (HeartbeatResponse.stop).
  std::function<void()> on_stop;
  // Called (on the registrar's thread, no lock held) once, when the chief has answered no
  // registration or heartbeat for `give_up_after` (since its last answer, or since Start): it
  // is gone for good (its Job failed). Infinite: never.
  absl::Duration give_up_after = absl::InfiniteDuration();
  std::function<void()> on_chief_gone;
  // Called (on the registrar's thread, no lock held) after every registration or heartbeat the
  // chief answered: when the request was sent, the chief's heartbeat timeout (from its last
  // registration answer; zero when it gave none) and whether it says the task was failed over
  // (HeartbeatResponse.failed_over).
  struct Answer {
    absl::Time sent;
    absl::Duration heartbeat_timeout;
    bool failed_over = false;
    std::vector<int> failed_over_ps;  // HeartbeatResponse.failed_over_ps
  };
  std::function<void(const Answer&)> on_answer;
};

// Announces a task to the chief and keeps it known: registers (retrying while the chief is
// unreachable), then sends heartbeats, and registers again when the chief says it does not
// know this incarnation (it restarted). Every process start has a new random incarnation.
// When the chief answers a heartbeat with `stop` (training is over), it calls on_stop once.
//
// Lifecycle: constructed -> Start() -> Stop(). Thread-safe.
class TaskRegistrar {
 public:
  // Called before each heartbeat to fill in the step and detail.
  using StatusFiller = std::function<void(v1::HeartbeatRequest*)>;

  TaskRegistrar(std::unique_ptr<ChiefClient> chief, const TaskRegistrarOptions& options,
                StatusFiller filler = nullptr);
  ~TaskRegistrar();

  void Start();
  // Returns true once the chief has accepted the registration, false at the deadline.
  bool AwaitRegistered(absl::Time deadline);
  // Stops the background thread; idempotent.
  void Stop();
  // Tells the chief this task is stopping (a heartbeat with HeartbeatRequest.stopping), on the
  // caller's thread: for a task that ends by itself once training is over, so that a chief
  // telling every task to stop need not wait for it to go missing. Best effort; once.
  void SayStopping();

  uint64_t incarnation() const { return incarnation_; }

 private:
  void Run();
  bool RegisterOnce();

  const std::unique_ptr<ChiefClient> chief_;
  const TaskRegistrarOptions options_;
  const StatusFiller filler_;
  const uint64_t incarnation_;
  std::thread thread_;
  std::atomic<bool> said_stopping_{false};
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool registered_ ABSL_GUARDED_BY(mu_) = false;
  bool told_to_stop_ = false;         // only the registrar's thread uses it
  absl::Duration heartbeat_timeout_;  // the chief's; only the registrar's thread uses it
  absl::Duration interval_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_TASK_REGISTRAR_H_
