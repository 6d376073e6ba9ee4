#include "ps_server/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/denormal.h"
#include "common/status_macros.h"
#include "common/thread_pool.h"
#include "ps_server/float_stats.h"
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

// An open-addressing map from key to the position of its first occurrence, for summing the
// duplicate keys of one stripe's part of a push. It is rebuilt for every stripe, which costs a
// flat_hash_map more (allocation, growth) than this linear-probing table that keeps its storage
// from stripe to stripe.
class FirstOccurrenceIndex {
 public:
  // Empties the index and makes room for up to max_keys keys.
  void Reset(int64_t max_keys) {
    size_t capacity = 16;
    while (capacity < 2 * static_cast<size_t>(max_keys)) capacity *= 2;
    mask_ = capacity - 1;
    slots_.assign(capacity, Slot{0, kEmpty});
  }

  // Returns the position recorded for `key`, or records and returns `position` if there is none.
  int64_t FindOrInsert(int64_t key, int64_t position) {
    // The low bits of the mix: the stripe used the top ones, so these still vary within one.
    for (size_t i = MixKey(key) & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.position == kEmpty) {
        slot = Slot{key, position};
        return position;
      }
      if (slot.key == key) return slot.position;
    }
  }

 private:
  static constexpr int64_t kEmpty = -1;
  struct Slot {
    int64_t key;
    int64_t position;
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

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

}  // namespace

constexpr int EmbeddingTable::kNumStripes;
constexpr int64_t EmbeddingTable::kMinParallelKeys;
constexpr int EmbeddingTable::kHotKeyCounters;
constexpr int EmbeddingTable::kHotKeySamplesPerPush;

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
  return absl::WrapUnique(
      new EmbeddingTable(spec, *std::move(optimizer), std::move(owned), num_virtual_shards));
}

EmbeddingTable::EmbeddingTable(v1::TableSpec spec, std::unique_ptr<Optimizer> optimizer,
                               std::vector<bool> owned, int32_t num_virtual_shards)
    : spec_(std::move(spec)),
      dim_(spec_.dim()),
      optimizer_(std::move(optimizer)),
      num_slots_(optimizer_->num_slots()),
      stride_((1 + int64_t{num_slots_}) * dim_),
      owned_(std::move(owned)),
      num_virtual_shards_(num_virtual_shards),
      stripes_(new Stripe[kNumStripes]) {}

EmbeddingTable::~EmbeddingTable() = default;

bool EmbeddingTable::OwnsKey(int64_t key) const {
  return owned_[static_cast<size_t>(VirtualShardOfKey(key, num_virtual_shards_))];
}

absl::Status EmbeddingTable::NotOwnedError(int64_t key) const {
  return absl::FailedPreconditionError(
      absl::StrCat("key ", key, " of table ", spec_.name(), " hashes to virtual shard ",
                   VirtualShardOfKey(key, num_virtual_shards_),
                   ", not held by this ps task: placement mismatch"));
}

absl::Status EmbeddingTable::CheckOwned(const int64_t* keys, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) {
    if (!owned_[static_cast<size_t>(VirtualShardOfKey(keys[i], num_virtual_shards_))]) {
      return NotOwnedError(keys[i]);
    }
  }
  return absl::OkStatus();
}

void EmbeddingTable::GroupByStripe(const int64_t* keys, int64_t n, bool with_order,
                                   StripeGroups* groups) {
  groups->stripe_of.resize(static_cast<size_t>(n));
  int64_t count[kNumStripes] = {};
  for (int64_t i = 0; i < n; ++i) {
    const int s = StripeOfKey(keys[i]);
    groups->stripe_of[i] = static_cast<uint8_t>(s);
    ++count[s];
  }
  groups->begin[0] = 0;
  for (int s = 0; s < kNumStripes; ++s) groups->begin[s + 1] = groups->begin[s] + count[s];
  if (!with_order) return;
  int64_t next[kNumStripes];
  std::copy(groups->begin, groups->begin + kNumStripes, next);
  groups->order.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) groups->order[next[groups->stripe_of[i]]++] = i;
}

absl::StatusOr<RowIndex::Entry*> EmbeddingTable::AppendRowLocked(Stripe* stripe, int64_t key,
                                                                 bool initialize) {
  const size_t new_row = stripe->rows.size();
  if (new_row >= RowIndex::kNoRow) {
    return absl::ResourceExhaustedError(
        absl::StrCat("table ", spec_.name(), ": cannot create the row of key ", key,
                     ": its stripe already holds ", new_row, " rows"));
  }
  stripe->arena.resize((new_row + 1) * static_cast<size_t>(stride_));
  float* values = stripe->arena.data() + new_row * static_cast<size_t>(stride_);
  if (initialize) {
    absl::Status status = InitializeRow(spec_.initializer(), spec_.name(), key, dim_, values);
    if (!status.ok()) {
      stripe->arena.resize(new_row * static_cast<size_t>(stride_));
      return WithTablePrefix(spec_.name(), status);
    }
    for (int s = 0; s < num_slots_; ++s) {
      std::fill_n(values + (1 + s) * dim_, dim_, optimizer_->slot_initial_value(s));
    }
  }
  return stripe->rows.Insert(key, static_cast<uint32_t>(new_row));
}

absl::StatusOr<RowIndex::Entry*> EmbeddingTable::FindOrCreateRowLocked(Stripe* stripe,
                                                                       int64_t key) {
  RowIndex::Entry* entry = stripe->rows.FindEntry(key);
  if (entry != nullptr) return entry;
  return AppendRowLocked(stripe, key, /*initialize=*/true);
}

absl::Status EmbeddingTable::Pull(const int64_t* keys, int64_t n, float* out, ThreadPool* pool) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec_.name(), ": pull of ", n, " keys"));
  }
  PS_RETURN_IF_ERROR(CheckOwned(keys, n));
  if (n == 0) return absl::OkStatus();
  StripeGroups groups;
  GroupByStripe(keys, n, /*with_order=*/true, &groups);
  absl::Status status[kNumStripes];
  ForEachStripe(n, pool, [&](int s) {
    const int64_t begin = groups.begin[s];
    if (begin == groups.begin[s + 1]) return;
    status[s] = PullStripe(&stripes_[s], keys, groups.order.data() + begin,
                           groups.begin[s + 1] - begin, out);
  });
  return FirstError(status);
}

absl::Status EmbeddingTable::PullStripe(Stripe* stripe, const int64_t* keys, const int64_t* order,
                                        int64_t count, float* out) {
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  std::vector<int64_t> absent;
  {
    // Rows that exist are copied under the shared lock, so pulls do not block each other. The
    // loop is a pipeline: the hash slot of the key kKeyAhead positions on is prefetched, the
    // row of this one is found and prefetched, and the row found kRowLag positions back is
    // copied, so that a request's cache misses overlap instead of following one another.
    absl::ReaderMutexLock lock(&stripe->mu);
    const float* arena = stripe->arena.data();
    uint32_t ring[kRowRing];
    for (int64_t i = 0; i < count + kRowLag; ++i) {
      if (i + kKeyAhead < count) stripe->rows.Prefetch(keys[order[i + kKeyAhead]]);
      if (i < count) {
        const uint32_t row = stripe->rows.Find(keys[order[i]]);
        ring[i % kRowRing] = row;
        if (row == RowIndex::kNoRow) {
          absent.push_back(order[i]);
        } else {
          PrefetchFloats(arena + static_cast<size_t>(row) * stride_, dim_);
        }
      }
      const int64_t j = i - kRowLag;
      if (j < 0 || ring[j % kRowRing] == RowIndex::kNoRow) continue;
      std::memcpy(out + order[j] * dim_, arena + static_cast<size_t>(ring[j % kRowRing]) * stride_,
                  row_bytes);
    }
  }
  if (absent.empty()) return absl::OkStatus();
  // Another thread may create some of these rows in between; FindOrCreate handles it.
  absl::MutexLock lock(&stripe->mu);
  for (int64_t pos : absent) {
    PS_ASSIGN_OR_RETURN(const RowIndex::Entry* entry, FindOrCreateRowLocked(stripe, keys[pos]));
    std::memcpy(out + pos * dim_, stripe->arena.data() + static_cast<size_t>(entry->row) * stride_,
                row_bytes);
  }
  return absl::OkStatus();
}

void EmbeddingTable::ForEachStripe(int64_t n, ThreadPool* pool,
                                   const std::function<void(int stripe)>& fn) {
  const auto run = [&fn](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) fn(static_cast<int>(s));
  };
  if (pool == nullptr || pool->num_threads() == 0 || n < kMinParallelKeys) {
    run(0, kNumStripes);
    return;
  }
  pool->ParallelFor(kNumStripes, /*min_block=*/4, run);
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
  PS_RETURN_IF_ERROR(CheckOwned(keys, n));
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
                                       ThreadPool* pool) {
  if (n == 0) return absl::OkStatus();
  StripeGroups groups;
  GroupByStripe(keys, n, /*with_order=*/false, &groups);

  // The keys and gradients, permuted into stripe order (stably), so that each stripe's part is
  // read sequentially. Duplicates are summed, in order of position, into their first occurrence,
  // outside the lock; the lock then covers only one optimizer update per distinct key.
  std::vector<int64_t> sorted_keys(static_cast<size_t>(n));
  std::vector<float> sorted_grads(static_cast<size_t>(n * dim_));
  {
    int64_t next[kNumStripes];
    std::copy(groups.begin, groups.begin + kNumStripes, next);
    const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = next[groups.stripe_of[i]]++;
      sorted_keys[j] = keys[i];
      std::memcpy(sorted_grads.data() + j * dim_, grads + i * dim_, row_bytes);
    }
  }
  absl::Status status[kNumStripes];
  ForEachStripe(n, pool, [&](int s) {
    const int64_t begin = groups.begin[s];
    if (begin == groups.begin[s + 1]) return;
    status[s] = ApplyStripe(&stripes_[s], sorted_keys.data() + begin,
                            sorted_grads.data() + begin * dim_, groups.begin[s + 1] - begin);
  });
  SampleHotKeys(keys, n);
  return FirstError(status);
}

absl::Status EmbeddingTable::ApplyStripe(Stripe* stripe, const int64_t* keys, float* grads,
                                         int64_t count) {
  // Sum the gradients of repeated keys into their first occurrence, outside the lock.
  FirstOccurrenceIndex first_occurrence;
  first_occurrence.Reset(count);
  std::vector<int64_t> distinct;  // Positions of each key's first occurrence, in order.
  distinct.reserve(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) {
    const int64_t first = first_occurrence.FindOrInsert(keys[j], j);
    if (first == j) {
      distinct.push_back(j);
      continue;
    }
    float* sum = grads + first * dim_;
    const float* grad = grads + j * dim_;
    for (int64_t d = 0; d < dim_; ++d) sum[d] += grad[d];
  }
  const int64_t num_distinct = static_cast<int64_t>(distinct.size());
  std::vector<float*> slots(static_cast<size_t>(num_slots_));
  absl::MutexLock lock(&stripe->mu);
  // A pipeline as in PullStripe: prefetch the hash slot kKeyAhead keys on, find (or create)
  // and prefetch this key's row, update the row found kRowLag keys back. The update count is
  // taken when the row is found (it shares the index entry's cache line). Rows are held as
  // indices: creating a row may move the arena and the index.
  absl::Status status;
  int64_t found = 0;  // Rows found so far; finding stops at the first error.
  struct Found {
    uint32_t row;
    uint32_t t;
  };
  Found ring[kRowRing];
  ScopedFlushDenormals flush;  // as every optimizer update (optimizer.h)
  for (int64_t i = 0;; ++i) {
    if (i < num_distinct && status.ok()) {
      if (i + kKeyAhead < num_distinct) {
        stripe->rows.Prefetch(keys[distinct[i + kKeyAhead]]);
      }
      absl::StatusOr<RowIndex::Entry*> entry = FindOrCreateRowLocked(stripe, keys[distinct[i]]);
      if (entry.ok()) {
        const uint32_t row = (*entry)->row;
        ring[i % kRowRing] = Found{row, RowIndex::CountUpdate(*entry)};
        PrefetchFloats(stripe->arena.data() + static_cast<size_t>(row) * stride_, stride_);
        ++found;
      } else {
        status = entry.status();
      }
    }
    const int64_t j = i - kRowLag;
    if (j >= found) break;
    if (j < 0) continue;
    const Found& row = ring[j % kRowRing];
    float* values = stripe->arena.data() + static_cast<size_t>(row.row) * stride_;
    for (int k = 0; k < num_slots_; ++k) slots[k] = values + (1 + k) * dim_;
    optimizer_->Apply(values, slots.data(), grads + distinct[j] * dim_, dim_, row.t);
  }
  return status;
}

void EmbeddingTable::Lookup(const int64_t* keys, int64_t n, std::vector<int64_t>* found,
                            std::vector<float>* rows, std::vector<int64_t>* missing) const {
  if (n <= 0) return;
  StripeGroups groups;
  GroupByStripe(keys, n, /*with_order=*/true, &groups);
  // Rows are gathered by stripe into `gathered` at their request position, then emitted in order.
  std::vector<float> gathered(static_cast<size_t>(n * dim_));
  std::vector<char> exists(static_cast<size_t>(n), 0);
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  for (int s = 0; s < kNumStripes; ++s) {
    const int64_t begin = groups.begin[s];
    const int64_t end = groups.begin[s + 1];
    if (begin == end) continue;
    const Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    for (int64_t j = begin; j < end; ++j) {
      const int64_t pos = groups.order[j];
      const uint32_t row = stripe.rows.Find(keys[pos]);
      if (row == RowIndex::kNoRow) continue;
      exists[pos] = 1;
      std::memcpy(gathered.data() + pos * dim_,
                  stripe.arena.data() + static_cast<size_t>(row) * stride_, row_bytes);
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
    rows += static_cast<int64_t>(stripes_[s].rows.size());
  }
  return rows;
}

int64_t EmbeddingTable::bytes() const {
  return num_rows() * (stride_ * static_cast<int64_t>(sizeof(float)) +
                       static_cast<int64_t>(sizeof(RowIndex::Entry)));
}

void EmbeddingTable::SampleHotKeys(const int64_t* keys, int64_t n) {
  if (n <= 0) return;
  // An evenly spaced sample, each key standing for `step` positions, so a 100k-key push costs
  // the sketch at most kHotKeySamplesPerPush updates. The offset changes from push to push so
  // that periodic key layouts are not always sampled at the same phase.
  const int64_t step = (n + kHotKeySamplesPerPush - 1) / kHotKeySamplesPerPush;
  absl::MutexLock lock(&hot_mu_);
  const int64_t offset = step == 1
                             ? 0
                             : static_cast<int64_t>(MixKey(static_cast<int64_t>(hot_pushes_)) %
                                                    static_cast<uint64_t>(step));
  ++hot_pushes_;
  for (int64_t pos = offset; pos < n; pos += step) CountHotKeyLocked(keys[pos], step);
}

void EmbeddingTable::CountHotKeyLocked(int64_t key, int64_t weight) {
  auto it = hot_counts_.find(key);
  if (it != hot_counts_.end()) {
    it->second += weight;
    return;
  }
  if (hot_counts_.size() < static_cast<size_t>(kHotKeyCounters)) {
    hot_counts_.emplace(key, weight);
    return;
  }
  // Space-Saving: the new key replaces the smallest counter and inherits its count, so a
  // count over-estimates by at most that inherited amount.
  auto min_it = hot_counts_.begin();
  for (auto candidate = hot_counts_.begin(); candidate != hot_counts_.end(); ++candidate) {
    if (candidate->second < min_it->second ||
        (candidate->second == min_it->second && candidate->first < min_it->first)) {
      min_it = candidate;
    }
  }
  const int64_t inherited = min_it->second;
  hot_counts_.erase(min_it);
  hot_counts_.emplace(key, inherited + weight);
}

std::vector<v1::HotKey> EmbeddingTable::HotKeys(int k) const {
  if (k <= 0) return {};
  std::vector<std::pair<int64_t, int64_t>> counts;  // (key, count)
  {
    absl::MutexLock lock(&hot_mu_);
    counts.assign(hot_counts_.begin(), hot_counts_.end());
  }
  std::sort(counts.begin(), counts.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (counts.size() > static_cast<size_t>(k)) counts.resize(static_cast<size_t>(k));
  std::vector<v1::HotKey> hot(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    hot[i].set_key(counts[i].first);
    hot[i].set_count(counts[i].second);
  }
  return hot;
}

void EmbeddingTable::ComputeValueStats(v1::ValueStats* stats) const {
  FloatStats all;
  for (int s = 0; s < kNumStripes; ++s) {
    const Stripe& stripe = stripes_[s];
    absl::ReaderMutexLock lock(&stripe.mu);
    const size_t num_rows = stripe.rows.size();
    for (size_t row = 0; row < num_rows; ++row) all.Add(stripe.arena.data() + row * stride_, dim_);
  }
  all.Fill(stats);
}

void EmbeddingTable::ForEachRow(
    const std::function<void(int64_t key, const float* values_and_slots, int64_t t)>& fn) const {
  std::vector<int64_t> key_of_row;
  std::vector<float> arena;
  std::vector<uint32_t> count_of_row;
  for (int s = 0; s < kNumStripes; ++s) {
    const Stripe& stripe = stripes_[s];
    {
      // Copy, so that fn runs with no lock held.
      absl::ReaderMutexLock lock(&stripe.mu);
      key_of_row.resize(stripe.rows.size());
      count_of_row.resize(stripe.rows.size());
      stripe.rows.ForEach([&](const RowIndex::Entry& entry) {
        key_of_row[entry.row] = entry.key;
        count_of_row[entry.row] = entry.count;
      });
      arena.assign(stripe.arena.begin(), stripe.arena.end());
    }
    for (size_t row = 0; row < key_of_row.size(); ++row) {
      fn(key_of_row[row], arena.data() + row * stride_, count_of_row[row]);
    }
  }
}

void EmbeddingTable::Clear() {
  for (int s = 0; s < kNumStripes; ++s) {
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    stripe.rows = RowIndex();
    std::vector<float, CacheLineAllocator<float>>().swap(stripe.arena);
  }
}

absl::Status EmbeddingTable::InsertRow(int64_t key, const float* values_and_slots, int64_t t) {
  if (!OwnsKey(key)) return NotOwnedError(key);
  if (t < 0) {
    return absl::InvalidArgumentError(absl::StrCat("table ", spec_.name(), ": row of key ", key,
                                                   " has negative update count ", t));
  }
  Stripe& stripe = stripes_[StripeOfKey(key)];
  absl::MutexLock lock(&stripe.mu);
  RowIndex::Entry* entry = stripe.rows.FindEntry(key);
  if (entry == nullptr) {
    // Not initialized: the row is overwritten below.
    PS_ASSIGN_OR_RETURN(entry, AppendRowLocked(&stripe, key, /*initialize=*/false));
  }
  std::memcpy(stripe.arena.data() + static_cast<size_t>(entry->row) * stride_, values_and_slots,
              static_cast<size_t>(stride_) * sizeof(float));
  entry->count = static_cast<uint32_t>(std::min<int64_t>(t, RowIndex::kMaxCount));
  return absl::OkStatus();
}

}  // namespace pscluster
