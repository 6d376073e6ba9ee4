#ifndef PSCLUSTER_PS_SERVER_PUSH_LEDGER_H_
#define PSCLUSTER_PS_SERVER_PUSH_LEDGER_H_

#include <cstdint>
#include <limits>
#include <map>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "proto/ps_service.pb.h"

namespace pscluster {

struct ForwardList;  // ps_server/push_forwarder.h

// What a push did, remembered so that a retry of it can be told.
struct PushOutcome {
  int32_t accepted = 0;
  int32_t dropped_stale = 0;
};

// The memory that makes pushes idempotent: for each client (RequestId.client) the outcome of
// its latest pushes by sequence number. A push claims its id before it is applied and records
// its outcome after; a retry of a recorded id gets the outcome instead of a second apply, and
// a retry that arrives while the first attempt is being applied waits for it.
//
// Bounded: at most `ids_per_client` ids per client (the lowest go first) and `max_clients`
// clients (the least recently seen go first). A retry of an id older than what is kept is
// refused (ABORTED), since whether it was applied can no longer be told.
//
// Thread-safe.
class PushLedger {
 public:
  PushLedger(int ids_per_client, int max_clients);

  enum class Claim {
    kNew,        // not seen, or only partly applied (below): apply it, then Record() or Release()
    kDuplicate,  // seen and done: *outcome is what it did
    kTooOld,     // older than every id kept for its client
  };
  // An id with client 0 is always kNew and never remembered. For kDuplicate, `*unreplicated`
  // (optional) receives the forwards to backups that the push still owes (Record), or null.
  // For kNew, `*applied_stripes` (optional) receives the table stripes an earlier attempt
  // applied before it was released (Release's mask; 0 for an id not seen): the caller applies
  // only the push's keys of the other stripes.
  Claim Begin(const v1::RequestId& id, PushOutcome* outcome,
              std::shared_ptr<const ForwardList>* unreplicated = nullptr,
              uint64_t* applied_stripes = nullptr);
  // The push claimed by Begin() was applied (or dropped as stale): remember what it did, and,
  // where its forwards to backup tasks did not all go through (issue 37), those forwards: a
  // retry of the push sends them again instead of answering at once.
  // `applied_as`: the number the push's apply took on this store (ParameterStore::NoteApplied),
  // -1 for none; ExportDone leaves out what was applied after a copy.
  void Record(const v1::RequestId& id, const PushOutcome& outcome,
              std::shared_ptr<const ForwardList> unreplicated = nullptr, int64_t applied_as = -1);
  // The forwards a recorded push owed went through.
  void MarkReplicated(const v1::RequestId& id);
  // The push claimed by Begin() was refused before anything changed: forget the claim, so a
  // retry is applied. A table push that was refused after part of it was applied (a backup's
  // forward whose groups of some stripes waited in vain for their turn, issue 37) names those
  // stripes in `applied_stripes` (bit s: EmbeddingTable stripe s): the id is kept, unclaimed,
  // and the next attempt (the worker's retry on a store promoted since, or the forward sent
  // again) learns them from Begin and applies only the rest.
  void Release(const v1::RequestId& id, uint64_t applied_stripes = 0);

  // Rebuild (issue 37): every push recorded as done, and each client's floor (the lowest id
  // still told: RequestId.seq), for a new backup's ledger; but those recorded with an
  // `applied_as` of `applied_below` or more (applied after the copy: the copy does not hold
  // them, so a retry must not be taken for a duplicate there).
  void ExportDone(google::protobuf::RepeatedPtrField<v1::LedgerEntry>* out,
                  google::protobuf::RepeatedPtrField<v1::RequestId>* floors,
                  int64_t applied_below = std::numeric_limits<int64_t>::max()) const;
  // Raises each client's floor to the one given (the ids below it forgotten: too old), then
  // records each entry as done where its id is not known yet (one known, done or being
  // applied, stays as it is; one below its client's floor is too old to keep), within the
  // ledger's bounds. With `over_partial` (the ledger of table copies, which hold whole every
  // push they name), also where its id is known as partly applied (released: Release's
  // applied_stripes), which would otherwise have a retry apply the rest again.
  void ImportDone(const google::protobuf::RepeatedPtrField<v1::LedgerEntry>& entries,
                  const google::protobuf::RepeatedPtrField<v1::RequestId>& floors,
                  bool over_partial = false);

  // Ids remembered (for tests and statistics).
  int64_t size() const;

 private:
  struct Entry {
    bool done = false;
    // Not done: an attempt holds the claim (false: released after a partial apply).
    bool claimed = true;
    uint64_t applied_stripes = 0;  // what released attempts applied
    PushOutcome outcome;
    std::shared_ptr<const ForwardList> unreplicated;
    int64_t applied_as = -1;  // Record's
  };
  struct Client {
    std::map<uint64_t, Entry> ids;
    // Every id below this was forgotten (or never seen from this incarnation).
    uint64_t floor = 0;
    uint64_t last_seen = 0;  // ledger clock
  };

  // Keeps at most ids_per_client_ ids of `c`, forgetting the oldest first (its floor rises).
  void TrimLocked(Client* c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int ids_per_client_;
  const int max_clients_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Client> clients_ ABSL_GUARDED_BY(mu_);
  uint64_t clock_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_PUSH_LEDGER_H_
