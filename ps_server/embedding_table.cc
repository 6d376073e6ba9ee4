#include "ps_server/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/denormal.h"
#include "common/huge_page_pool.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "ps_server/distinct_keys.h"
#include "ps_server/embedding_table_internal.h"
#include "ps_server/float_stats.h"
#include "ps_server/initializer.h"
#include "sharding/sparse_hash.h"

namespace pscluster {
namespace {

using embedding_table_internal::TracksLast;
using embedding_table_internal::WithTablePrefix;

// The stripe of a key: the top 6 bits of MixKey (row_index.h; the stripe's RowIndex uses the
// low bits). Deliberately not splitmix64 (which VirtualShardOfKey uses): the keys a task owns
// share their virtual-shard hash residues, and a stripe hash built from the same mix could put
// all of them in a few stripes.
int StripeOfKey(int64_t key) {
  static_assert(EmbeddingTable::kNumStripes == 64, "StripeOfKey takes the top 6 bits");
  return static_cast<int>(MixKey(key) >> 58);
}

// Prefetches the cache lines of n floats at p, at most the first four.
inline void PrefetchFloats(const float* p, int64_t n) {
  const char* bytes = reinterpret_cast<const char*>(p);
  const int64_t len = std::min<int64_t>(n * static_cast<int64_t>(sizeof(float)), 256);
  for (int64_t offset = 0; offset < len; offset += 64) __builtin_prefetch(bytes + offset);
  __builtin_prefetch(bytes + len - 1);  // the last line, when the row starts mid-line
}

// Rows found and ready for their update, applied kBatch at a time by one Optimizer::ApplyRows
// call: held as row numbers until then (an append may move the arena), so no row may be
// removed before its batch is applied.
template <int64_t kBatch>
class ReadyRows {
 public:
  ReadyRows(const Optimizer& optimizer, const DistinctGradients& grads, int64_t dim)
      : optimizer_(optimizer), grads_(grads), dim_(dim) {}

  // Row `row` of `arena`, with update count t, gets the gradient of the j-th distinct key.
  void Add(RowArena& arena, uint32_t row, uint32_t t, int64_t j) {
    ready_[n_++] = Ready{row, t, j};
    if (n_ == kBatch) Apply(arena);
  }
  void Apply(RowArena& arena) {
    Optimizer::RowUpdate updates[kBatch];
    for (int64_t r = 0; r < n_; ++r) {
      updates[r] = {arena.Row(ready_[r].row), grads_[ready_[r].j], ready_[r].t};
    }
    optimizer_.ApplyRows(updates, n_, dim_);
    n_ = 0;
  }

 private:
  struct Ready {
    uint32_t row;
    uint32_t t;
    int64_t j;
  };
  const Optimizer& optimizer_;
  const DistinctGradients& grads_;
  const int64_t dim_;
  Ready ready_[kBatch];
  int64_t n_ = 0;
};

// ApplyPlainStripe's per-thread scratch (see there), grown, never shrunk: tables of other dims
// and stripes share it, and a resize writes only what it adds.
struct PlainApplyScratch {
  std::vector<uint64_t> seen;  // one bit per row of the stripe, all clear between calls
  FirstOccurrenceIndex place_of_key;
  std::vector<int64_t> keys;
  std::vector<int64_t> rows;
  std::vector<uint32_t> ts;
  DistinctGradients grads;

  // Room for a part of `count` keys of rows of `dim` floats.
  void Prepare(int64_t count, int64_t dim) {
    Grow(keys, static_cast<size_t>(count));
    Grow(rows, static_cast<size_t>(count));
    Grow(ts, static_cast<size_t>(count));
    grads.Reset(count, dim);
  }
  // The bits of rows [0, num_rows).
  uint64_t* Seen(int64_t num_rows) {
    Grow(seen, static_cast<size_t>(num_rows) / 64 + 1);
    return seen.data();
  }
  // At the part's first repeat: the distinct keys so far (keys[0, num_distinct)) go into the
  // map, then `key`; where `key` first occurred.
  int64_t StartRepeats(int64_t count, int64_t num_distinct, int64_t key) {
    place_of_key.Reset(count);
    for (int64_t i = 0; i < num_distinct; ++i) place_of_key.FindOrInsert(keys[i], i);
    return place_of_key.FindOrInsert(key, num_distinct);
  }

 private:
  template <typename T>
  static void Grow(std::vector<T>& v, size_t size) {
    if (v.size() < size) v.resize(size);
  }
};

}  // namespace

constexpr int EmbeddingTable::kHotKeyCounters;

bool EmbeddingTable::OwnsKey(int64_t key) const {
  if (vocabulary_size_ > 0 && (key < 0 || key >= vocabulary_size_)) return false;
  return owned_[static_cast<size_t>(
      VirtualShardOfTableKey(key, vocabulary_size_, num_virtual_shards_))];
}

int EmbeddingTable::StripeOf(int64_t key) const {
  if (vocabulary_size_ == 0) return StripeOfKey(key);
  return vocabulary_.StripeOf(key);
}

absl::Status EmbeddingTable::CreateVocabularyRowLocked(Stripe* stripe, int64_t key, int64_t row) {
  absl::Status status = InitialRow(key, vocabulary_.Values(row), /*slots=*/true);
  if (!status.ok()) return WithTablePrefix(spec_.name(), status);
  vocabulary_.Count(row) = 1;
  ++stripe->vocabulary_rows;
  return absl::OkStatus();
}

void EmbeddingTable::ObserveStep(int64_t step) {
  if (step < 0) return;
  const uint32_t tick =
      static_cast<uint32_t>(std::min<int64_t>(step, std::numeric_limits<uint32_t>::max()));
  uint32_t seen = step_clock_.load(std::memory_order_relaxed);
  while (seen < tick && !step_clock_.compare_exchange_weak(seen, tick, std::memory_order_relaxed)) {
  }
}

uint32_t EmbeddingTable::Now(int64_t step) const {
  if (!ttl_in_seconds_ && step >= 0) {
    return static_cast<uint32_t>(std::min<int64_t>(step, std::numeric_limits<uint32_t>::max()));
  }
  if (ttl_in_seconds_) {
    return static_cast<uint32_t>(std::clamp<int64_t>(absl::ToUnixSeconds(absl::Now()), 0,
                                                     std::numeric_limits<uint32_t>::max()));
  }
  return step_clock_.load(std::memory_order_relaxed);
}

bool EmbeddingTable::TicksComparable(const v1::TableSpec& saved) const {
  return TracksLast(saved.eviction()) && (saved.eviction().ttl_seconds() > 0) == ttl_in_seconds_;
}

EmbeddingTable::Counts EmbeddingTable::counts() const {
  Counts c;
  c.admitted = admitted_.load(std::memory_order_relaxed);
  c.evicted = evicted_.load(std::memory_order_relaxed);
  c.expired = expired_.load(std::memory_order_relaxed);
  c.unadmitted = unadmitted_.load(std::memory_order_relaxed);
  return c;
}

absl::Status EmbeddingTable::InitialRow(int64_t key, float* values, bool slots) const {
  PS_RETURN_IF_ERROR(InitializeRow(spec_.initializer(), spec_.name(), key, dim_, values));
  if (slots) {
    for (int s = 0; s < num_slots_; ++s) {
      std::fill_n(values + (1 + s) * dim_, dim_, optimizer_->slot_initial_value(s));
    }
  }
  return absl::OkStatus();
}

void EmbeddingTable::RemoveRowLocked(Stripe* stripe, int64_t key, uint32_t row) {
  if (stripe->cut != nullptr) {
    if (const RowIndex::Entry* entry = stripe->rows.FindEntry(key))
      KeepForCutLocked(stripe, *entry);
  }
  if (stripe->tracking) stripe->removed.push_back(key);
  stripe->rows.Erase(key);
  stripe->free_rows.push_back(row);
}

void EmbeddingTable::EvictLocked(Stripe* stripe, uint32_t now) {
  if (eviction_.SweepDue(static_cast<int64_t>(stripe->rows.size()), stripe->swept_at, now)) {
    stripe->swept_at = now;
    const std::vector<RowIndex::Entry> old =
        eviction_.ExpiredRows(stripe->rows, stripe->last.data(), now);
    for (const RowIndex::Entry& e : old) RemoveRowLocked(stripe, e.key, e.row);
    expired_.fetch_add(static_cast<int64_t>(old.size()), std::memory_order_relaxed);
  }
  const std::vector<RowIndex::Entry> victims =
      eviction_.Victims(stripe->rows, stripe->last.data(), now);
  for (const RowIndex::Entry& e : victims) RemoveRowLocked(stripe, e.key, e.row);
  evicted_.fetch_add(static_cast<int64_t>(victims.size()), std::memory_order_relaxed);
}

absl::Status EmbeddingTable::NotOwnedError(int64_t key) const {
  return absl::FailedPreconditionError(
      absl::StrCat("key ", key, " of table ", spec_.name(), " hashes to virtual shard ",
                   VirtualShardOfTableKey(key, vocabulary_size_, num_virtual_shards_),
                   ", not held by this ps task: placement mismatch"));
}

absl::Status EmbeddingTable::CheckOwned(const int64_t* keys, int64_t n, ThreadPool* pool) const {
  // The first key not owned, over blocks of the request that run on the pool when it is large.
  std::atomic<int64_t> first{n};
  const auto scan = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      // (OwnsKey, inlined: this loop sees every key of every request.)
      if (vocabulary_size_ > 0
              ? static_cast<uint64_t>(keys[i]) < static_cast<uint64_t>(vocabulary_size_) &&
                    owned_[static_cast<size_t>(vocabulary_.Shard(keys[i]))]
              : owned_[static_cast<size_t>(VirtualShardOfKey(keys[i], num_virtual_shards_))]) {
        continue;
      }
      int64_t seen = first.load(std::memory_order_relaxed);
      while (i < seen && !first.compare_exchange_weak(seen, i)) {
      }
      return;
    }
  };
  if (pool == nullptr || pool->num_threads() == 0 || n < kMinParallelKeys) {
    scan(0, n);
  } else {
    pool->ParallelFor(n, kMinParallelKeys, scan);
  }
  const int64_t bad = first.load();
  if (bad == n) return absl::OkStatus();
  if (vocabulary_size_ > 0 && (keys[bad] < 0 || keys[bad] >= vocabulary_size_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table ", spec_.name(), ": key ", keys[bad], " at position ", bad,
        " is not an id of the vocabulary: expected [0, ", vocabulary_size_, ") (vocabulary_size)"));
  }
  return NotOwnedError(keys[bad]);
}

void EmbeddingTable::GroupByStripe(const int64_t* keys, int64_t n, StripeGroups* groups) const {
  groups->stripe_of.resize(static_cast<size_t>(n));
  int64_t count[kNumStripes] = {};
  // Plain pointers and locals: a store through a uint8_t* may alias anything, so members and
  // vector internals would otherwise be loaded again for every key.
  uint8_t* const stripe_of = groups->stripe_of.data();
  const auto stripes = [&](auto stripe_of_key) {
    for (int64_t i = 0; i < n; ++i) {
      const int s = stripe_of_key(keys[i]);
      stripe_of[i] = static_cast<uint8_t>(s);
      ++count[s];
    }
  };
  if (vocabulary_size_ == 0) {
    stripes(StripeOfKey);
  } else if (vocabulary_.shard_shift() >= 0) {
    const uint8_t* const stripe_of_shard = vocabulary_.stripe_of_shard();
    const uint64_t mask = static_cast<uint64_t>(num_virtual_shards_) - 1;
    stripes([=](int64_t key) { return stripe_of_shard[static_cast<uint64_t>(key) & mask]; });
  } else {
    stripes([this](int64_t key) { return StripeOf(key); });
  }
  groups->begin[0] = 0;
  for (int s = 0; s < kNumStripes; ++s) groups->begin[s + 1] = groups->begin[s] + count[s];
  int64_t next[kNumStripes];
  std::copy(groups->begin, groups->begin + kNumStripes, next);
  groups->order.resize(static_cast<size_t>(n));
  int64_t* const order = groups->order.data();
  for (int64_t i = 0; i < n; ++i) order[next[stripe_of[i]]++] = i;
}

absl::StatusOr<RowIndex::Entry*> EmbeddingTable::AppendRowLocked(Stripe* stripe, int64_t key,
                                                                 bool initialize, uint32_t now) {
  const size_t arena_rows = static_cast<size_t>(stripe->arena.size());
  const bool reuse = !stripe->free_rows.empty();
  const size_t new_row = reuse ? stripe->free_rows.back() : arena_rows;
  if (new_row >= RowIndex::kNoRow) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table ", spec_.name(), ": cannot create the row of key ", key,
                     ": its stripe already holds ", stripe->rows.size(), " rows"));
  }
  if (!reuse) {
    stripe->arena.AddRow();
    if (tracks_last_) stripe->last.resize(new_row + 1);
  }
  float* values = stripe->arena.Row(new_row);
  if (initialize) {
    absl::Status status = InitialRow(key, values, /*slots=*/true);
    if (!status.ok()) {
      if (!reuse) {
        stripe->arena.RemoveLastRow();
        if (tracks_last_) stripe->last.resize(new_row);
      }
      return WithTablePrefix(spec_.name(), status);
    }
  }
  if (reuse) {
    stripe->free_rows.pop_back();
    if (stripe->cut != nullptr) ForgetForCutLocked(stripe, static_cast<uint32_t>(new_row));
  }
  if (tracks_last_) stripe->last[new_row] = now;
  if (stripe->tracking) NoteChangedLocked(stripe, static_cast<uint32_t>(new_row));
  return stripe->rows.Insert(key, static_cast<uint32_t>(new_row));
}

absl::StatusOr<RowIndex::Entry*> EmbeddingTable::FindOrCreateRowLocked(Stripe* stripe, int64_t key,
                                                                       uint32_t now) {
  RowIndex::Entry* entry = stripe->rows.FindEntry(key);
  if (entry != nullptr) return entry;
  PS_ASSIGN_OR_RETURN(entry, AppendRowLocked(stripe, key, /*initialize=*/true, now));
  admitted_.fetch_add(1, std::memory_order_relaxed);
  return entry;
}

absl::Status EmbeddingTable::Pull(const int64_t* keys, int64_t n, float* out, ThreadPool* pool,
                                  int64_t step) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec_.name(), ": pull of ", n, " keys"));
  }
  PS_RETURN_IF_ERROR(CheckOwned(keys, n, pool));
  if (n == 0) return absl::OkStatus();
  StripeGroups groups;
  GroupByStripe(keys, n, &groups);
  const uint32_t now = tracks_last_ ? Now(step) : 0;
  absl::Status status[kNumStripes];
  ForEachStripe(n, pool, [&](int s) {
    const int64_t begin = groups.begin[s];
    if (begin == groups.begin[s + 1]) return;
    status[s] = vocabulary_size_ > 0
                    ? PullVocabularyStripe(&stripes_[s], keys, groups.order.data() + begin,
                                           groups.begin[s + 1] - begin, out)
                    : PullStripe(&stripes_[s], keys, groups.order.data() + begin,
                                 groups.begin[s + 1] - begin, out, now);
  });
  return FirstError(status);
}

absl::Status EmbeddingTable::PullVocabularyStripe(Stripe* stripe, const int64_t* keys,
                                                  const int64_t* order, int64_t count, float* out) {
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  std::vector<int64_t> absent;  // positions of keys without a row
  {
    // As PullStripe, with no index: the row (and its count) kKeyAhead keys on is prefetched.
    absl::ReaderMutexLock lock(&stripe->mu);
    for (int64_t j = 0; j < count; ++j) {
      if (j + kKeyAhead < count) {
        const int64_t ahead = vocabulary_.Row(keys[order[j + kKeyAhead]]);
        PrefetchFloats(vocabulary_.Values(ahead), dim_);
        __builtin_prefetch(&vocabulary_.Count(ahead));
      }
      const int64_t pos = order[j];
      const int64_t row = vocabulary_.Row(keys[pos]);
      if (vocabulary_.Count(row) == 0) {
        absent.push_back(pos);
      } else {
        std::memcpy(out + pos * dim_, vocabulary_.Values(row), row_bytes);
      }
    }
  }
  if (absent.empty()) return absl::OkStatus();
  // Another thread may have created some of these rows in between.
  StripeWriterLock lock(stripe);
  int64_t created = 0;
  absl::Status status;
  for (int64_t pos : absent) {
    const int64_t row = vocabulary_.Row(keys[pos]);
    if (vocabulary_.Count(row) == 0) {
      status = CreateVocabularyRowLocked(stripe, keys[pos], row);
      if (!status.ok()) break;
      ++created;
    }
    std::memcpy(out + pos * dim_, vocabulary_.Values(row), row_bytes);
  }
  admitted_.fetch_add(created, std::memory_order_relaxed);
  return status;
}

absl::Status EmbeddingTable::PullStripe(Stripe* stripe, const int64_t* keys, const int64_t* order,
                                        int64_t count, float* out, uint32_t now) {
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  std::vector<int64_t> absent;  // positions of keys without a row, or with an expired one
  {
    // Rows that exist are copied under the shared lock, so pulls do not block each other. The
    // loop is a pipeline: the hash slot of the key kKeyAhead positions on is prefetched, the
    // row of this one is found and prefetched, and the row found kRowLag positions back is
    // copied, so that a request's cache misses overlap instead of following one another.
    absl::ReaderMutexLock lock(&stripe->mu);
    // A pointer, which the thread-safety analysis does not follow (a reference it would check
    // against an unnamed mutex); the lock is held for all of its uses.
    const RowArena* arena = &stripe->arena;
    uint32_t ring[kRowRing];
    for (int64_t i = 0; i < count + kRowLag; ++i) {
      if (i + kKeyAhead < count) stripe->rows.Prefetch(keys[order[i + kKeyAhead]]);
      if (i < count) {
        const uint32_t row = stripe->rows.Find(keys[order[i]]);
        ring[i % kRowRing] = row;
        if (row == RowIndex::kNoRow) {
          absent.push_back(order[i]);
        } else {
          PrefetchFloats(arena->Row(row), dim_);
          if (tracks_last_) __builtin_prefetch(&stripe->last[row]);
        }
      }
      const int64_t j = i - kRowLag;
      if (j < 0) continue;
      const uint32_t row = ring[j % kRowRing];
      if (row == RowIndex::kNoRow) continue;
      if (tracks_last_ && eviction_.Expired(stripe->last[row], now)) {
        absent.push_back(order[j]);  // as removed
        continue;
      }
      std::memcpy(out + order[j] * dim_, arena->Row(row), row_bytes);
    }
  }
  if (absent.empty()) return absl::OkStatus();
  if (admission_ || tracks_last_) {
    // With admission or eviction, pulls create no rows (nor restart expired ones): rows are
    // made by pushes, so that reads (an evaluator's, say) neither fill the table nor make it
    // evict. A key without a row gets the initial values a row created now would have.
    for (int64_t pos : absent) {
      PS_RETURN_IF_ERROR(
          WithTablePrefix(spec_.name(), InitialRow(keys[pos], out + pos * dim_, /*slots=*/false)));
    }
    return absl::OkStatus();
  }
  // Another thread may create some of these rows in between; FindOrCreate handles it.
  StripeWriterLock lock(stripe);
  for (int64_t pos : absent) {
    PS_ASSIGN_OR_RETURN(const RowIndex::Entry* entry,
                        FindOrCreateRowLocked(stripe, keys[pos], /*now=*/0));
    std::memcpy(out + pos * dim_, stripe->arena.Row(entry->row), row_bytes);
  }
  return absl::OkStatus();
}

void EmbeddingTable::ForEachStripe(int64_t n, ThreadPool* pool,
                                   const std::function<void(int stripe)>& fn) {
  // Each request starts at another stripe, so that requests under way at once (one per client
  // connection) work on different stripes, instead of going through them in step and queueing
  // for the same lock at every one.
  const uint32_t first =
      next_first_stripe_.fetch_add(kFirstStripeStride, std::memory_order_relaxed) % kNumStripes;
  const auto stripe = [first](int64_t i) {
    return static_cast<int>((first + static_cast<uint32_t>(i)) % kNumStripes);
  };
  if (pool == nullptr || pool->num_threads() == 0 || n < kMinParallelKeys) {
    for (int i = 0; i < kNumStripes; ++i) fn(stripe(i));
    return;
  }
  // Stripes taken one at a time by whichever thread is free: on a busy machine a pool thread
  // may not run for a while, and fixed halves would leave the caller waiting for it.
  pool->ForEachIndex(kNumStripes, [&](int64_t i) { fn(stripe(i)); });
}

absl::Status EmbeddingTable::FirstError(const absl::Status (&status)[kNumStripes]) {
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::CheckPush(const int64_t* keys, int64_t n, const float* grads,
                                       bool allow_non_finite, ThreadPool* pool) const {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec_.name(), ": push of ", n, " keys"));
  }
  PS_RETURN_IF_ERROR(CheckOwned(keys, n, pool));
  if (!allow_non_finite) {
    const int64_t bad = FindNonFinite(grads, n * dim_, pool);
    if (bad >= 0) {
      const int64_t pos = bad / dim_;
      return absl::InvalidArgumentError(
          absl::StrCat("table ", spec_.name(), ": gradient for key ", keys[pos], " at position ",
                       pos, " has non-finite value ", grads[bad], " (element ", bad % dim_,
                       " of its row); non-finite gradients are refused"));
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::Push(const int64_t* keys, int64_t n, const float* grads,
                                  bool allow_non_finite, ThreadPool* pool) {
  PS_RETURN_IF_ERROR(CheckPush(keys, n, grads, allow_non_finite, pool));
  return ApplyPush(keys, n, grads, pool);
}

absl::Status EmbeddingTable::ApplyPush(const int64_t* keys, int64_t n, const float* grads,
                                       ThreadPool* pool, int64_t step, bool sample_hot_keys) {
  if (n == 0) return absl::OkStatus();
  StripeGroups groups;
  GroupByStripe(keys, n, &groups);
  const uint32_t now = tracks_last_ ? Now(step) : 0;
  absl::Status status[kNumStripes];
  const bool plain = !admission_ && !tracks_last_;
  ForEachStripe(n, pool, [&](int s) {
    const int64_t begin = groups.begin[s];
    if (begin == groups.begin[s + 1]) return;
    const int64_t* order = groups.order.data() + begin;
    const int64_t count = groups.begin[s + 1] - begin;
    if (vocabulary_size_ > 0) {
      status[s] = ApplyPlainStripe<true>(&stripes_[s], keys, grads, order, count);
    } else if (plain) {
      status[s] = ApplyPlainStripe<false>(&stripes_[s], keys, grads, order, count);
    } else {
      status[s] = ApplyStripe(&stripes_[s], keys, grads, order, count, now);
    }
  });
  if (sample_hot_keys) hot_keys_.SamplePush(keys, n);
  return FirstError(status);
}

template <bool kVocabulary>
uint32_t EmbeddingTable::CountPlainUpdateLocked(Stripe* stripe, RowIndex::Entry* entry,
                                                int64_t row) {
  if (kVocabulary) {
    // Stored as 1 + the count: saturates at a count of 2^32 - 2.
    uint32_t& stored = vocabulary_.Count(row);
    if (stored != std::numeric_limits<uint32_t>::max()) ++stored;
    return stored - 1;
  }
  PrefetchFloats(stripe->arena.Row(static_cast<uint32_t>(row)), stride_);
  return RowIndex::CountUpdate(entry);
}

template <bool kVocabulary>
bool EmbeddingTable::FindOrCreatePlainRowLocked(Stripe* stripe, int64_t key,
                                                RowIndex::Entry** entry, int64_t* row,
                                                int64_t* created, absl::Status* status) {
  if (kVocabulary) {
    *row = vocabulary_.Row(key);
    if (vocabulary_.Count(*row) != 0) return true;
    *status = CreateVocabularyRowLocked(stripe, key, *row);
    if (!status->ok()) return false;
    ++*created;
    return true;
  }
  *entry = stripe->rows.FindEntry(key);
  if (*entry == nullptr) {
    absl::StatusOr<RowIndex::Entry*> appended =
        AppendRowLocked(stripe, key, /*initialize=*/true, /*now=*/0);
    if (!appended.ok()) {
      *status = appended.status();
      return false;
    }
    *entry = *appended;
    ++*created;
  }
  *row = (*entry)->row;
  return true;
}

template <bool kVocabulary>
absl::Status EmbeddingTable::ApplyPlainStripe(Stripe* stripe, const int64_t* keys,
                                              const float* grads, const int64_t* order,
                                              int64_t count) {
  // One pass finds (or creates) the row of every key, in order of position, and lists each
  // distinct row once with its gradient (DistinctGradients); a second pass updates the rows,
  // which the first has prefetched. Until the part's first repeat, a key is known to be new by
  // its row's bit in `seen` (one bit per row of the stripe, all clear between calls): a bit
  // test beside the row's lookup, where ApplyStripe probes a map of the part's keys for every
  // key. From the first repeat on, each key is looked up in such a map before the index, so
  // that a skewed part probes the index once per distinct key, as ApplyStripe does. A
  // vocabulary table's rows are found by number, with no index to probe (its `seen` bits are
  // the stripe's rows, counted from the stripe's first).
  thread_local PlainApplyScratch scratch;
  scratch.Prepare(count, dim_);
  DistinctGradients& distinct_grads = scratch.grads;
  int64_t* const distinct_keys = scratch.keys.data();
  int64_t* const distinct_rows = scratch.rows.data();
  uint32_t* const ts = scratch.ts.data();
  int64_t num_distinct = 0;
  int64_t num_created = 0;
  bool repeats = false;
  absl::Status status;
  StripeWriterLock lock(stripe);
  const int s = static_cast<int>(stripe - stripes_.get());
  const int64_t first_row = kVocabulary ? vocabulary_.FirstRow(s) : 0;
  // Rows this request can create are numbered below arena.size() + count.
  uint64_t* const seen =
      scratch.Seen(kVocabulary ? vocabulary_.EndRow(s) - first_row : stripe->arena.size() + count);
  for (int64_t j = 0; j < count; ++j) {
    if (j + kKeyAhead < count) {
      if (kVocabulary) {
        const int64_t ahead = vocabulary_.Row(keys[order[j + kKeyAhead]]);
        PrefetchFloats(vocabulary_.Values(ahead), stride_);
        __builtin_prefetch(&vocabulary_.Count(ahead));
      } else {
        stripe->rows.Prefetch(keys[order[j + kKeyAhead]]);
      }
    }
    const int64_t pos = order[j];
    const int64_t key = keys[pos];
    const float* grad = grads + pos * dim_;
    if (repeats) {
      const int64_t first = scratch.place_of_key.FindOrInsert(key, num_distinct);
      if (first < num_distinct) {
        distinct_grads.Add(first, grad);
        continue;
      }
    }
    RowIndex::Entry* entry = nullptr;
    int64_t row;
    if (!FindOrCreatePlainRowLocked<kVocabulary>(stripe, key, &entry, &row, &num_created,
                                                 &status)) {
      break;  // finding stops here; the rows found are still updated
    }
    uint64_t& word = seen[(row - first_row) / 64];
    const uint64_t bit = uint64_t{1} << ((row - first_row) % 64);
    if (!repeats && (word & bit) != 0) {
      repeats = true;  // the part's first repeat
      distinct_grads.Add(scratch.StartRepeats(count, num_distinct, key), grad);
      continue;
    }
    word |= bit;
    if (!kVocabulary && stripe->watched) WatchRowLocked(stripe, *entry);
    distinct_keys[num_distinct] = key;
    distinct_rows[num_distinct] = row;
    ts[num_distinct] = CountPlainUpdateLocked<kVocabulary>(stripe, entry, row);
    distinct_grads.Set(num_distinct++, grad);
  }
  UpdatePlainRowsLocked<kVocabulary>(stripe, distinct_rows, distinct_grads, ts, num_distinct,
                                     first_row, seen);
  if (num_created > 0) admitted_.fetch_add(num_created, std::memory_order_relaxed);
  return status;
}

template <bool kVocabulary, typename Grads>
void EmbeddingTable::UpdatePlainRowsLocked(Stripe* stripe, const int64_t* rows, const Grads& grads,
                                           const uint32_t* ts, int64_t n, int64_t first_row,
                                           uint64_t* seen) {
  // Takes the arena as an argument: the thread-safety analysis cannot see the lock in a lambda.
  const auto values_of = [this](RowArena& arena, int64_t row) {
    return kVocabulary ? vocabulary_.Values(row) : arena.Row(static_cast<uint32_t>(row));
  };
  ScopedFlushDenormals flush;  // as every optimizer update (optimizer.h), not the sums before
  Optimizer::RowUpdate updates[kUpdateBatch];
  for (int64_t begin = 0; begin < n; begin += kUpdateBatch) {
    const int64_t batch = std::min(kUpdateBatch, n - begin);
    for (int64_t r = 0; r < batch; ++r) {
      const int64_t i = begin + r;
      if (i + kUpdateAhead < n) {
        PrefetchFloats(grads[i + kUpdateAhead], dim_);
        PrefetchFloats(values_of(stripe->arena, rows[i + kUpdateAhead]), stride_);
      }
      const int64_t row = rows[i];
      updates[r] = {values_of(stripe->arena, row), grads[i], ts[i]};
      seen[(row - first_row) / 64] &= ~(uint64_t{1} << ((row - first_row) % 64));
    }
    optimizer_->ApplyRows(updates, batch, dim_);
  }
}

RowIndex::Entry* EmbeddingTable::AdmitRowLocked(Stripe* stripe, int64_t key, uint32_t now,
                                                std::vector<AdmissionFilter::Bump>* bumps,
                                                int64_t* admitted, absl::Status* status) {
  if (admission_ && !stripe->sketch.Admit(key, bumps)) return nullptr;
  absl::StatusOr<RowIndex::Entry*> created = AppendRowLocked(stripe, key, /*initialize=*/true, now);
  if (!created.ok()) {
    *status = created.status();
    return nullptr;
  }
  ++*admitted;
  return *created;
}

bool EmbeddingTable::RestartExpiredRowLocked(Stripe* stripe, int64_t key, uint32_t row,
                                             float* values,
                                             std::vector<AdmissionFilter::Bump>* bumps) {
  if (admission_ && !stripe->sketch.Admit(key, bumps)) {
    RemoveRowLocked(stripe, key, row);
    return false;
  }
  // Created again (Create checked the initializer).
  InitialRow(key, values, /*slots=*/true).IgnoreError();
  stripe->rows.FindEntry(key)->count = 1;
  return true;
}

absl::Status EmbeddingTable::ApplyStripe(Stripe* stripe, const int64_t* keys, const float* grads,
                                         const int64_t* order, int64_t count, uint32_t now) {
  // The stripe's distinct keys, listed outside the lock.
  thread_local DistinctKeys scratch;
  const int64_t num_distinct = scratch.List(keys, grads, order, count, dim_);
  const int64_t* const distinct_keys = scratch.keys.data();
  const DistinctGradients& distinct_grads = scratch.grads;
  int64_t admitted = 0, unadmitted = 0, expired = 0;
  std::vector<AdmissionFilter::Bump> bumps;
  StripeWriterLock lock(stripe);
  // A pipeline as in PullStripe: prefetch the hash slot kKeyAhead keys on, find (or create)
  // and prefetch this key's row (and its last-push tick), update the row found kRowLag keys
  // back. The update count is taken when the row is found (it shares the index entry's cache
  // line). Rows are held as indices: creating a row may move the arena and the index.
  absl::Status status;
  int64_t found = 0;  // Rows found so far; finding stops at the first error.
  struct Found {
    uint32_t row;
    uint32_t t;
  };
  Found ring[kRowRing];
  // (Only an expired row is removed, and it never joins the ready rows.)
  ReadyRows<kUpdateBatch> ready(*optimizer_, distinct_grads, dim_);
  ScopedFlushDenormals flush;  // as every optimizer update (optimizer.h)
  for (int64_t i = 0;; ++i) {
    if (i < num_distinct && status.ok()) {
      if (i + kKeyAhead < num_distinct) stripe->rows.Prefetch(distinct_keys[i + kKeyAhead]);
      RowIndex::Entry* entry = stripe->rows.FindEntry(distinct_keys[i]);
      if (entry == nullptr) {
        entry = AdmitRowLocked(stripe, distinct_keys[i], now, &bumps, &admitted, &status);
      }
      if (!status.ok()) {
        // Finding stops here; the rows found so far are still updated.
      } else if (entry == nullptr) {
        ring[i % kRowRing] = Found{RowIndex::kNoRow, 0};  // counted, not admitted
        ++unadmitted;
        ++found;
      } else {
        const uint32_t row = entry->row;
        if (stripe->watched) WatchRowLocked(stripe, *entry);
        ring[i % kRowRing] = Found{row, RowIndex::CountUpdate(entry)};
        PrefetchFloats(stripe->arena.Row(row), stride_);
        PrefetchFloats(distinct_grads[i], dim_);
        if (tracks_last_) __builtin_prefetch(&stripe->last[row]);
        ++found;
      }
    }
    const int64_t j = i - kRowLag;
    if (j >= found) {
      ready.Apply(stripe->arena);
      break;
    }
    if (j < 0) continue;
    Found row = ring[j % kRowRing];
    if (row.row == RowIndex::kNoRow) continue;
    float* values = stripe->arena.Row(row.row);
    if (tracks_last_) {
      uint32_t& last = stripe->last[row.row];
      if (eviction_.Expired(last, now)) {
        ++expired;
        if (!RestartExpiredRowLocked(stripe, distinct_keys[j], row.row, values, &bumps)) {
          ++unadmitted;  // counted, not admitted: the row went
          continue;
        }
        row.t = 1;
        ++admitted;
      }
      // Never back: an async push that read the clock before another took the lock.
      last = std::max(last, now);
    }
    ready.Add(stripe->arena, row.row, row.t, j);
  }
  if (admitted > 0) admitted_.fetch_add(admitted, std::memory_order_relaxed);
  if (unadmitted > 0) unadmitted_.fetch_add(unadmitted, std::memory_order_relaxed);
  if (expired > 0) expired_.fetch_add(expired, std::memory_order_relaxed);
  stripe->sketch.Apply(bumps);
  if (tracks_last_) EvictLocked(stripe, now);
  return status;
}

}  // namespace pscluster
