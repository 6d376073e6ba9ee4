#include "ps_server/backup_stores.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace pscluster {

BackupStores::BackupStores(const ParameterStoreOptions& options) : options_(options) {
  options_.crash_points = nullptr;
  options_.forwarder = nullptr;  // a backup forwards nothing (no chains longer than two)
}

absl::Status BackupStores::Check(int self, const v1::CreateShardsRequest& request) {
  std::set<int> seen;
  for (int i = 0; i < request.backups_size(); ++i) {
    const int primary = request.backups(i).primary_ps_task();
    if (primary < 0) {
      return absl::InvalidArgumentError(absl::StrCat("backups[", i, "].primary_ps_task is ",
                                                     primary, "; expected a ps task index >= 0"));
    }
    if (primary == self) {
      return absl::InvalidArgumentError(
          absl::StrCat("backups[", i, "] names ps:", primary,
                       ", the task it was sent to; a task never backs up its own shards"));
    }
    if (!seen.insert(primary).second) {
      return absl::InvalidArgumentError(absl::StrCat("backups[", i, "] names ps:", primary,
                                                     " again; send one entry per primary task"));
    }
  }
  return absl::OkStatus();
}

absl::Status BackupStores::Create(int self, const v1::CreateShardsRequest& request,
                                  v1::CreateShardsResponse* response) {
  PS_RETURN_IF_ERROR(Check(self, request));
  for (const v1::BackupShards& backup : request.backups()) {
    ParameterStore* store = nullptr;
    {
      absl::MutexLock lock(&mu_);
      const int primary = backup.primary_ps_task();
      std::unique_ptr<ParameterStore>& slot = stores_[primary];
      if (slot == nullptr) {
        slot = std::make_unique<ParameterStore>(options_);
        if (own_ != nullptr) {
          ParameterStore* const own = own_;
          slot->SetBytesElsewhere(
              [this, own, primary] { return own->held_bytes() + HeldBytes(primary); });
        }
        if (promoted_.count(primary) > 0) PublishServingLocked();
      }
      store = slot.get();
    }
    v1::CreateShardsRequest one;
    *one.mutable_dense() = backup.dense();
    *one.mutable_tables() = backup.tables();
    *one.mutable_sync() = request.sync();
    one.set_start_step(request.start_step());
    one.set_chief_epoch(request.chief_epoch());
    v1::CreateShardsResponse created;
    absl::Status s = store->CreateShards(one, &created);
    if (!s.ok()) {
      return absl::Status(s.code(), absl::StrCat("the backup of ps:", backup.primary_ps_task(),
                                                 "'s shards: ", s.message()));
    }
    response->set_backups_created(response->backups_created() + created.created());
    response->set_backups_already_present(response->backups_already_present() +
                                          created.already_present());
  }
  return absl::OkStatus();
}

void BackupStores::AppendShards(v1::ListShardsResponse* response) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [primary, store] : stores_) {
    v1::ListShardsResponse listed = store->ListShards();
    const bool promoted = promoted_.count(primary) > 0;
    for (v1::ShardStats& s : *listed.mutable_shards()) {
      s.set_backup(true);
      s.set_primary_ps_task(primary);
      s.set_promoted(promoted);
      *response->add_shards() = std::move(s);
    }
  }
}

absl::StatusOr<v1::InspectShardResponse> BackupStores::Inspect(
    const v1::InspectShardRequest& request) {
  ParameterStore* store = Find(request.primary_ps_task());
  if (store == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "this ps task holds no backup of ps:", request.primary_ps_task(), "'s shards"));
  }
  PS_ASSIGN_OR_RETURN(v1::InspectShardResponse out, store->Inspect(request));
  out.mutable_shard()->set_backup(true);
  out.mutable_shard()->set_primary_ps_task(request.primary_ps_task());
  return out;
}

void BackupStores::Promote(int primary, int* dense_shards, bool* already) {
  absl::MutexLock lock(&mu_);
  *already = !promoted_.insert(primary).second;
  *dense_shards = 0;
  auto it = stores_.find(primary);
  if (it == stores_.end()) return;
  const v1::ListShardsResponse listed = it->second->ListShards();
  for (const v1::ShardStats& s : listed.shards()) {
    if (!s.is_table()) ++*dense_shards;
  }
  PublishServingLocked();
}

int BackupStores::DenseShardsOf(int primary) const {
  absl::MutexLock lock(&mu_);
  auto it = stores_.find(primary);
  if (it == stores_.end()) return 0;
  const v1::ListShardsResponse listed = it->second->ListShards();
  int n = 0;
  for (const v1::ShardStats& s : listed.shards()) n += !s.is_table();
  return n;
}

void BackupStores::PublishServingLocked() {
  auto serving = std::make_unique<std::vector<ParameterStore*>>();
  for (int primary : promoted_) {
    auto it = stores_.find(primary);
    if (it != stores_.end()) serving->push_back(it->second.get());
  }
  if (serving->empty()) return;
  serving_.store(serving.get(), std::memory_order_release);
  published_.push_back(std::move(serving));
  any_promoted_.store(true, std::memory_order_release);
}

absl::StatusOr<ParameterStore*> BackupStores::ForForward(int primary) const {
  absl::MutexLock lock(&mu_);
  auto it = stores_.find(primary);
  if (promoted_.count(primary) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("this ps task took over ps:", primary,
                     "'s shards when the chief failed it over: its forwards are refused"));
  }
  if (it == stores_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("this ps task holds no backup of ps:", primary, "'s shards"));
  }
  return it->second.get();
}

ParameterStore* BackupStores::ServingDense(const v1::ShardRef& ref) const {
  if (!any_promoted_.load(std::memory_order_acquire)) return nullptr;
  const std::vector<ParameterStore*>* serving = serving_.load(std::memory_order_acquire);
  if (serving == nullptr) return nullptr;
  for (ParameterStore* store : *serving) {
    if (store->HoldsDense(ref)) return store;
  }
  return nullptr;
}

ParameterStore* BackupStores::ServingSparse(const std::string& table, int64_t key) const {
  if (!any_promoted_.load(std::memory_order_acquire)) return nullptr;
  const std::vector<ParameterStore*>* serving = serving_.load(std::memory_order_acquire);
  if (serving == nullptr) return nullptr;
  for (ParameterStore* store : *serving) {
    if (store->HoldsTableKey(table, key)) return store;
  }
  return nullptr;
}

void BackupStores::RenewLease(absl::Time until) {
  const int64_t nanos = absl::ToUnixNanos(until);
  int64_t seen = lease_until_nanos_.load();
  while (nanos > seen && !lease_until_nanos_.compare_exchange_weak(seen, nanos)) {
  }
  if (nanos > absl::GetCurrentTimeNanos() && lapse_logged_.exchange(false)) {
    LOG(WARNING) << "the chief answers again: serving pulls and pushes"
                 << (fenced_.load() ? " of what this task backs up (its own shards stay fenced)"
                                    : "");
  }
}

void BackupStores::Fence() {
  if (!fenced_.exchange(true)) {
    LOG(WARNING) << "the chief failed this ps task over: its shards are served by their backups; "
                    "refusing pulls and pushes of its own shards from now on ("
                 << (pushes_applied_ ? pushes_applied_() : -1)
                 << " pushes applied to its own shards)";
  }
}

absl::Status BackupStores::CheckServes(const ParameterStore* store) const {
  if (store == own_ && fenced_.load(std::memory_order_relaxed)) {
    return absl::UnavailableError(
        "this ps task was failed over: its shards are served by their backups (look up the "
        "placement's failed_over_ps)");
  }
  return absl::OkStatus();
}

absl::Status BackupStores::CheckLease() const {
  if (!replicated_.load(std::memory_order_relaxed)) return absl::OkStatus();
  const int64_t until = lease_until_nanos_.load(std::memory_order_relaxed);
  const int64_t now = absl::GetCurrentTimeNanos();
  if (until != 0 && now > until) {
    if (!lapse_logged_.exchange(true)) {
      LOG(WARNING) << "the lease from the chief ran out "
                   << absl::FormatDuration(absl::Nanoseconds(now - until))
                   << " ago: refusing pulls and pushes until it answers ("
                   << (pushes_applied_ ? pushes_applied_() : -1)
                   << " pushes applied to this task's own shards)";
    }
    return absl::UnavailableError(absl::StrCat(
        "this ps task has not heard from the chief for ",
        absl::FormatDuration(absl::Nanoseconds(now - until)),
        " past its lease: it may have been failed over, so it serves no pull or push until "
        "the chief answers again"));
  }
  return absl::OkStatus();
}

absl::Status BackupStores::Restore(const v1::RestoreShardsRequest& request) {
  std::vector<std::pair<int, ParameterStore*>> stores;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [primary, store] : stores_) stores.emplace_back(primary, store.get());
  }
  // (A store lives as long as this object: restored without holding mu_.)
  for (const auto& [primary, store] : stores) {
    v1::RestoreShardsResponse restored;
    absl::Status s = store->Restore(request, &restored);
    if (!s.ok()) {
      return absl::Status(s.code(),
                          absl::StrCat("the backup of ps:", primary, "'s shards: ", s.message()));
    }
  }
  return absl::OkStatus();
}

void BackupStores::ShareBudget(ParameterStore* own) {
  own_ = own;
  own->SetBytesElsewhere([this] { return HeldBytes(); });
}

int64_t BackupStores::HeldBytes(int except_primary) const {
  std::vector<ParameterStore*> stores;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [primary, store] : stores_) {
      if (primary != except_primary) stores.push_back(store.get());
    }
  }
  int64_t held = 0;
  for (ParameterStore* store : stores) held += store->held_bytes();
  return held;
}

std::vector<AdoptedStore> BackupStores::Promoted() const {
  std::vector<AdoptedStore> out;
  if (!any_promoted_.load(std::memory_order_relaxed)) return out;
  absl::MutexLock lock(&mu_);
  for (int primary : promoted_) {
    auto it = stores_.find(primary);
    if (it != stores_.end()) out.push_back(AdoptedStore{primary, it->second.get()});
  }
  return out;
}

ParameterStore* BackupStores::Find(int primary) const {
  absl::MutexLock lock(&mu_);
  auto it = stores_.find(primary);
  return it == stores_.end() ? nullptr : it->second.get();
}

}  // namespace pscluster
