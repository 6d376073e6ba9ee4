#ifndef PSCLUSTER_TESTING_CHILD_PROCESS_H_
#define PSCLUSTER_TESTING_CHILD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pscluster {

struct ChildProcessOptions {
  // Path of the program to run.
  std::string binary;
  // Arguments after argv[0].
  std::vector<std::string> args;
  // Variables set (or replaced) in the child's environment; the rest is inherited.
  std::vector<std::pair<std::string, std::string>> env;
  // stdout and stderr of the child go to this file (created or truncated).
  std::string log_path;
};

// A program started as a child process. The child dies with the parent (PR_SET_PDEATHSIG),
// so a crashed or killed test leaves nothing behind; the destructor kills it with SIGKILL
// if it still runs, and reaps it. Thread-compatible.
class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const ChildProcessOptions& options);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  const ChildProcessOptions& options() const { return options_; }

  // Sends `signo`. FAILED_PRECONDITION if the child has already exited.
  absl::Status Signal(int signo);

  // Waits up to `timeout` for the child to exit and returns its raw wait status (use
  // WIFEXITED / WEXITSTATUS). DEADLINE_EXCEEDED if it is still running.
  absl::StatusOr<int> WaitForExit(absl::Duration timeout);

  // True while the child has not exited (reaps it if it has).
  bool Running();

  // The last `lines` lines of the child's log.
  std::string LogTail(int lines = 30) const;

 private:
  ChildProcess(ChildProcessOptions options, pid_t pid);

  const ChildProcessOptions options_;
  const pid_t pid_;
  bool exited_ = false;
  int wait_status_ = 0;
};

// A human-readable form of a wait status: "exit 0", "killed by signal 9".
std::string DescribeWaitStatus(int wait_status);

// What a shell command run to completion did.
struct ShellResult {
  int exit_code = -1;  // -1: did not exit normally
  std::string output;  // its stdout and stderr, together
};

// Runs `command` under /bin/sh to completion (at most `timeout`), its output going to
// `log_path`. CHECK-fails when it cannot be started or does not end in time: in a test, that is
// the failure to report.
ShellResult RunShellCommand(const std::string& command, const std::string& log_path,
                            absl::Duration timeout = absl::Seconds(60));

}  // namespace pscluster

#endif  // PSCLUSTER_TESTING_CHILD_PROCESS_H_
