#ifndef PSCLUSTER_CLIENT_PS_FOLLOWER_H_
#define PSCLUSTER_CLIENT_PS_FOLLOWER_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/chief_client.h"
#include "client/parameter_client.h"

namespace pscluster {

// Keeps a worker's or the evaluator's ParameterClient pointed where the ps tasks are now, as
// the chief serves it (GetModel): the address each ps task registered with last (one restarted
// elsewhere: a new port, or a rescheduled pod's new IP) and the tasks failed over to their
// backups (Placement.failed_over_ps, replication 2: docs/replication.md). Follow() looks them
// up at most every `min_interval` and is meant for the moments a call to a ps task is retried
// (ParameterClientOptions.before_retry) or a step failed. Thread-safe.
class PsFollower {
 public:
  // `chief` must outlive the follower; `who` names the task in the log ("worker:0").
  PsFollower(ChiefClient* chief, std::vector<std::string> addresses, std::string who,
             absl::Duration min_interval = absl::Milliseconds(200));

  // The client to keep pointed; Follow() does nothing before it is set. It must outlive the
  // follower's use.
  void Attach(ParameterClient* client) ABSL_LOCKS_EXCLUDED(mu_);
  void Follow() ABSL_LOCKS_EXCLUDED(mu_);
  // Follow(), when the chief's heartbeat answer names a failed-over task (`failed_over_ps`)
  // the client does not route around yet. The client then ends its calls to that task at once
  // (ParameterClient::SetFailedOver): a task that hangs would hold them for their I/O timeout.
  void FollowFailovers(const std::vector<int>& failed_over_ps) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  ChiefClient* const chief_;
  const std::string who_;
  const absl::Duration min_interval_;
  absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  ParameterClient* client_ ABSL_GUARDED_BY(mu_) = nullptr;
  absl::Time last_lookup_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

// Where a task's heartbeat answers (its registrar's thread) meet the follower of its current
// training or evaluation attempt, which has one of its own: Heard() hands each answer's
// failed-over tasks to the follower set, if any. The attempt sets its follower once its client
// is attached, and sets null before either goes (Heard holds the lock while it follows).
// Thread-safe.
class FailoverWatch {
 public:
  void Set(PsFollower* follower) ABSL_LOCKS_EXCLUDED(mu_);
  void Heard(const std::vector<int>& failed_over_ps) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Mutex mu_;
  PsFollower* follower_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_PS_FOLLOWER_H_
