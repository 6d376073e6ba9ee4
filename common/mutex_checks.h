#ifndef PSCLUSTER_COMMON_MUTEX_CHECKS_H_
#define PSCLUSTER_COMMON_MUTEX_CHECKS_H_

namespace pscluster {

// Sets absl::Mutex's deadlock detection for a binary's process, from the environment variable
// PSCLUSTER_MUTEX_DEADLOCK_DETECTION: "abort" (a lock-order cycle kills the process with both
// stacks), "report" (logs it), anything else or unset: off.
//
// Off by default because Debian's Abseil is built with the detection on (no NDEBUG): every
// Mutex::Lock then takes one process-wide spin lock to look the mutex up in a graph
// (synchronization_internal::GraphCycles), which serializes the lock acquisitions of every
// thread of a ps task. .bazelrc turns it on ("abort") for every `bazel test`, so the daemons the
// tests start check their lock order too; unit tests keep Abseil's default (on) besides.
//
// Returns the mode set, as the variable's value ("off" when unset or unknown).
const char* SetMutexChecksFromEnvironment();

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_MUTEX_CHECKS_H_
