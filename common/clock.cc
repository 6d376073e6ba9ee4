#include "common/clock.h"

namespace pscluster {
namespace {

class RealClock : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
  bool AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                         absl::Time deadline) const override {
    return mu->AwaitWithDeadline(cond, deadline);
  }
};

}  // namespace

Clock* Clock::Real() {
  static Clock* const clock = new RealClock();
  return clock;
}

FakeClock::FakeClock(absl::Time start) : now_(start) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

bool FakeClock::AwaitWithDeadline(absl::Mutex* mu, const absl::Condition& cond,
                                  absl::Time deadline) const {
  // Wait on the caller's mutex in short real-time slices, re-checking the fake time between
  // them: the fake deadline is what decides, real time only bounds how long a slice lasts.
  while (true) {
    if (cond.Eval()) return true;
    if (Now() >= deadline) return false;
    mu->AwaitWithTimeout(cond, absl::Milliseconds(1));
  }
}

}  // namespace pscluster
