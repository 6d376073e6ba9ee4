#ifndef PSCLUSTER_RUNTIME_DAEMON_H_
#define PSCLUSTER_RUNTIME_DAEMON_H_

#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

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

// Starts `daemon`, stops it on SIGTERM or SIGINT, waits for it and returns the process exit
// code: 0 after a clean stop, 1 if it failed. REQUIRES: BlockTerminationSignals() was called
// first in main().
int RunDaemonUntilSignal(absl::string_view name, Daemon& daemon);

// For main(): if `daemon` is an error, prints "NAME: WHY" as one line to stderr and returns 2;
// otherwise RunDaemonUntilSignal(name, **daemon).
int RunDaemonMain(absl::string_view name, absl::StatusOr<std::unique_ptr<Daemon>> daemon);

}  // namespace pscluster

#endif  // PSCLUSTER_RUNTIME_DAEMON_H_
