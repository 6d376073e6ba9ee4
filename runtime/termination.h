#ifndef PSCLUSTER_RUNTIME_TERMINATION_H_
#define PSCLUSTER_RUNTIME_TERMINATION_H_

#include <functional>
#include <thread>

namespace pscluster {

// Blocks SIGTERM and SIGINT in the calling thread, and so in every thread it creates later.
// Call it first in main(), before any thread exists, so that only the watcher receives them.
void BlockTerminationSignals();

// Calls `on_signal(signo)` on its own thread when SIGTERM or SIGINT arrives, once per signal.
// REQUIRES: BlockTerminationSignals() was called before any other thread was created.
// Thread-compatible; the destructor stops the watcher thread.
class TerminationSignalWatcher {
 public:
  explicit TerminationSignalWatcher(std::function<void(int)> on_signal);
  ~TerminationSignalWatcher();
  TerminationSignalWatcher(const TerminationSignalWatcher&) = delete;
  TerminationSignalWatcher& operator=(const TerminationSignalWatcher&) = delete;

 private:
  std::function<void(int)> on_signal_;
  std::thread thread_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_RUNTIME_TERMINATION_H_
