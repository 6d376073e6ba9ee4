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

void Clock::SleepFor(absl::Duration d) const {
  absl::Mutex mu;
  const bool never = false;
  absl::MutexLock lock(&mu);
  AwaitWithDeadline(&mu, absl::Condition(&never), Now() + d);
}

Clock* Clock::Real() {
  static Clock* const clock = new RealClock();
  return clock;
}

FakeClock::FakeClock(absl::Time start, Waits waits) : now_(start), waits_(waits) {}

void FakeClock::set_waits(Waits waits) {
  absl::MutexLock lock(&mu_);
  waits_ = waits;
}

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
  while (true) {
    Waits waits;
    absl::Time now;
    {
      absl::MutexLock lock(&mu_);
      waits = waits_;
      now = now_;
    }
    if (waits == Waits::kJump) break;
    // Not under mu_: the condition may read the clock.
    if (now >= deadline) return cond.Eval();
    // `mu` is held by the caller: waiting on it lets other threads change what `cond` reads.
    if (mu->AwaitWithTimeout(cond, absl::Milliseconds(1))) return true;
  }
  // Nothing else moves a fake clock in a single-threaded test, so a wait that cannot be
  // satisfied now lets time jump to its deadline, as if every timer before it had fired.
  if (cond.Eval()) return true;
  absl::MutexLock lock(&mu_);
  if (now_ < deadline) now_ = deadline;
  return false;
}

}  // namespace pscluster
