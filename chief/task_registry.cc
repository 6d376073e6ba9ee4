#include "chief/task_registry.h"

#include <map>

#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "glog/logging.h"

namespace pscluster {

TaskRegistry::TaskRegistry(const v1::ClusterSpec& spec, absl::Duration heartbeat_timeout,
                           const Clock* clock)
    : heartbeat_timeout_(heartbeat_timeout), clock_(clock) {
  absl::MutexLock lock(&mu_);
  for (const v1::JobDef& job : spec.jobs()) {
    std::map<int, std::string> ordered(job.tasks().begin(), job.tasks().end());
    for (const auto& [index, address] : ordered) {
      Entry e;
      e.task = MakeTaskId(job.name(), index);
      e.spec_address = address;
      e.address = address;
      index_[Key(e.task)] = entries_.size();
      entries_.push_back(std::move(e));
    }
  }
}

std::string TaskRegistry::Key(const v1::TaskId& task) { return TaskName(task); }

absl::Status TaskRegistry::Register(const v1::TaskId& task, const std::string& address,
                                    uint64_t incarnation) {
  absl::StatusOr<HostPort> given = ParseHostPort(address);
  if (!given.ok()) return given.status();
  absl::MutexLock lock(&mu_);
  auto it = index_.find(Key(task));
  if (it == index_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", TaskName(task), " is not in the cluster spec"));
  }
  Entry& e = entries_[it->second];
  absl::StatusOr<HostPort> expected = ParseHostPort(e.spec_address);
  if (expected.ok() && expected->port != 0 && expected->port != given->port) {
    return absl::InvalidArgumentError(absl::StrCat("task ", TaskName(task), " registered as ",
                                                   address, " but the cluster spec says ",
                                                   e.spec_address));
  }
  if (e.registered && e.incarnation != incarnation) {
    LOG(WARNING) << TaskName(task) << " restarted (new incarnation) at " << address;
  } else if (!e.registered) {
    LOG(INFO) << TaskName(task) << " registered at " << address;
  }
  e.address = address;
  e.incarnation = incarnation;
  e.registered = true;
  e.registered_at = clock_->Now();
  e.last_heartbeat = e.registered_at;
  return absl::OkStatus();
}

absl::StatusOr<bool> TaskRegistry::Heartbeat(const v1::TaskId& task, uint64_t incarnation,
                                             int64_t step, const std::string& detail) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(Key(task));
  if (it == index_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("task ", TaskName(task), " is not in the cluster spec"));
  }
  Entry& e = entries_[it->second];
  if (!e.registered || e.incarnation != incarnation) return false;
  const absl::Time now = clock_->Now();
  if (HealthLocked(e, now) == v1::HEALTH_MISSING) {
    LOG(INFO) << TaskName(task) << " is back after " << absl::FormatDuration(now - e.last_heartbeat)
              << " without a heartbeat";
  }
  e.last_heartbeat = now;
  e.step = step;
  e.detail = detail;
  return true;
}

v1::TaskHealth TaskRegistry::HealthLocked(const Entry& e, absl::Time now) const {
  if (!e.registered) return v1::HEALTH_UNKNOWN;
  return now - e.last_heartbeat <= heartbeat_timeout_ ? v1::HEALTH_SERVING : v1::HEALTH_MISSING;
}

std::vector<v1::TaskStatus> TaskRegistry::Snapshot() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<v1::TaskStatus> out;
  for (const Entry& e : entries_) {
    v1::TaskStatus s;
    *s.mutable_task() = e.task;
    s.set_address(e.address);
    s.set_health(HealthLocked(e, now));
    s.set_incarnation(e.incarnation);
    s.set_step(e.step);
    s.set_detail(e.detail);
    if (e.registered) {
      s.set_start_unix_micros(absl::ToUnixMicros(e.registered_at));
      s.set_uptime_micros(absl::ToInt64Microseconds(now - e.registered_at));
      s.set_last_heartbeat_unix_micros(absl::ToUnixMicros(e.last_heartbeat));
    }
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<v1::TaskId> TaskRegistry::NotServing(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  std::vector<v1::TaskId> out;
  for (const Entry& e : entries_) {
    if (!job.empty() && e.task.job() != job) continue;
    if (HealthLocked(e, now) != v1::HEALTH_SERVING) out.push_back(e.task);
  }
  return out;
}

bool TaskRegistry::AllServingLocked(const std::vector<std::string>& jobs) const {
  const absl::Time now = clock_->Now();
  for (const Entry& e : entries_) {
    bool wanted = jobs.empty();
    for (const std::string& j : jobs) wanted |= (e.task.job() == j);
    if (wanted && HealthLocked(e, now) != v1::HEALTH_SERVING) return false;
  }
  return true;
}

bool TaskRegistry::AwaitServing(const std::vector<std::string>& jobs, absl::Time deadline) const {
  absl::MutexLock lock(&mu_);
  auto all_serving = [this, &jobs]()
                         ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return AllServingLocked(jobs); };
  return clock_->AwaitWithDeadline(&mu_, absl::Condition(&all_serving), deadline);
}

uint64_t TaskRegistry::IncarnationOf(const v1::TaskId& task) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(Key(task));
  return it == index_.end() ? 0 : entries_[it->second].incarnation;
}

absl::Time TaskRegistry::LastHeardOf(const v1::TaskId& task) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(Key(task));
  if (it == index_.end() || !entries_[it->second].registered) return absl::InfinitePast();
  const Entry& e = entries_[it->second];
  return std::max(e.registered_at, e.last_heartbeat);
}

absl::StatusOr<std::string> TaskRegistry::AddressOf(const v1::TaskId& task) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(Key(task));
  if (it == index_.end()) {
    return absl::NotFoundError(absl::StrCat("task ", TaskName(task), " is not in the cluster"));
  }
  return entries_[it->second].address;
}

}  // namespace pscluster
