#include "ps_server/push_ledger.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "ps_server/push_forwarder.h"

namespace pscluster {

PushLedger::PushLedger(int ids_per_client, int max_clients)
    : ids_per_client_(std::max(1, ids_per_client)), max_clients_(std::max(1, max_clients)) {}

PushLedger::Claim PushLedger::Begin(const v1::RequestId& id, PushOutcome* outcome,
                                    std::shared_ptr<const ForwardList>* unreplicated,
                                    uint64_t* applied_stripes) {
  if (unreplicated != nullptr) unreplicated->reset();
  if (applied_stripes != nullptr) *applied_stripes = 0;
  if (id.client() == 0) return Claim::kNew;
  absl::MutexLock lock(&mu_);
  while (true) {
    auto cit = clients_.find(id.client());
    if (cit == clients_.end()) {
      Client& c = clients_[id.client()];
      c.last_seen = ++clock_;
      c.ids[id.seq()].done = false;
      EvictLocked();
      return Claim::kNew;
    }
    Client& c = cit->second;
    c.last_seen = ++clock_;
    auto it = c.ids.find(id.seq());
    if (it == c.ids.end()) {
      if (id.seq() < c.floor) return Claim::kTooOld;
      c.ids[id.seq()].done = false;
      TrimLocked(&c);
      return Claim::kNew;
    }
    if (it->second.done) {
      *outcome = it->second.outcome;
      if (unreplicated != nullptr) *unreplicated = it->second.unreplicated;
      return Claim::kDuplicate;
    }
    if (!it->second.claimed) {
      // Partly applied by an attempt released since: this one does the rest.
      it->second.claimed = true;
      if (applied_stripes != nullptr) *applied_stripes = it->second.applied_stripes;
      return Claim::kNew;
    }
    // The first attempt is being applied: wait for its outcome (or its release).
    const uint64_t client = id.client(), seq = id.seq();
    auto settled = [this, client, seq]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      auto c = clients_.find(client);
      if (c == clients_.end()) return true;
      auto e = c->second.ids.find(seq);
      return e == c->second.ids.end() || e->second.done || !e->second.claimed;
    };
    mu_.Await(absl::Condition(&settled));
  }
}

void PushLedger::Record(const v1::RequestId& id, const PushOutcome& outcome,
                        std::shared_ptr<const ForwardList> unreplicated, int64_t applied_as) {
  if (id.client() == 0) return;
  absl::MutexLock lock(&mu_);
  auto cit = clients_.find(id.client());
  if (cit == clients_.end()) return;
  auto it = cit->second.ids.find(id.seq());
  if (it == cit->second.ids.end()) return;
  it->second.done = true;
  it->second.claimed = true;
  it->second.outcome = outcome;
  it->second.unreplicated = std::move(unreplicated);
  it->second.applied_as = applied_as;
}

void PushLedger::MarkReplicated(const v1::RequestId& id) {
  if (id.client() == 0) return;
  absl::MutexLock lock(&mu_);
  auto cit = clients_.find(id.client());
  if (cit == clients_.end()) return;
  auto it = cit->second.ids.find(id.seq());
  if (it != cit->second.ids.end()) it->second.unreplicated.reset();
}

void PushLedger::Release(const v1::RequestId& id, uint64_t applied_stripes) {
  if (id.client() == 0) return;
  absl::MutexLock lock(&mu_);
  auto cit = clients_.find(id.client());
  if (cit == clients_.end()) return;
  auto it = cit->second.ids.find(id.seq());
  if (it == cit->second.ids.end() || it->second.done) return;
  it->second.applied_stripes |= applied_stripes;
  if (it->second.applied_stripes == 0) {
    cit->second.ids.erase(it);
  } else {
    it->second.claimed = false;
  }
}

void PushLedger::ExportDone(google::protobuf::RepeatedPtrField<v1::LedgerEntry>* out,
                            google::protobuf::RepeatedPtrField<v1::RequestId>* floors,
                            int64_t applied_below) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [client, c] : clients_) {
    if (c.floor > 0) {
      v1::RequestId* floor = floors->Add();
      floor->set_client(client);
      floor->set_seq(c.floor);
    }
    for (const auto& [seq, e] : c.ids) {
      if (!e.done || e.applied_as >= applied_below) continue;
      v1::LedgerEntry* entry = out->Add();
      entry->mutable_id()->set_client(client);
      entry->mutable_id()->set_seq(seq);
      entry->set_accepted(e.outcome.accepted);
      entry->set_dropped_stale(e.outcome.dropped_stale);
    }
  }
}

void PushLedger::ImportDone(const google::protobuf::RepeatedPtrField<v1::LedgerEntry>& entries,
                            const google::protobuf::RepeatedPtrField<v1::RequestId>& floors,
                            bool over_partial) {
  absl::MutexLock lock(&mu_);
  for (const v1::RequestId& floor : floors) {
    if (floor.client() == 0) continue;
    Client& c = clients_[floor.client()];
    c.last_seen = ++clock_;
    if (floor.seq() <= c.floor) continue;
    c.floor = floor.seq();
    // (An id below it being applied here stays until it is done. One the original was still
    // applying is below the floor it sent: its forward is then too old here and not recorded,
    // so a retry after a promotion is refused, not applied twice.)
    for (auto it = c.ids.begin(); it != c.ids.end() && it->first < c.floor;) {
      it = it->second.done ? c.ids.erase(it) : std::next(it);
    }
  }
  for (const v1::LedgerEntry& entry : entries) {
    if (entry.id().client() == 0) continue;
    Client& c = clients_[entry.id().client()];
    c.last_seen = ++clock_;
    if (entry.id().seq() < c.floor) continue;
    auto known = c.ids.find(entry.id().seq());
    if (known != c.ids.end() && (!over_partial || known->second.done || known->second.claimed)) {
      continue;
    }
    Entry& e = c.ids[entry.id().seq()];
    e.applied_stripes = 0;
    e.done = true;
    e.outcome.accepted = entry.accepted();
    e.outcome.dropped_stale = entry.dropped_stale();
    TrimLocked(&c);
  }
  EvictLocked();
}

void PushLedger::TrimLocked(Client* c) {
  while (static_cast<int>(c->ids.size()) > ids_per_client_) {
    // Forget the oldest id nobody is applying (done, or partly applied: its retry is then
    // refused as too old rather than applied again); one still being applied stays.
    auto oldest = c->ids.begin();
    while (oldest != c->ids.end() && !oldest->second.done && oldest->second.claimed) ++oldest;
    if (oldest == c->ids.end()) return;
    c->floor = std::max(c->floor, oldest->first + 1);
    c->ids.erase(oldest);
  }
}

void PushLedger::EvictLocked() {
  while (static_cast<int>(clients_.size()) > max_clients_) {
    auto oldest = clients_.end();
    for (auto it = clients_.begin(); it != clients_.end(); ++it) {
      bool busy = false;
      // (A client with a partly applied id stays too: forgotten, its retry would be new.)
      for (const auto& [seq, e] : it->second.ids) busy |= !e.done;
      if (busy) continue;
      if (oldest == clients_.end() || it->second.last_seen < oldest->second.last_seen) oldest = it;
    }
    if (oldest == clients_.end()) return;
    clients_.erase(oldest);
  }
}

int64_t PushLedger::size() const {
  absl::MutexLock lock(&mu_);
  int64_t n = 0;
  for (const auto& [client, c] : clients_) n += static_cast<int64_t>(c.ids.size());
  return n;
}

}  // namespace pscluster
