#ifndef PSCLUSTER_RUNTIME_DAEMON_H_
#define PSCLUSTER_RUNTIME_DAEMON_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pscluster {

// What every daemon (ps_server, worker, chief) looks like to its main().
// Lifecycle: NEW -> Start() -> STARTED -> Stop() -> STOPPED. Stop() may be called from any
// thread (a signal watcher), also before Wait() returns; Wait() returns once the daemon has
// stopped, either because Stop() was called or because it finished its work.
class Daemon {
 public:
  virtual ~Daemon() = default;
  virtual absl::Status Start() = 0;
  virtual void Stop() = 0;
  virtual absl::Status Wait() = 0;
};

// Exit codes: 0 after a clean stop, 1 if the daemon failed, 2 if it refused to start (bad flags,
// config or environment), and kExitChiefGone when it gave up on a chief that stopped answering
// (--give_up_on_chief_secs): the Kubernetes Jobs fail at once on 2 and 3 (podFailurePolicy), so
// that a run whose chief's Job failed ends.
constexpr int kExitChiefGone = 3;

// `status` (not OK) carrying the exit code its daemon's process should end with.
absl::Status WithExitCode(absl::Status status, int code);

// Starts `daemon`, stops it on SIGTERM or SIGINT, waits for it and returns the process exit
// code: 0 after a clean stop, the code WithExitCode gave Wait()'s error, else 1 if it failed.
// REQUIRES: BlockTerminationSignals() was called first in main().
int RunDaemonUntilSignal(absl::string_view name, Daemon& daemon);

// How long a process may take, once its daemon has stopped, to destroy it and exit. Past it the
// process ends at once (std::_Exit) with the daemon's exit code: gRPC's threads can wait for
// seconds on a connection to a host that is gone (a chief that exited first), and Kubernetes
// would kill the process at its grace period anyway. The daemon's own work is done by then
// (Wait() returned); what is cut short is freeing memory and joining threads, and a ps's
// checkpoint write still under way, which nobody can commit once its ps is stopping.
inline constexpr absl::Duration kTeardownLimit = absl::Seconds(5);

// For main(): if `daemon` is an error, prints "NAME: WHY" as one line to stderr and returns 2;
// otherwise RunDaemonUntilSignal(name, **daemon), then destroys the daemon, and if that and the
// rest of the process's exit take longer than `teardown_limit`, prints a line naming the limit
// to stderr and ends the process with the daemon's exit code.
int RunDaemonMain(absl::string_view name, absl::StatusOr<std::unique_ptr<Daemon>> daemon,
                  absl::Duration teardown_limit = kTeardownLimit);

}  // namespace pscluster

#endif  // PSCLUSTER_RUNTIME_DAEMON_H_
