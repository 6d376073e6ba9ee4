#ifndef PSCLUSTER_COMMON_CLOCK_H_
#define PSCLUSTER_COMMON_CLOCK_H_

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pscluster {

// A source of time. Injected wherever logic depends on time so that tests can use a
// FakeClock instead of sleeping. Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Blocks on `mu` (held by the caller) until `cond` holds or `deadline` passes on this clock.
  // Returns true if `cond` holds. Like absl::Mutex::AwaitWithDeadline, but a FakeClock wakes
  // waiters when it is advanced.
  virtual bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                 absl::Time deadline) const = 0;

  // Blocks for `d` of this clock's time (a FakeClock: as its waits do).
  void SleepFor(absl::Duration d) const;

  // The process-wide real clock. Never null; not owned by the caller.
  static Clock* Real();
};

// A clock that moves only when told to (Advance). What a wait that cannot be satisfied does
// depends on `waits`:
//  - kJump: AwaitWithDeadline jumps the clock to the deadline and returns false at once, as if
//    every timer up to it had fired. For single-threaded tests of time-dependent logic.
//  - kBlock: AwaitWithDeadline blocks until `cond` holds (checked every millisecond of real
//    time) or Advance has moved the clock to the deadline. For tests of code with threads of
//    its own, where only the test decides when time passes.
// Thread-safe.
class FakeClock : public Clock {
 public:
  enum class Waits { kJump, kBlock };

  explicit FakeClock(absl::Time start = absl::UnixEpoch() + absl::Hours(24 * 365 * 50),
                     Waits waits = Waits::kJump);
  absl::Time Now() const override;
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                         absl::Time deadline) const override;
  void Advance(absl::Duration d);
  // Changes what waits do from now on (a test that is done switches to kJump so that every
  // thread's timed wait ends).
  void set_waits(Waits waits);

 private:
  mutable absl::Mutex mu_;
  mutable absl::Time now_ ABSL_GUARDED_BY(mu_);
  Waits waits_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_CLOCK_H_
