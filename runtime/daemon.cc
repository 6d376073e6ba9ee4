#include "runtime/daemon.h"

#include <cstdio>
#include <string>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "glog/logging.h"
#include "runtime/termination.h"

namespace pscluster {

namespace {
constexpr char kExitCodeUrl[] = "type.googleapis.com/pscluster.ExitCode";
}  // namespace

absl::Status WithExitCode(absl::Status status, int code) {
  status.SetPayload(kExitCodeUrl, absl::Cord(std::to_string(code)));
  return status;
}

int RunDaemonUntilSignal(absl::string_view name, Daemon& daemon) {
  absl::Status started = daemon.Start();
  if (!started.ok()) {
    LOG(ERROR) << name << " failed to start: " << started;
    daemon.Stop();
    return 1;
  }
  TerminationSignalWatcher watcher([&daemon, name](int) {
    LOG(INFO) << name << ": stopping: no new work is taken, work in flight finishes";
    daemon.Stop();
  });
  absl::Status done = daemon.Wait();
  if (!done.ok()) {
    LOG(ERROR) << name << " stopped with an error: " << done;
    int code = 1;
    if (auto given = done.GetPayload(kExitCodeUrl); given.has_value()) {
      if (!absl::SimpleAtoi(std::string(*given), &code)) code = 1;
    }
    return code;
  }
  LOG(INFO) << name << " stopped cleanly";
  return 0;
}

int RunDaemonMain(absl::string_view name, absl::StatusOr<std::unique_ptr<Daemon>> daemon) {
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s: %s\n", std::string(name).c_str(),
                 std::string(daemon.status().message()).c_str());
    return 2;
  }
  return RunDaemonUntilSignal(name, **daemon);
}

}  // namespace pscluster
