#ifndef PSCLUSTER_PS_SERVER_ROW_INDEX_H_
#define PSCLUSTER_PS_SERVER_ROW_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/huge_page_pool.h"

namespace pscluster {

// MurmurHash3's 64-bit finalizer: a key's hash for the embedding table's stripes (top bits) and
// row indexes (low bits).
inline uint64_t MixKey(int64_t key) {
  uint64_t x = static_cast<uint64_t>(key);
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// The index of one embedding-table stripe: int64 key -> an Entry holding the key's uint32 row
// number and the row's update count, open addressing with linear probing over 16-byte entries,
// at most 3/4 full. It exists, rather than an absl::flat_hash_map, for Prefetch: a lookup's home
// entry is one known cache line that a pipelined caller can prefetch exactly, while a swiss
// table's probe touches a control group and a 256-byte slot group that its prefetch() only partly
// covers. The count lives in the entry (in what would otherwise be padding) so that an update
// that finds its row has its count in the same cache line. Erase shifts entries back instead of
// leaving tombstones.
//
// Thread-safety: none (the stripe's lock guards it); const methods may run concurrently.
class RowIndex {
 public:
  // Find's answer for a key with no row; not a valid row number.
  static constexpr uint32_t kNoRow = std::numeric_limits<uint32_t>::max();
  // Update counts saturate here (Adam's bias correction 1 - beta^t is 1 in float long before).
  static constexpr uint32_t kMaxCount = std::numeric_limits<uint32_t>::max();

  struct Entry {
    int64_t key = 0;
    uint32_t row = kNoRow;
    uint32_t count = 0;  // the row's update count, saturating at kMaxCount
  };
  static_assert(sizeof(Entry) == 16, "four entries to a cache line");

  RowIndex() : slots_(kMinCapacity), mask_(kMinCapacity - 1) {}

  // The row of `key`, or kNoRow.
  uint32_t Find(int64_t key) const {
    const Entry* entry = FindEntry(key);
    return entry == nullptr ? kNoRow : entry->row;
  }

  // The entry of `key`, or null. Valid until the next Insert.
  const Entry* FindEntry(int64_t key) const {
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      const Entry& slot = slots_[i];
      if (slot.row == kNoRow) return nullptr;
      if (slot.key == key) return &slot;
    }
  }
  Entry* FindEntry(int64_t key) {
    return const_cast<Entry*>(static_cast<const RowIndex*>(this)->FindEntry(key));
  }

  // Records that `key` has row `row`, with count 0; returns its entry (valid until the next
  // Insert).
  // REQUIRES: FindEntry(key) == nullptr, row != kNoRow.
  Entry* Insert(int64_t key, uint32_t row) {
    if (4 * (size_ + 1) > 3 * slots_.size()) Grow();
    ++size_;
    return Place(Entry{key, row, 0});
  }

  // Removes `key`'s entry, if any, and returns whether there was one. Backward-shift deletion:
  // the entries after it in its probe run move up, so lookups never meet a tombstone. Entry
  // pointers from before the call are invalid after it.
  bool Erase(int64_t key) {
    size_t i = Home(key);
    while (true) {
      if (slots_[i].row == kNoRow) return false;
      if (slots_[i].key == key) break;
      i = (i + 1) & mask_;
    }
    // Fill the hole at i with a later entry of the run that may move there (its home is not
    // cyclically within (i, j]), until the run ends.
    size_t j = i;
    while (true) {
      j = (j + 1) & mask_;
      if (slots_[j].row == kNoRow) break;
      const size_t home = Home(slots_[j].key);
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      slots_[i] = slots_[j];
      i = j;
    }
    slots_[i] = Entry{};
    --size_;
    return true;
  }

  // Adds one to *entry's count, saturating at kMaxCount, and returns the new count.
  static uint32_t CountUpdate(Entry* entry) {
    if (entry->count != kMaxCount) ++entry->count;
    return entry->count;
  }

  // Starts loading the cache line where a lookup of `key` begins.
  void Prefetch(int64_t key) const { __builtin_prefetch(&slots_[Home(key)]); }

  // Number of keys.
  size_t size() const { return size_; }

  // Calls fn(entry) for every key's entry, in no particular order.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const Entry& slot : slots_) {
      if (slot.row != kNoRow) fn(slot);
    }
  }

  // Makes room for n entries in all, so that inserting up to that many grows nothing.
  void Reserve(size_t n) {
    while (4 * n > 3 * slots_.size()) Grow();
  }

 private:
  static constexpr size_t kMinCapacity = 16;

  size_t Home(int64_t key) const { return static_cast<size_t>(MixKey(key)) & mask_; }

  Entry* Place(const Entry& entry) {
    size_t i = Home(entry.key);
    while (slots_[i].row != kNoRow) i = (i + 1) & mask_;
    slots_[i] = entry;
    return &slots_[i];
  }

  void Grow() {
    std::vector<Entry, HugePageAllocator<Entry>> old(2 * slots_.size());
    old.swap(slots_);
    mask_ = slots_.size() - 1;
    for (const Entry& slot : old) {
      if (slot.row != kNoRow) Place(slot);
    }
  }

  // Capacity: a power of two; from the huge-page pool (aligned to a power of two of at least
  // 64 bytes, so an entry never straddles two lines).
  std::vector<Entry, HugePageAllocator<Entry>> slots_;
  size_t mask_;
  size_t size_ = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_ROW_INDEX_H_
