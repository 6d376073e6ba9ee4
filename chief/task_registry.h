#ifndef PSCLUSTER_CHIEF_TASK_REGISTRY_H_
#define PSCLUSTER_CHIEF_TASK_REGISTRY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/cluster.pb.h"
#include "proto/status.pb.h"

namespace pscluster {

// The chief's view of cluster membership: which tasks have registered, at which address,
// which incarnation, and whether their heartbeats are recent. Transport-free.
//
// A task is SERVING while its last heartbeat (or registration) is younger than
// `heartbeat_timeout`, MISSING after that, UNKNOWN before it first registers.
// Thread-safe.
class TaskRegistry {
 public:
  // `clock` is not owned and must outlive the registry.
  TaskRegistry(const v1::ClusterSpec& spec, absl::Duration heartbeat_timeout, const Clock* clock);

  // Records a task's (re)registration. INVALID_ARGUMENT if the task is not in the spec, or if
  // the spec fixes a port and `address` has another. A new incarnation replaces the old one
  // (the task restarted).
  absl::Status Register(const v1::TaskId& task, const std::string& address, uint64_t incarnation);

  // Records a heartbeat. Returns false if this incarnation is unknown (the chief restarted or
  // the task never registered): the task must register again.
  absl::StatusOr<bool> Heartbeat(const v1::TaskId& task, uint64_t incarnation, int64_t step,
                                 const std::string& detail);

  // Every task of the spec, in spec order (jobs by name, then index).
  std::vector<v1::TaskStatus> Snapshot() const;

  // Tasks of `job` (all jobs when empty) that are not SERVING now.
  std::vector<v1::TaskId> NotServing(const std::string& job = "") const;

  // Blocks until every task of `jobs` is SERVING or `deadline` passes. Returns true if all are.
  bool AwaitServing(const std::vector<std::string>& jobs, absl::Time deadline) const;

  // The incarnation a task registered with (0 before it has).
  uint64_t IncarnationOf(const v1::TaskId& task) const;
  // When the task last registered or sent a heartbeat (InfinitePast before it has).
  absl::Time LastHeardOf(const v1::TaskId& task) const;

  // The registered address of a task, or the spec's address if it has not registered.
  absl::StatusOr<std::string> AddressOf(const v1::TaskId& task) const;

 private:
  struct Entry {
    v1::TaskId task;
    std::string spec_address;
    std::string address;
    uint64_t incarnation = 0;
    bool registered = false;
    absl::Time registered_at;
    absl::Time last_heartbeat;
    int64_t step = 0;
    std::string detail;
  };

  static std::string Key(const v1::TaskId& task);
  v1::TaskHealth HealthLocked(const Entry& e, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool AllServingLocked(const std::vector<std::string>& jobs) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const absl::Duration heartbeat_timeout_;
  const Clock* const clock_;  // Not owned.
  mutable absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, size_t> index_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_TASK_REGISTRY_H_
