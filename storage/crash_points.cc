#include "storage/crash_points.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "glog/logging.h"

namespace pscluster {
namespace {

constexpr const char* kKnownPoints[] = {
    kCrashSaveOpened,
    kCrashSaveMidway,
    kCrashSaveBeforeSync,
    kCrashSaveDone,
    kCrashManifestBeforeWrite,
    kCrashManifestBeforeRename,
    kCrashManifestBeforeDirSync,
    kCrashRecoveryIntentWritten,
    kCrashRecoveryCreated,
    kCrashRecoveryRestoreMidway,
    kCrashRecoveryRestored,
    kCrashPsCreateShards,
    kCrashTrainingEnded,
    kCrashFinalCheckpointDone,
    kCrashFailoverMidway,
    kCrashPushApplied,
};

}  // namespace

absl::StatusOr<std::unique_ptr<CrashPoints>> CrashPoints::Parse(absl::string_view spec) {
  if (spec.empty()) return std::unique_ptr<CrashPoints>();
  const bool stop = absl::ConsumeSuffix(&spec, ":stop");
  absl::string_view point = spec;
  int64_t nth = 1;
  if (const size_t at = spec.find('@'); at != absl::string_view::npos) {
    point = spec.substr(0, at);
    if (!absl::SimpleAtoi(spec.substr(at + 1), &nth) || nth < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "crash point \"", spec, "\": the count after @ must be a whole number >= 1"));
    }
  }
  for (const char* known : kKnownPoints) {
    if (point == known) {
      return std::unique_ptr<CrashPoints>(new CrashPoints(std::string(point), nth, nullptr, stop));
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown crash point \"", point, "\"; expected one of ",
                   absl::StrJoin(kKnownPoints, ", "), " (optionally @<n>)"));
}

std::unique_ptr<CrashPoints> CrashPoints::ForTest(absl::string_view point, int64_t nth,
                                                  std::function<void()> reached) {
  bool known = false;
  for (const char* k : kKnownPoints) known = known || point == k;
  CHECK(known) << "unknown crash point " << point;
  return std::unique_ptr<CrashPoints>(new CrashPoints(std::string(point), nth, std::move(reached)));
}

void CrashPoints::Reach(absl::string_view point) {
  if (point != point_) return;
  if (visits_.fetch_add(1) + 1 != nth_) return;
  if (reached_) {
    reached_();
    return;
  }
  // Said on stderr with write(2) so the line is out before the signal lands.
  const std::string line = absl::StrCat("crash point ", point_, "@", nth_,
                                        " reached: ", stop_ ? "SIGSTOP" : "SIGKILL", "\n");
  ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
  if (stop_) {
    kill(getpid(), SIGSTOP);  // (goes on from here if sent SIGCONT)
    return;
  }
  kill(getpid(), SIGKILL);
  pause();
}

}  // namespace pscluster
