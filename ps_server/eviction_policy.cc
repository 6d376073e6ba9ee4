#include "ps_server/eviction_policy.h"

#include <algorithm>
#include <tuple>

namespace pscluster {

bool EvictionPolicy::SweepDue(int64_t rows, uint32_t swept_at, uint32_t now) const {
  if (ttl_ == 0) return false;
  const bool over = capacity_ > 0 && rows > capacity_;
  return over || now < swept_at || now - swept_at >= std::max(1u, ttl_ / 4);
}

std::vector<RowIndex::Entry> EvictionPolicy::ExpiredRows(const RowIndex& index,
                                                         const uint32_t* last, uint32_t now) const {
  std::vector<RowIndex::Entry> old;
  index.ForEach([&](const RowIndex::Entry& e) {
    if (Expired(last[e.row], now)) old.push_back(e);
  });
  return old;
}

std::vector<RowIndex::Entry> EvictionPolicy::Victims(const RowIndex& index, const uint32_t* last,
                                                     uint32_t now) const {
  const int64_t rows = static_cast<int64_t>(index.size());
  if (capacity_ == 0 || rows <= capacity_) return {};
  const int64_t keep = capacity_ - capacity_ / 16;
  // Evicted first: what sorts first by (rank1, rank2, hash of the key, key).
  struct Candidate {
    uint64_t rank1, rank2, hash;
    RowIndex::Entry entry;
    bool operator<(const Candidate& o) const {
      return std::tie(rank1, rank2, hash, entry.key) <
             std::tie(o.rank1, o.rank2, o.hash, o.entry.key);
    }
  };
  std::vector<Candidate> all;
  all.reserve(static_cast<size_t>(rows));
  index.ForEach([&](const RowIndex::Entry& e) {
    const uint32_t pushed = last[e.row];
    Candidate c{0, 0, MixKey(e.key), e};
    if (lfu_) {
      c.rank1 = (uint64_t{pushed >= now} << 32) | e.count;
      c.rank2 = pushed;
    } else {
      c.rank1 = pushed;
      c.rank2 = e.count;
    }
    all.push_back(c);
  });
  const size_t evict = static_cast<size_t>(rows - keep);
  std::nth_element(all.begin(), all.begin() + evict, all.end());
  std::vector<RowIndex::Entry> victims(evict);
  for (size_t i = 0; i < evict; ++i) victims[i] = all[i].entry;
  return victims;
}

}  // namespace pscluster
