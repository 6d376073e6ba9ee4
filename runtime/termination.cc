#include "runtime/termination.h"

#include <pthread.h>
#include <signal.h>

#include "glog/logging.h"

namespace pscluster {
namespace {

// SIGUSR2 is only used to wake the watcher when it is destroyed.
sigset_t WatchedSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGUSR2);
  return set;
}

}  // namespace

void BlockTerminationSignals() {
  sigset_t set = WatchedSignals();
  CHECK_EQ(pthread_sigmask(SIG_BLOCK, &set, nullptr), 0);
}

TerminationSignalWatcher::TerminationSignalWatcher(std::function<void(int)> on_signal)
    : on_signal_(std::move(on_signal)) {
  thread_ = std::thread([this] {
    sigset_t set = WatchedSignals();
    while (true) {
      int signo = 0;
      if (sigwait(&set, &signo) != 0) continue;
      if (signo == SIGUSR2) return;
      LOG(INFO) << "received " << strsignal(signo);
      on_signal_(signo);
    }
  });
}

TerminationSignalWatcher::~TerminationSignalWatcher() {
  pthread_kill(thread_.native_handle(), SIGUSR2);
  thread_.join();
}

}  // namespace pscluster
