#include "client/ps_follower.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace pscluster {

PsFollower::PsFollower(ChiefClient* chief, std::vector<std::string> addresses, std::string who,
                       absl::Duration min_interval)
    : chief_(chief),
      who_(std::move(who)),
      min_interval_(min_interval),
      addresses_(std::move(addresses)) {}

void PsFollower::Attach(ParameterClient* client) {
  absl::MutexLock lock(&mu_);
  client_ = client;
}

void PsFollower::Follow() {
  absl::MutexLock lock(&mu_);
  if (client_ == nullptr || absl::Now() - last_lookup_ < min_interval_) return;
  last_lookup_ = absl::Now();
  v1::GetModelResponse now;
  if (!chief_->GetModel(&now).ok()) return;
  for (int ps = 0; ps < now.ps_addresses_size() && ps < static_cast<int>(addresses_.size()); ++ps) {
    if (now.ps_addresses(ps) == addresses_[ps]) continue;
    LOG(WARNING) << who_ << ": ps:" << ps << " moved from " << addresses_[ps] << " to "
                 << now.ps_addresses(ps);
    if (client_->SetPsAddress(ps, now.ps_addresses(ps)).ok()) {
      addresses_[ps] = now.ps_addresses(ps);
    }
  }
  // A dead ps task's partitions served by their backups since the chief failed it over.
  const std::vector<int> failed_over(now.placement().failed_over_ps().begin(),
                                     now.placement().failed_over_ps().end());
  if (failed_over != client_->failed_over()) {
    absl::Status s = client_->SetFailedOver(failed_over);
    LOG(WARNING) << who_
                 << ": ps tasks failed over to their backups: " << absl::StrJoin(failed_over, ", ")
                 << (s.ok() ? "" : absl::StrCat(" (not followed: ", s.message(), ")"));
  }
}

void PsFollower::FollowFailovers(const std::vector<int>& failed_over_ps) {
  std::vector<int> heard = failed_over_ps;
  std::sort(heard.begin(), heard.end());
  heard.erase(std::unique(heard.begin(), heard.end()), heard.end());
  {
    absl::MutexLock lock(&mu_);
    if (client_ == nullptr) return;
    std::vector<int> routed = client_->failed_over();
    std::sort(routed.begin(), routed.end());
    if (routed == heard) return;
  }
  Follow();
}

void FailoverWatch::Set(PsFollower* follower) {
  absl::MutexLock lock(&mu_);
  follower_ = follower;
}

void FailoverWatch::Heard(const std::vector<int>& failed_over_ps) {
  absl::MutexLock lock(&mu_);
  if (follower_ != nullptr) follower_->FollowFailovers(failed_over_ps);
}

}  // namespace pscluster
