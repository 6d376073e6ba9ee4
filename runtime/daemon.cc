#include "runtime/daemon.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "glog/logging.h"
#include "runtime/termination.h"

namespace pscluster {

namespace {

constexpr char kExitCodeUrl[] = "type.googleapis.com/pscluster.ExitCode";

// Ends the process with `code` if it is still there `limit` from now. The thread is detached
// and touches nothing of the process but stderr, which it writes unbuffered: it may outlive
// main() while exit() runs the static destructors (the process ending takes it along).
void EndAfter(const std::string& name, int code, absl::Duration limit) {
  std::thread([name, code, limit] {
    absl::SleepFor(limit);
    std::fprintf(stderr,
                 "%s: tearing down took more than %s after the daemon stopped (threads still "
                 "waiting on connections?); exiting now with code %d\n",
                 name.c_str(), absl::FormatDuration(limit).c_str(), code);
    std::_Exit(code);
  }).detach();
}

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

int RunDaemonMain(absl::string_view name, absl::StatusOr<std::unique_ptr<Daemon>> daemon,
                  absl::Duration teardown_limit) {
  if (!daemon.ok()) {
    std::fprintf(stderr, "%s: %s\n", std::string(name).c_str(),
                 std::string(daemon.status().message()).c_str());
    return 2;
  }
  const int code = RunDaemonUntilSignal(name, **daemon);
  google::FlushLogFiles(google::GLOG_INFO);
  EndAfter(std::string(name), code, teardown_limit);
  daemon->reset();
  return code;
}

}  // namespace pscluster
