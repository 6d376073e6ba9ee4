// A daemon for daemon_test whose destruction hangs, as a daemon's can when gRPC's threads wait
// on a connection to a host that is gone:
//   teardown_test_daemon HANG_SECONDS LIMIT_SECONDS EXIT_CODE
// serves (nothing) until SIGTERM, then Wait() returns EXIT_CODE (0: OK) and the destructor
// sleeps HANG_SECONDS, under RunDaemonMain with a teardown limit of LIMIT_SECONDS.
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "runtime/daemon.h"
#include "runtime/termination.h"

namespace pscluster {
namespace {

class HangingDaemon : public Daemon {
 public:
  HangingDaemon(double hang_seconds, int exit_code)
      : hang_(absl::Seconds(hang_seconds)), exit_code_(exit_code) {}
  ~HangingDaemon() override {
    std::fprintf(stderr, "destroying: hanging for %s\n", absl::FormatDuration(hang_).c_str());
    absl::SleepFor(hang_);
    std::fprintf(stderr, "destroyed\n");
  }
  absl::Status Start() override {
    std::fprintf(stderr, "serving\n");
    return absl::OkStatus();
  }
  void Stop() override {
    if (!stopped_.HasBeenNotified()) stopped_.Notify();
  }
  absl::Status Wait() override {
    stopped_.WaitForNotification();
    if (exit_code_ == 0) return absl::OkStatus();
    return WithExitCode(absl::InternalError("told to fail"), exit_code_);
  }

 private:
  const absl::Duration hang_;
  const int exit_code_;
  absl::Notification stopped_;
};

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) {
  pscluster::BlockTerminationSignals();
  if (argc != 4) {
    std::fprintf(stderr, "usage: teardown_test_daemon HANG_SECONDS LIMIT_SECONDS EXIT_CODE\n");
    return 2;
  }
  return pscluster::RunDaemonMain(
      "teardown_test_daemon",
      std::make_unique<pscluster::HangingDaemon>(std::atof(argv[1]), std::atoi(argv[3])),
      absl::Seconds(std::atof(argv[2])));
}
