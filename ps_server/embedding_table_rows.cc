// EmbeddingTable read and written whole: psctl's lookups and statistics, the table's size, and
// what checkpoints save and restore (every row, the admission sketch).

#include <algorithm>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "ps_server/embedding_table.h"
#include "ps_server/embedding_table_internal.h"
#include "ps_server/float_stats.h"

namespace pscluster {

using embedding_table_internal::RowBytes;
using embedding_table_internal::VocabularyRowBytes;

void EmbeddingTable::Lookup(const int64_t* keys, int64_t n, std::vector<int64_t>* found,
                            std::vector<float>* rows, std::vector<int64_t>* missing) const {
  if (n <= 0) return;
  StripeGroups groups;
  GroupByStripe(keys, n, &groups);
  // Rows are gathered by stripe into `gathered` at their request position, then emitted in order.
  std::vector<float> gathered(static_cast<size_t>(n * dim_));
  std::vector<char> exists(static_cast<size_t>(n), 0);
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  const uint32_t now = tracks_last_ ? Now() : 0;
  for (int s = 0; s < kNumStripes; ++s) {
    const int64_t begin = groups.begin[s];
    const int64_t end = groups.begin[s + 1];
    if (begin == end) continue;
    const Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    for (int64_t j = begin; j < end; ++j) {
      const int64_t pos = groups.order[j];
      if (vocabulary_size_ > 0) {
        if (!OwnsKey(keys[pos])) continue;
        const int64_t row = vocabulary_.Row(keys[pos]);
        if (vocabulary_.Count(row) == 0) continue;
        exists[pos] = 1;
        std::memcpy(gathered.data() + pos * dim_, vocabulary_.Values(row), row_bytes);
        continue;
      }
      const uint32_t row = stripe.rows.Find(keys[pos]);
      if (row == RowIndex::kNoRow) continue;
      if (tracks_last_ && eviction_.Expired(stripe.last[row], now)) continue;  // as removed
      exists[pos] = 1;
      std::memcpy(gathered.data() + pos * dim_, stripe.arena.Row(row), row_bytes);
    }
  }
  for (int64_t pos = 0; pos < n; ++pos) {
    if (exists[pos]) {
      found->push_back(keys[pos]);
      rows->insert(rows->end(), gathered.begin() + pos * dim_, gathered.begin() + (pos + 1) * dim_);
    } else {
      missing->push_back(keys[pos]);
    }
  }
}

int64_t EmbeddingTable::num_rows() const {
  int64_t rows = 0;
  for (int s = 0; s < kNumStripes; ++s) {
    absl::ReaderMutexLock lock(&stripes_[s].mu);
    rows += static_cast<int64_t>(stripes_[s].rows.size()) + stripes_[s].vocabulary_rows;
  }
  return rows;
}

int64_t EmbeddingTable::bytes() const {
  return vocabulary_size_ > 0 ? reserved_bytes() : num_rows() * row_bytes();
}

int64_t EmbeddingTable::row_bytes() const {
  return vocabulary_size_ > 0 ? VocabularyRowBytes(stride_) : RowBytes(stride_, tracks_last_);
}

void EmbeddingTable::ComputeValueStats(v1::ValueStats* stats) const {
  FloatStats all;
  for (int s = 0; s < kNumStripes; ++s) {
    const Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    const RowArena* arena = &stripe.arena;  // for the lambda, as below
    stripe.rows.ForEach([&](const RowIndex::Entry& e) { all.Add(arena->Row(e.row), dim_); });
    if (vocabulary_size_ > 0) {
      vocabulary_.ForEachCreated(
          s, [&](int64_t, int64_t row) { all.Add(vocabulary_.Values(row), dim_); });
    }
  }
  all.Fill(stats);
}

void EmbeddingTable::ForEachRow(const std::function<void(int64_t key, const float* values_and_slots,
                                                         int64_t t, uint32_t last)>& fn) const {
  std::vector<RowIndex::Entry> entries;
  std::vector<float> rows;
  std::vector<uint32_t> last;
  const size_t stride = static_cast<size_t>(stride_);
  const uint32_t now = tracks_last_ ? Now() : 0;
  for (int s = 0; s < kNumStripes; ++s) {
    const Stripe& stripe = stripes_[s];
    {
      // Copy, so that fn runs with no lock held.
      absl::ReaderMutexLock lock(&stripe.mu);
      entries.clear();
      rows.resize(stripe.rows.size() * stride);
      last.assign(stripe.rows.size(), 0);
      // Taken under the lock for the lambda, which the thread-safety analysis cannot see into.
      const RowArena* arena = &stripe.arena;
      const uint32_t* last_of_row = stripe.last.data();
      stripe.rows.ForEach([&](const RowIndex::Entry& entry) {
        if (tracks_last_ && eviction_.Expired(last_of_row[entry.row], now)) return;  // as removed
        const size_t i = entries.size();
        std::memcpy(rows.data() + i * stride, arena->Row(entry.row), stride * sizeof(float));
        if (tracks_last_) last[i] = last_of_row[entry.row];
        entries.push_back(entry);
      });
      if (vocabulary_size_ > 0) {
        rows.resize(static_cast<size_t>(stripe.vocabulary_rows) * stride);
        last.assign(static_cast<size_t>(stripe.vocabulary_rows), 0);
        vocabulary_.ForEachCreated(s, [&](int64_t key, int64_t row) {
          const size_t i = entries.size();
          std::memcpy(rows.data() + i * stride, vocabulary_.Values(row), stride * sizeof(float));
          entries.push_back({key, 0, vocabulary_.Count(row) - 1});
        });
      }
    }
    for (size_t i = 0; i < entries.size(); ++i) {
      fn(entries[i].key, rows.data() + i * stride, entries[i].count, last[i]);
    }
  }
}

void EmbeddingTable::RowsCopy::MakeRoom(size_t n, size_t stride) {
  keys.resize(n);
  counts.resize(n);
  last.resize(n);
  rows.resize(n * stride);
  keys.clear();
  counts.clear();
  last.clear();
  rows.clear();
}

void EmbeddingTable::CopyRows(RowsCopy* out) const {
  const size_t stride = static_cast<size_t>(stride_);
  const size_t expected = out->keys.size() + static_cast<size_t>(num_rows());
  out->keys.reserve(expected);
  out->counts.reserve(expected);
  out->last.reserve(expected);
  out->rows.reserve(expected * stride);
  const uint32_t now = tracks_last_ ? Now() : 0;
  std::vector<RowIndex::Entry> entries;
  for (int s = 0; s < kNumStripes; ++s) {
    const Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    entries.clear();
    stripe.rows.ForEach([&entries](const RowIndex::Entry& entry) { entries.push_back(entry); });
    AppendRowsLocked(&stripe, entries, now, out);
    if (vocabulary_size_ > 0) {
      vocabulary_.ForEachCreated(s, [&](int64_t key, int64_t row) {
        out->keys.push_back(key);
        out->counts.push_back(vocabulary_.Count(row) - 1);
        out->last.push_back(0);
        const float* values = vocabulary_.Values(row);
        out->rows.insert(out->rows.end(), values, values + stride);
      });
    }
  }
}

void EmbeddingTable::CopyStripeRows(int s, const std::function<bool(int64_t key)>& keep,
                                    RowsCopy* out) const {
  const size_t stride = static_cast<size_t>(stride_);
  const uint32_t now = tracks_last_ ? Now() : 0;
  const Stripe& stripe = stripes_[s];
  absl::ReaderMutexLock lock(&stripe.mu);
  std::vector<RowIndex::Entry> entries;
  stripe.rows.ForEach([&](const RowIndex::Entry& entry) {
    if (keep(entry.key)) entries.push_back(entry);
  });
  AppendRowsLocked(&stripe, entries, now, out);
  if (vocabulary_size_ > 0) {
    vocabulary_.ForEachCreated(s, [&](int64_t key, int64_t row) {
      if (!keep(key)) return;
      out->keys.push_back(key);
      out->counts.push_back(vocabulary_.Count(row) - 1);
      out->last.push_back(0);
      const float* values = vocabulary_.Values(row);
      out->rows.insert(out->rows.end(), values, values + stride);
    });
  }
}

void EmbeddingTable::AppendRowsLocked(const Stripe* stripe,
                                      const std::vector<RowIndex::Entry>& entries, uint32_t now,
                                      RowsCopy* out) const {
  const size_t stride = static_cast<size_t>(stride_);
  // The entries come in the index's order, but their rows lie anywhere in the arena: each is
  // prefetched this many entries ahead.
  constexpr size_t kAhead = 8;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i + kAhead < entries.size()) {
      __builtin_prefetch(stripe->arena.Row(entries[i + kAhead].row));
      if (tracks_last_) __builtin_prefetch(&stripe->last[entries[i + kAhead].row]);
    }
    const RowIndex::Entry& entry = entries[i];
    const uint32_t last = tracks_last_ ? stripe->last[entry.row] : 0;
    if (tracks_last_ && eviction_.Expired(last, now)) continue;  // as removed
    out->keys.push_back(entry.key);
    out->counts.push_back(entry.count);
    out->last.push_back(last);
    const float* row = stripe->arena.Row(entry.row);
    out->rows.insert(out->rows.end(), row, row + stride);
  }
}

namespace {

// TakeStripeCut's pause between two chunks of a stripe, with its lock let go.
constexpr absl::Duration kCutChunkPause = absl::Microseconds(20);

bool Bit(const std::vector<uint64_t>& bits, uint32_t i) {
  return i / 64 < bits.size() && (bits[i / 64] >> (i % 64) & 1) != 0;
}

}  // namespace

void EmbeddingTable::MarkCut(bool delta, bool track_changes) {
  const uint32_t now = tracks_last_ ? Now() : 0;
  for (int s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    auto cut = std::make_unique<StripeCut>();
    cut->rows_at_cut = static_cast<uint32_t>(stripe.arena.size());
    cut->now = now;
    cut->kept.assign((cut->rows_at_cut + 63) / 64, 0);
    if (delta) {
      cut->delta = true;
      cut->changed = std::move(stripe.changed);
      cut->removed = std::move(stripe.removed);
    }
    stripe.changed.clear();
    stripe.removed.clear();
    stripe.tracking = track_changes;
    if (track_changes) stripe.changed.assign((cut->rows_at_cut + 63) / 64, 0);
    stripe.cut = std::move(cut);
    SetWatchedLocked(&stripe);
  }
}

bool EmbeddingTable::ChangesTracked() const {
  for (int s = 0; s < kNumStripes; ++s) {
    absl::ReaderMutexLock lock(&stripes_[s].mu);
    if (!stripes_[s].tracking) return false;
  }
  return true;
}

void EmbeddingTable::KeepForCutLocked(Stripe* stripe, const RowIndex::Entry& entry) {
  StripeCut& cut = *stripe->cut;
  const uint32_t row = entry.row;
  if (row >= cut.rows_at_cut) return;  // made after the mark
  uint64_t& word = cut.kept[row / 64];
  const uint64_t bit = uint64_t{1} << (row % 64);
  if ((word & bit) != 0) return;  // kept already
  word |= bit;
  if (Bit(cut.taken, row)) return;  // in a chunk TakeStripeCut has copied already
  const uint32_t last = tracks_last_ ? stripe->last[row] : 0;
  if (tracks_last_ && eviction_.Expired(last, cut.now)) {
    // Not in the cut: as removed.
    if (cut.delta) cut.removed.push_back(entry.key);
    return;
  }
  // Unchanged since the previous mark: the checkpoint before has it.
  if (cut.delta && !Bit(cut.changed, row)) return;
  RowsCopy& kept = cut.rows;
  kept.keys.push_back(entry.key);
  kept.counts.push_back(entry.count);
  kept.last.push_back(last);
  const float* values = stripe->arena.Row(row);
  kept.rows.insert(kept.rows.end(), values, values + stride_);
}

void EmbeddingTable::ForgetForCutLocked(Stripe* stripe, uint32_t row) {
  StripeCut& cut = *stripe->cut;
  if (row < cut.rows_at_cut) cut.kept[row / 64] |= uint64_t{1} << (row % 64);
}

void EmbeddingTable::KeepAllForCutLocked(Stripe* stripe) {
  std::vector<RowIndex::Entry> entries;
  stripe->rows.ForEach([&entries](const RowIndex::Entry& entry) { entries.push_back(entry); });
  for (const RowIndex::Entry& entry : entries) KeepForCutLocked(stripe, entry);
  // Every other row number below the mark was free then: none is in the arena's part of the cut.
  std::fill(stripe->cut->kept.begin(), stripe->cut->kept.end(), ~uint64_t{0});
}

void EmbeddingTable::TakeStripeCut(int s, RowsCopy* out, std::vector<int64_t>* removed,
                                   int64_t chunk_rows, int64_t yield_rows) {
  Stripe& stripe = stripes_[s];
  // The copy reads the stripe under its shared lock: pulls of rows that exist go on, and the
  // writers that could change what it reads (pushes, rows created, a sweep) wait for it. The
  // taking thread is the only one that writes the cut's `taken` bits without the exclusive
  // lock; a writer reads them only under it.
  stripe.mu.ReaderLock();
  if (stripe.cut == nullptr) {
    stripe.mu.ReaderUnlock();
    return;
  }
  // Only TakeStripeCut, MarkCut and DropCut replace the cut, and a save calls them in turn.
  StripeCut& cut = *stripe.cut;
  const size_t stride = static_cast<size_t>(stride_);
  const size_t expected =
      out->keys.size() + (cut.delta ? 0 : stripe.rows.size()) + cut.rows.keys.size();
  out->keys.reserve(expected);
  out->counts.reserve(expected);
  out->last.reserve(expected);
  out->rows.reserve(expected * stride);
  // The rows unchanged since the mark, from the arena: in an incremental cut, those changed
  // before it (since the previous mark), and the keys of those past their TTL at it.
  std::vector<RowIndex::Entry> entries;
  entries.reserve(cut.delta ? 1024 : stripe.rows.size());
  const uint32_t* const last = tracks_last_ ? stripe.last.data() : nullptr;
  stripe.rows.ForEach([&](const RowIndex::Entry& entry) {
    if (entry.row >= cut.rows_at_cut || Bit(cut.kept, entry.row)) return;
    if (cut.delta) {
      if (last != nullptr && eviction_.Expired(last[entry.row], cut.now)) {
        removed->push_back(entry.key);
        return;
      }
      if (!Bit(cut.changed, entry.row)) return;
    }
    entries.push_back(entry);
  });
  // Copied a few rows at a time: after `chunk_rows` rows, or every `yield_rows` rows when a
  // writer waits, the lock is let go for a moment, in which pushes may change rows not copied
  // yet, which keeps them aside (their bit in `kept`), and rows copied already (their bit in
  // `taken`).
  cut.taken.assign(cut.kept.size(), 0);
  const size_t chunk = static_cast<size_t>(std::max<int64_t>(1, chunk_rows));
  const size_t step = std::min(chunk, static_cast<size_t>(std::max<int64_t>(1, yield_rows)));
  std::vector<RowIndex::Entry> unchanged;
  size_t since_pause = 0;
  for (size_t begin = 0; begin < entries.size(); begin += step) {
    if (since_pause >= chunk ||
        (since_pause > 0 && stripe.writers_waiting.load(std::memory_order_relaxed) > 0)) {
      // absl::Mutex is not fair: a thread that locks again at once usually gets the lock before
      // the waiter its unlock woke has run. The pause lets that push (or pull) in first.
      stripe.mu.ReaderUnlock();
      absl::SleepFor(kCutChunkPause);
      stripe.mu.ReaderLock();
      since_pause = 0;
    }
    const size_t end = std::min(entries.size(), begin + step);
    unchanged.clear();
    for (size_t i = begin; i < end; ++i) {
      const uint32_t row = entries[i].row;
      if (Bit(cut.kept, row)) continue;  // changed since the stripe's lock was let go
      unchanged.push_back(entries[i]);
      cut.taken[row / 64] |= uint64_t{1} << (row % 64);
    }
    AppendRowsLocked(&stripe, unchanged, cut.now, out);
    since_pause += end - begin;
  }
  stripe.mu.ReaderUnlock();
  // The rows changed since, as they were; every row of the mark is in the copy or kept now, so a
  // change from here on keeps nothing more.
  absl::MutexLock lock(&stripe.mu);
  const RowsCopy& kept = cut.rows;
  out->keys.insert(out->keys.end(), kept.keys.begin(), kept.keys.end());
  out->counts.insert(out->counts.end(), kept.counts.begin(), kept.counts.end());
  out->last.insert(out->last.end(), kept.last.begin(), kept.last.end());
  out->rows.insert(out->rows.end(), kept.rows.begin(), kept.rows.end());
  if (cut.delta) removed->insert(removed->end(), cut.removed.begin(), cut.removed.end());
  stripe.cut.reset();
  SetWatchedLocked(&stripe);
}

void EmbeddingTable::DropCut() {
  for (int s = 0; s < kNumStripes; ++s) {
    absl::MutexLock lock(&stripes_[s].mu);
    stripes_[s].cut.reset();
    SetWatchedLocked(&stripes_[s]);
  }
}

int64_t EmbeddingTable::cut_kept_rows() const {
  int64_t rows = 0;
  for (int s = 0; s < kNumStripes; ++s) {
    absl::ReaderMutexLock lock(&stripes_[s].mu);
    if (stripes_[s].cut != nullptr) rows += static_cast<int64_t>(stripes_[s].cut->rows.keys.size());
  }
  return rows;
}

std::vector<uint16_t> EmbeddingTable::AdmissionSketch() const {
  std::vector<uint16_t> counters;
  if (!admission_) return counters;
  counters.reserve(static_cast<size_t>(kNumStripes * kSketchRows * sketch_width_));
  for (int s = 0; s < kNumStripes; ++s) {
    absl::ReaderMutexLock lock(&stripes_[s].mu);
    const std::vector<uint16_t>& mine = stripes_[s].sketch.counters();
    counters.insert(counters.end(), mine.begin(), mine.end());
  }
  return counters;
}

std::vector<int32_t> EmbeddingTable::OwnedVirtualShards() const {
  std::vector<int32_t> shards;
  for (size_t v = 0; v < owned_.size(); ++v) {
    if (owned_[v]) shards.push_back(static_cast<int32_t>(v));
  }
  return shards;
}

absl::Status EmbeddingTable::MergeAdmissionSketch(const std::vector<uint16_t>& counters) {
  const size_t per_stripe = static_cast<size_t>(kSketchRows * sketch_width_);
  if (counters.size() != per_stripe * kNumStripes) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec_.name(), ": an admission sketch of ", counters.size(),
                     " counters; this table's has ", per_stripe * kNumStripes,
                     " (was admission.sketch_width changed?)"));
  }
  for (int s = 0; s < kNumStripes; ++s) {
    absl::MutexLock lock(&stripes_[s].mu);
    stripes_[s].sketch.Merge(counters.data() + s * per_stripe);
  }
  return absl::OkStatus();
}

void EmbeddingTable::Clear() {
  for (int s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    ClearStripeLocked(&stripe, s);
  }
  step_clock_.store(0, std::memory_order_relaxed);
}

void EmbeddingTable::ClearStripeLocked(Stripe* stripe, int s) {
  if (stripe->cut != nullptr) KeepAllForCutLocked(stripe);
  // What changed is no longer known row by row: the next cut cannot be incremental.
  stripe->tracking = false;
  SetWatchedLocked(stripe);
  std::vector<uint64_t>().swap(stripe->changed);
  std::vector<int64_t>().swap(stripe->removed);
  stripe->rows = RowIndex();
  stripe->arena.Clear();
  std::vector<uint32_t>().swap(stripe->free_rows);
  std::vector<uint32_t>().swap(stripe->last);
  stripe->sketch.Clear();
  stripe->swept_at = 0;
  if (vocabulary_size_ > 0) {
    vocabulary_.ClearStripe(s);
    stripe->vocabulary_rows = 0;
  }
}

void EmbeddingTable::RemoveRows(const int64_t* keys, int64_t n) {
  if (is_vocabulary()) return;
  for (int64_t i = 0; i < n; ++i) {
    if (!OwnsKey(keys[i])) continue;
    Stripe& stripe = stripes_[StripeOf(keys[i])];
    absl::MutexLock lock(&stripe.mu);
    const RowIndex::Entry* entry = stripe.rows.FindEntry(keys[i]);
    if (entry != nullptr) RemoveRowLocked(&stripe, keys[i], entry->row);
  }
}

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::EmptyLike() const {
  return Create(spec_, OwnedVirtualShards(), num_virtual_shards_);
}

absl::Status EmbeddingTable::AdoptRows(EmbeddingTable& staged) {
  if (is_vocabulary() || staged.is_vocabulary() || staged.stride_ != stride_ ||
      staged.owned_ != owned_ || staged.tracks_last_ != tracks_last_) {
    return absl::FailedPreconditionError(
        absl::StrCat("table ", spec_.name(), " cannot adopt the rows of table ",
                     staged.spec_.name(), ": not a hashed table of the same rows and shards"));
  }
  for (int s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    Stripe& from = staged.stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    absl::MutexLock from_lock(&from.mu);
    ClearStripeLocked(&stripe, s);
    std::swap(stripe.rows, from.rows);
    stripe.arena.Swap(from.arena);
    stripe.free_rows.swap(from.free_rows);
    stripe.last.swap(from.last);
  }
  step_clock_.store(staged.step_clock_.exchange(0, std::memory_order_relaxed),
                    std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status EmbeddingTable::InsertRow(int64_t key, const float* values_and_slots, int64_t t,
                                       uint32_t last) {
  if (!OwnsKey(key)) return NotOwnedError(key);
  if (t < 0) {
    return absl::InvalidArgumentError(absl::StrCat("table ", spec_.name(), ": row of key ", key,
                                                   " has negative update count ", t));
  }
  Stripe& stripe = stripes_[StripeOf(key)];
  {
    absl::MutexLock lock(&stripe.mu);
    PS_RETURN_IF_ERROR(InsertRowLocked(&stripe, key, values_and_slots, t, last));
  }
  // The clock resumes where the checkpoint's newest push left it.
  if (tracks_last_ && !ttl_in_seconds_ && vocabulary_size_ == 0) ObserveStep(last);
  return absl::OkStatus();
}

absl::Status EmbeddingTable::InsertRowLocked(Stripe* stripe, int64_t key,
                                             const float* values_and_slots, int64_t t,
                                             uint32_t last) {
  if (vocabulary_size_ > 0) {
    const int64_t row = vocabulary_.Row(key);
    if (vocabulary_.Count(row) == 0) ++stripe->vocabulary_rows;
    std::memcpy(vocabulary_.Values(row), values_and_slots,
                static_cast<size_t>(stride_) * sizeof(float));
    // Stored as 1 + the count, which saturates at 2^32 - 2.
    vocabulary_.Count(row) =
        static_cast<uint32_t>(std::min<int64_t>(t, std::numeric_limits<uint32_t>::max() - 1) + 1);
    return absl::OkStatus();
  }
  RowIndex::Entry* entry = stripe->rows.FindEntry(key);
  if (entry != nullptr && stripe->cut != nullptr) KeepForCutLocked(stripe, *entry);
  if (entry == nullptr) {
    // Not initialized: the row is overwritten below.
    PS_ASSIGN_OR_RETURN(entry, AppendRowLocked(stripe, key, /*initialize=*/false, last));
  } else if (stripe->tracking) {
    NoteChangedLocked(stripe, entry->row);
  }
  if (tracks_last_) stripe->last[entry->row] = last;
  std::memcpy(stripe->arena.Row(entry->row), values_and_slots,
              static_cast<size_t>(stride_) * sizeof(float));
  entry->count = static_cast<uint32_t>(std::min<int64_t>(t, RowIndex::kMaxCount));
  return absl::OkStatus();
}

absl::Status EmbeddingTable::InsertRows(const int64_t* keys, const float* values_and_slots,
                                        const int64_t* t, const uint32_t* last, int64_t n,
                                        ThreadPool* pool) {
  if (n <= 0) return absl::OkStatus();
  PS_RETURN_IF_ERROR(CheckOwned(keys, n, pool));
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("table ", spec_.name(), ": row of key ",
                                                     keys[i], " has negative update count ", t[i]));
    }
  }
  StripeGroups groups;
  GroupByStripe(keys, n, &groups);
  absl::Status status[kNumStripes];
  ForEachStripe(n, pool, [&](int s) {
    const int64_t begin = groups.begin[s];
    const int64_t count = groups.begin[s + 1] - begin;
    if (count == 0) return;
    const int64_t* order = groups.order.data() + begin;
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    if (vocabulary_size_ == 0) stripe.rows.Reserve(stripe.rows.size() + static_cast<size_t>(count));
    for (int64_t j = 0; j < count && status[s].ok(); ++j) {
      const int64_t i = order[j];
      status[s] = InsertRowLocked(&stripe, keys[i], values_and_slots + i * stride_, t[i],
                                  last == nullptr ? 0 : last[i]);
    }
  });
  if (tracks_last_ && !ttl_in_seconds_ && vocabulary_size_ == 0 && last != nullptr) {
    // The clock resumes where the checkpoint's newest push left it.
    ObserveStep(*std::max_element(last, last + n));
  }
  return FirstError(status);
}

}  // namespace pscluster
