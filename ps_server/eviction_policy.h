#ifndef PSCLUSTER_PS_SERVER_EVICTION_POLICY_H_
#define PSCLUSTER_PS_SERVER_EVICTION_POLICY_H_

#include <cstdint>
#include <vector>

#include "ps_server/row_index.h"

namespace pscluster {

// Which rows of an embedding-table stripe go (model.proto's EvictionSpec), given each row's
// index entry (key, row number, update count) and the tick of its last push:
//
// - A row last pushed more than `ttl` ticks before now is expired (ttl 0: never); a stripe is
//   swept of its expired rows once the clock has moved a quarter of the TTL since its last
//   sweep (or went back: a restore), and always before an eviction for capacity, so that what
//   the capacity evicts does not depend on when the stripe was last swept.
// - A stripe holding more than `capacity` rows (0: no limit) keeps 15/16 of it, evicting the
//   least recently pushed first (LRU; fewer updates first among equals) or the least updated
//   (LFU; rows pushed at the current tick last, or a new row would be the first to go; older
//   first among equals), ties broken by a hash of the key, then the key: the choice depends on
//   the rows' contents, not on where they lie in memory, so a restored table evicts as the
//   original would.
//
// Immutable and pure: thread-safe.
class EvictionPolicy {
 public:
  // No eviction.
  EvictionPolicy() = default;
  EvictionPolicy(uint32_t ttl, int64_t capacity, bool lfu)
      : ttl_(ttl), capacity_(capacity), lfu_(lfu) {}

  uint32_t ttl() const { return ttl_; }
  int64_t capacity() const { return capacity_; }

  bool Expired(uint32_t last, uint32_t now) const {
    return ttl_ > 0 && now > last && now - last > ttl_;
  }
  // Whether a stripe of `rows` rows, last swept at `swept_at`, is to be swept at `now`.
  bool SweepDue(int64_t rows, uint32_t swept_at, uint32_t now) const;

  // The entries of `index` whose rows expired at `now`; last[e.row] is row e.row's last push.
  std::vector<RowIndex::Entry> ExpiredRows(const RowIndex& index, const uint32_t* last,
                                           uint32_t now) const;
  // The entries to evict from a stripe whose `index` holds more than capacity() rows (none
  // otherwise), down to 15/16 of it.
  std::vector<RowIndex::Entry> Victims(const RowIndex& index, const uint32_t* last,
                                       uint32_t now) const;

 private:
  uint32_t ttl_ = 0;
  int64_t capacity_ = 0;
  bool lfu_ = false;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_EVICTION_POLICY_H_
