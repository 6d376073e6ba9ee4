#include "common/mutex_checks.h"

#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"

namespace pscluster {

const char* SetMutexChecksFromEnvironment() {
  const char* v = std::getenv("PSCLUSTER_MUTEX_DEADLOCK_DETECTION");
  if (v != nullptr && std::strcmp(v, "abort") == 0) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
    return "abort";
  }
  if (v != nullptr && std::strcmp(v, "report") == 0) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kReport);
    return "report";
  }
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return "off";
}

}  // namespace pscluster
