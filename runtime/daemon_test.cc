#include "runtime/daemon.h"

#include <signal.h>
#include <sys/wait.h>

#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/child_process.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Exit {
  int wait_status = -1;
  absl::Duration after_sigterm;
  std::string log;
};

// Runs teardown_test_daemon with a destructor that hangs `hang_secs` under a teardown limit of
// `limit_secs`, SIGTERMs it once it serves, and reports how it exited.
Exit RunAndStop(double hang_secs, double limit_secs, int exit_code, const std::string& name) {
  ChildProcessOptions options;
  options.binary = absl::StrCat(std::getenv("TEST_SRCDIR"), "/", std::getenv("TEST_WORKSPACE"),
                                "/runtime/teardown_test_daemon");
  options.args = {absl::StrCat(hang_secs), absl::StrCat(limit_secs), absl::StrCat(exit_code)};
  options.log_path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, ".log");
  auto child = ChildProcess::Spawn(options);
  EXPECT_TRUE(child.ok()) << child.status();
  if (!child.ok()) return {};
  for (int i = 0; i < 500 && (*child)->LogTail().find("serving") == std::string::npos; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_THAT((*child)->LogTail(), HasSubstr("serving"));
  const absl::Time signalled = absl::Now();
  EXPECT_TRUE((*child)->Signal(SIGTERM).ok());
  Exit exit;
  auto status = (*child)->WaitForExit(absl::Seconds(30));
  EXPECT_TRUE(status.ok()) << status.status() << "\n" << (*child)->LogTail();
  exit.after_sigterm = absl::Now() - signalled;
  if (status.ok()) exit.wait_status = *status;
  exit.log = (*child)->LogTail();
  return exit;
}

// A daemon whose destruction hangs (as gRPC's teardown can, waiting on a connection to a chief
// that is gone) still ends its process once the teardown limit has passed, with its own exit
// code and a line saying why, not at Kubernetes' grace period.
TEST(DaemonTest, AProcessWhoseTeardownHangsEndsAtTheLimitWithTheDaemonsExitCode) {
  for (const int code : {0, kExitChiefGone}) {
    SCOPED_TRACE(absl::StrCat("exit code ", code));
    const Exit exit =
        RunAndStop(/*hang_secs=*/60, /*limit_secs=*/1, code, absl::StrCat("hangs_", code));
    EXPECT_EQ(DescribeWaitStatus(exit.wait_status), absl::StrCat("exit ", code)) << exit.log;
    EXPECT_GE(exit.after_sigterm, absl::Seconds(1)) << exit.log;
    EXPECT_LT(exit.after_sigterm, absl::Seconds(10)) << exit.log;
    EXPECT_THAT(exit.log, HasSubstr("destroying: hanging for 1m"));
    EXPECT_THAT(exit.log, Not(HasSubstr("destroyed")));
    EXPECT_THAT(exit.log,
                HasSubstr(absl::StrCat("teardown_test_daemon: tearing down took more than 1s "
                                       "after the daemon stopped (threads still waiting on "
                                       "connections?); exiting now with code ",
                                       code)));
  }
}

// A teardown within the limit runs to its end: the limit cuts nothing short that finishes.
TEST(DaemonTest, ATeardownWithinTheLimitFinishes) {
  const Exit exit = RunAndStop(/*hang_secs=*/0.5, /*limit_secs=*/5, 0, "within");
  EXPECT_EQ(DescribeWaitStatus(exit.wait_status), "exit 0") << exit.log;
  EXPECT_THAT(exit.log, HasSubstr("destroyed"));
  EXPECT_THAT(exit.log, Not(HasSubstr("tearing down took more than")));
  EXPECT_LT(exit.after_sigterm, absl::Seconds(5)) << exit.log;
}

}  // namespace
}  // namespace pscluster
