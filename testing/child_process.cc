#include "testing/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <iterator>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

extern char** environ;

namespace pscluster {

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(
    const ChildProcessOptions& options) {
  // Everything the child needs is built before fork(): between fork and exec only
  // async-signal-safe calls are allowed in a multi-threaded parent.
  std::vector<std::string> argv_storage = {options.binary};
  argv_storage.insert(argv_storage.end(), options.args.begin(), options.args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_storage) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::map<std::string, std::string> env_map;
  for (char** e = environ; *e != nullptr; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (eq != nullptr) env_map[std::string(*e, eq - *e)] = eq + 1;
  }
  for (const auto& [k, v] : options.env) env_map[k] = v;
  std::vector<std::string> env_storage;
  for (const auto& [k, v] : env_map) env_storage.push_back(absl::StrCat(k, "=", v));
  std::vector<char*> envp;
  for (std::string& e : env_storage) envp.push_back(e.data());
  envp.push_back(nullptr);

  const int log_fd = open(options.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot open log file ", options.log_path, ": ", strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(log_fd);
    return absl::InternalError(absl::StrCat("fork failed: ", strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);  // the parent died before prctl
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(log_fd);
  return std::unique_ptr<ChildProcess>(new ChildProcess(options, pid));
}

ChildProcess::ChildProcess(ChildProcessOptions options, pid_t pid)
    : options_(std::move(options)), pid_(pid) {}

ChildProcess::~ChildProcess() {
  if (Running()) {
    kill(pid_, SIGKILL);
    waitpid(pid_, &wait_status_, 0);
  }
}

absl::Status ChildProcess::Signal(int signo) {
  if (!Running()) {
    return absl::FailedPreconditionError(
        absl::StrCat(options_.binary, " (pid ", pid_,
                     ") has already exited: ", DescribeWaitStatus(wait_status_)));
  }
  if (kill(pid_, signo) != 0) {
    return absl::InternalError(absl::StrCat("kill(", pid_, ", ", signo, "): ", strerror(errno)));
  }
  return absl::OkStatus();
}

bool ChildProcess::Running() {
  if (exited_) return false;
  int status = 0;
  const pid_t r = waitpid(pid_, &status, WNOHANG);
  if (r == pid_) {
    exited_ = true;
    wait_status_ = status;
    return false;
  }
  return true;
}

absl::StatusOr<int> ChildProcess::WaitForExit(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (Running()) {
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(options_.binary, " (pid ", pid_,
                                                      ") still running after ",
                                                      absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return wait_status_;
}

std::string ChildProcess::LogTail(int lines) const {
  std::ifstream in(options_.log_path);
  std::deque<std::string> tail;
  std::string line;
  while (std::getline(in, line)) {
    tail.push_back(line);
    if (static_cast<int>(tail.size()) > lines) tail.pop_front();
  }
  return absl::StrJoin(tail, "\n");
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exit ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("killed by signal ", WTERMSIG(wait_status), " (",
                        strsignal(WTERMSIG(wait_status)), ")");
  }
  return absl::StrCat("wait status ", wait_status);
}

ShellResult RunShellCommand(const std::string& command, const std::string& log_path,
                            absl::Duration timeout) {
  ChildProcessOptions options;
  options.binary = "/bin/sh";
  options.args = {"-c", command};
  options.log_path = log_path;
  absl::StatusOr<std::unique_ptr<ChildProcess>> child = ChildProcess::Spawn(options);
  CHECK(child.ok()) << child.status();
  absl::StatusOr<int> status = (*child)->WaitForExit(timeout);
  CHECK(status.ok()) << command << ": " << status.status();
  ShellResult r;
  if (WIFEXITED(*status)) r.exit_code = WEXITSTATUS(*status);
  std::ifstream in(log_path, std::ios::binary);
  r.output.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  return r;
}

}  // namespace pscluster
