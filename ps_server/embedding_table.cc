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
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "ps_server/distinct_keys.h"
#include "ps_server/float_stats.h"
#include "ps_server/huge_page_pool.h"
#include "ps_server/initializer.h"
#include "sharding/sparse_hash.h"

namespace pscluster {
namespace {

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

absl::Status WithTablePrefix(const std::string& table, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("table ", table, ": ", status.message()));
}

constexpr int64_t kDefaultSketchWidth = int64_t{1} << 20;
constexpr int64_t kMinSketchWidth = 4096;
constexpr int64_t kMaxSketchWidth = int64_t{1} << 26;

int64_t RowBytes(int64_t stride, bool tracks_last) {
  return stride * static_cast<int64_t>(sizeof(float)) +
         static_cast<int64_t>(sizeof(RowIndex::Entry)) + (tracks_last ? 4 : 0);
}

// A vocabulary table's row: its floats and its count.
int64_t VocabularyRowBytes(int64_t stride) {
  return stride * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(uint32_t));
}

constexpr int64_t kMaxVocabulary = int64_t{1} << 48;

// OK, or INVALID_ARGUMENT naming the table, for a vocabulary_size out of range or a
// vocabulary table with admission or eviction.
absl::Status ValidateVocabulary(const v1::TableSpec& spec) {
  const int64_t v = spec.vocabulary_size();
  if (v < 0 || v > kMaxVocabulary) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.name(), ": vocabulary_size ", v,
                     ": expected 0 (a hashed table) or a number of ids in [1, 2^48]"));
  }
  if (v > 0 && (spec.has_admission() || spec.has_eviction())) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.name(), ": a vocabulary table (vocabulary_size ", v,
                     ") keeps a row for every id: admission and eviction are for hashed tables "
                     "(vocabulary_size 0)"));
  }
  return absl::OkStatus();
}

// A vocabulary table's rows on a task owning num_owned shards, and their bytes; or
// RESOURCE_EXHAUSTED past 2^62 bytes.
absl::StatusOr<int64_t> VocabularyBytes(const v1::TableSpec& spec, int64_t stride,
                                        int64_t num_owned, int32_t num_virtual_shards) {
  const int64_t rows_per_shard =
      (spec.vocabulary_size() + num_virtual_shards - 1) / num_virtual_shards;
  const double bytes = static_cast<double>(num_owned) * static_cast<double>(rows_per_shard) *
                       static_cast<double>(VocabularyRowBytes(stride));
  if (bytes > 0x1.0p62) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table ", spec.name(), ": vocabulary_size ", spec.vocabulary_size(),
                     " with dim ", spec.dim(), " needs ", bytes, " bytes on this ps task"));
  }
  return num_owned * rows_per_shard * VocabularyRowBytes(stride);
}

bool TracksLast(const v1::EvictionSpec& e) {
  return e.ttl_steps() > 0 || e.ttl_seconds() > 0 || e.max_rows() > 0 || e.max_bytes() > 0;
}

// Per-stripe sketch width: the spec's total width over the stripes, a power of two.
int64_t StripeSketchWidth(const v1::AdmissionSpec& a) {
  int64_t total = a.sketch_width() > 0 ? a.sketch_width() : kDefaultSketchWidth;
  total = std::max(total, kMinSketchWidth);
  int64_t width = 1;
  while (width * EmbeddingTable::kNumStripes < total) width *= 2;
  return width;
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

absl::Status ValidateAdmissionAndEviction(const v1::TableSpec& spec) {
  const auto bad = [&spec](absl::string_view field, auto value, absl::string_view expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.name(), ": ", field, " ", value, ": expected ", expected));
  };
  const v1::AdmissionSpec& a = spec.admission();
  if (a.min_count() < 0 || a.min_count() > 65535) {
    return bad("admission.min_count", a.min_count(), "a count in [0, 65535]");
  }
  if (!(a.probability() >= 0 && a.probability() <= 1)) {
    return bad("admission.probability", a.probability(), "a probability in [0, 1]");
  }
  if (a.sketch_width() < 0 || a.sketch_width() > kMaxSketchWidth) {
    return bad("admission.sketch_width", a.sketch_width(), "0 (the default) to 2^26 counters");
  }
  const v1::EvictionSpec& e = spec.eviction();
  constexpr int64_t kMaxTtl = std::numeric_limits<uint32_t>::max();
  if (e.ttl_steps() < 0 || e.ttl_steps() > kMaxTtl) {
    return bad("eviction.ttl_steps", e.ttl_steps(), "0 (none) to 2^32 - 1 steps");
  }
  if (e.ttl_seconds() < 0 || e.ttl_seconds() > kMaxTtl) {
    return bad("eviction.ttl_seconds", e.ttl_seconds(), "0 (none) to 2^32 - 1 seconds");
  }
  if (e.ttl_steps() > 0 && e.ttl_seconds() > 0) {
    return bad("eviction.ttl_seconds", e.ttl_seconds(), "0 when ttl_steps is set (one TTL)");
  }
  if (e.max_rows() < 0) return bad("eviction.max_rows", e.max_rows(), "0 (no limit) or more");
  if (e.max_bytes() < 0) return bad("eviction.max_bytes", e.max_bytes(), "0 (no limit) or more");
  return absl::OkStatus();
}

constexpr int EmbeddingTable::kNumStripes;
constexpr int64_t EmbeddingTable::kMinParallelKeys;
constexpr int EmbeddingTable::kHotKeyCounters;

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Create(
    const v1::TableSpec& spec, std::vector<int32_t> owned_virtual_shards,
    int32_t num_virtual_shards) {
  if (spec.name().empty()) {
    return absl::InvalidArgumentError("table spec has an empty name");
  }
  constexpr int64_t kMaxDim = int64_t{1} << 31;
  if (spec.dim() < 1 || spec.dim() >= kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec.name(), ": dim ", spec.dim(), " is not in [1, 2^31)"));
  }
  absl::Status initializer_status = ValidateInitializer(spec.initializer());
  if (!initializer_status.ok()) return WithTablePrefix(spec.name(), initializer_status);
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::Create(spec.optimizer());
  if (!optimizer.ok()) return WithTablePrefix(spec.name(), optimizer.status());
  PS_RETURN_IF_ERROR(ValidateAdmissionAndEviction(spec));
  PS_RETURN_IF_ERROR(ValidateVocabulary(spec));
  // The capacity as rows per stripe: the tighter of max_rows and max_bytes.
  const v1::EvictionSpec& eviction = spec.eviction();
  const int64_t row_bytes =
      RowBytes(spec.dim() * (1 + int64_t{(*optimizer)->num_slots()}), TracksLast(eviction));
  int64_t capacity = eviction.max_rows();
  if (eviction.max_bytes() > 0) {
    const int64_t by_bytes = eviction.max_bytes() / row_bytes;
    if (by_bytes < kNumStripes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", spec.name(), ": eviction.max_bytes ", eviction.max_bytes(), " holds ", by_bytes,
          " rows of ", row_bytes, " bytes: expected room for at least ", kNumStripes,
          " (one per lock stripe)"));
    }
    capacity = capacity > 0 ? std::min(capacity, by_bytes) : by_bytes;
  }
  const int64_t stripe_capacity = capacity > 0 ? std::max<int64_t>(1, capacity / kNumStripes) : 0;
  if (num_virtual_shards <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("table ", spec.name(), ": num_virtual_shards ",
                                                   num_virtual_shards, " is not positive"));
  }
  std::vector<bool> owned(static_cast<size_t>(num_virtual_shards), false);
  for (int32_t shard : owned_virtual_shards) {
    if (shard < 0 || shard >= num_virtual_shards) {
      return absl::InvalidArgumentError(absl::StrCat("table ", spec.name(),
                                                     ": owned virtual shard ", shard,
                                                     " is not in [0, ", num_virtual_shards, ")"));
    }
    owned[static_cast<size_t>(shard)] = true;
  }
  if (spec.vocabulary_size() > 0) {
    const int64_t num_owned = std::count(owned.begin(), owned.end(), true);
    PS_RETURN_IF_ERROR(VocabularyBytes(spec, spec.dim() * (1 + int64_t{(*optimizer)->num_slots()}),
                                       num_owned, num_virtual_shards)
                           .status());
  }
  std::unique_ptr<EmbeddingTable> table(new EmbeddingTable(
      spec, *std::move(optimizer), std::move(owned), num_virtual_shards, stripe_capacity));
  if (!table->vocabulary_allocated_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table ", spec.name(), ": cannot allocate ", table->reserved_bytes(),
                     " bytes for the rows of vocabulary_size ", spec.vocabulary_size()));
  }
  return table;
}

absl::StatusOr<int64_t> EmbeddingTable::ReservedBytes(const v1::TableSpec& spec, int64_t num_owned,
                                                      int32_t num_virtual_shards) {
  PS_RETURN_IF_ERROR(ValidateVocabulary(spec));
  if (spec.vocabulary_size() == 0 || num_owned <= 0 || num_virtual_shards <= 0) return 0;
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::Create(spec.optimizer());
  if (!optimizer.ok()) return WithTablePrefix(spec.name(), optimizer.status());
  return VocabularyBytes(spec, spec.dim() * (1 + int64_t{(*optimizer)->num_slots()}), num_owned,
                         num_virtual_shards);
}

int64_t EmbeddingTable::reserved_bytes() const {
  return vocabulary_.size() * VocabularyRowBytes(stride_);
}

EmbeddingTable::EmbeddingTable(v1::TableSpec spec, std::unique_ptr<Optimizer> optimizer,
                               std::vector<bool> owned, int32_t num_virtual_shards,
                               int64_t stripe_capacity)
    : spec_(std::move(spec)),
      dim_(spec_.dim()),
      optimizer_(std::move(optimizer)),
      num_slots_(optimizer_->num_slots()),
      stride_((1 + int64_t{num_slots_}) * dim_),
      owned_(std::move(owned)),
      num_virtual_shards_(num_virtual_shards),
      admission_(spec_.has_admission()),
      sketch_width_(admission_ ? StripeSketchWidth(spec_.admission()) : 0),
      tracks_last_(TracksLast(spec_.eviction())),
      ttl_in_seconds_(spec_.eviction().ttl_seconds() > 0),
      eviction_(static_cast<uint32_t>(
                    std::max(spec_.eviction().ttl_steps(), spec_.eviction().ttl_seconds())),
                stripe_capacity, spec_.eviction().policy() == v1::EvictionSpec::LFU),
      stripes_(new Stripe[kNumStripes]),
      vocabulary_size_(spec_.vocabulary_size()) {
  for (int s = 0; s < kNumStripes; ++s) {
    absl::MutexLock lock(&stripes_[s].mu);
    stripes_[s].arena.Reset(stride_);
    if (admission_) {
      stripes_[s].sketch =
          AdmissionFilter(sketch_width_, static_cast<uint32_t>(spec_.admission().min_count()),
                          spec_.admission().probability());
    }
  }
  if (vocabulary_size_ > 0) {
    vocabulary_allocated_ = vocabulary_.Allocate(vocabulary_size_, owned_, stride_, kNumStripes);
  }
}

EmbeddingTable::~EmbeddingTable() = default;

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
  if (reuse) stripe->free_rows.pop_back();
  if (tracks_last_) stripe->last[new_row] = now;
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
  absl::MutexLock lock(&stripe->mu);
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
  absl::MutexLock lock(&stripe->mu);
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
                                       ThreadPool* pool, int64_t step) {
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
  hot_keys_.SamplePush(keys, n);
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
  absl::MutexLock lock(&stripe->mu);
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
  absl::MutexLock lock(&stripe->mu);
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
    stripe.rows = RowIndex();
    stripe.arena.Clear();
    std::vector<uint32_t>().swap(stripe.free_rows);
    std::vector<uint32_t>().swap(stripe.last);
    stripe.sketch.Clear();
    stripe.swept_at = 0;
    if (vocabulary_size_ > 0) {
      vocabulary_.ClearStripe(s);
      stripe.vocabulary_rows = 0;
    }
  }
  step_clock_.store(0, std::memory_order_relaxed);
}

absl::Status EmbeddingTable::InsertRow(int64_t key, const float* values_and_slots, int64_t t,
                                       uint32_t last) {
  if (!OwnsKey(key)) return NotOwnedError(key);
  if (t < 0) {
    return absl::InvalidArgumentError(absl::StrCat("table ", spec_.name(), ": row of key ", key,
                                                   " has negative update count ", t));
  }
  Stripe& stripe = stripes_[StripeOf(key)];
  absl::MutexLock lock(&stripe.mu);
  if (vocabulary_size_ > 0) {
    const int64_t row = vocabulary_.Row(key);
    if (vocabulary_.Count(row) == 0) ++stripe.vocabulary_rows;
    std::memcpy(vocabulary_.Values(row), values_and_slots,
                static_cast<size_t>(stride_) * sizeof(float));
    // Stored as 1 + the count, which saturates at 2^32 - 2.
    vocabulary_.Count(row) =
        static_cast<uint32_t>(std::min<int64_t>(t, std::numeric_limits<uint32_t>::max() - 1) + 1);
    return absl::OkStatus();
  }
  RowIndex::Entry* entry = stripe.rows.FindEntry(key);
  if (entry == nullptr) {
    // Not initialized: the row is overwritten below.
    PS_ASSIGN_OR_RETURN(entry, AppendRowLocked(&stripe, key, /*initialize=*/false, last));
  }
  if (tracks_last_) stripe.last[entry->row] = last;
  // The clock resumes where the checkpoint's newest push left it.
  if (tracks_last_ && !ttl_in_seconds_) ObserveStep(last);
  std::memcpy(stripe.arena.Row(entry->row), values_and_slots,
              static_cast<size_t>(stride_) * sizeof(float));
  entry->count = static_cast<uint32_t>(std::min<int64_t>(t, RowIndex::kMaxCount));
  return absl::OkStatus();
}

}  // namespace pscluster
