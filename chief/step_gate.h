#ifndef PSCLUSTER_CHIEF_STEP_GATE_H_
#define PSCLUSTER_CHIEF_STEP_GATE_H_

#include <set>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace pscluster {

// ASYNC training's step boundary: every worker passes the gate (asks the chief for a token)
// before each step, which also says its previous step (pull, compute, push to every ps task)
// is over. The chief closes the gate to take a checkpoint or restore the ps tasks: no step
// starts, and once every worker that was inside a step has come back to the gate, no push is
// in flight anywhere, so the ps tasks' shards form one consistent cut.
//
// Lifecycle: open -> Close() (waits for the steps under way) -> Open() -> ...
// Thread-safe. Waits use the injected clock's deadline.
class StepGate {
 public:
  explicit StepGate(const Clock* clock) : clock_(clock) {}

  enum class Result {
    kPassed,    // the worker is let into a step
    kTimedOut,  // the gate stayed closed until the deadline
    kDrain,     // the gate is closed and the worker still pushes: it finishes, then asks again
  };
  // Worker `worker` wants to start a step. With pushes_in_flight == 0 its earlier steps are
  // over (pull, compute and push to every ps task): it leaves, then waits while the gate is
  // closed. A pipelined worker asks while its last step's pushes are still in flight
  // (pushes_in_flight > 0): it stays inside; let in at once when the gate is open, told to
  // drain when it is closed.
  Result Pass(int worker, absl::Time deadline, int pushes_in_flight = 0);
  // The worker runs no more steps (it finished, or it is gone and will start over).
  void Leave(int worker);

  // Closes the gate and waits until no worker is inside a step, or the deadline passes.
  // Returns true at a boundary. The gate stays closed either way until Open().
  bool Close(absl::Time deadline);
  void Open();

  // Workers inside a step (let in and not come back yet).
  std::set<int> inside() const;
  bool closed() const;

 private:
  const Clock* const clock_;  // Not owned.
  mutable absl::Mutex mu_;
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<int> inside_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_STEP_GATE_H_
