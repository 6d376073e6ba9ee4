#include "ps_server/embedding_table.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/memory/memory.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "ps_server/float_stats.h"
#include "ps_server/initializer.h"
#include "sharding/sparse_hash.h"

namespace pscluster {
namespace {

// MurmurHash3's 64-bit finalizer, for choosing stripes. Deliberately not splitmix64 (which
// VirtualShardOfKey uses): the keys a task owns share their virtual-shard hash residues, and a
// stripe hash built from the same mix could put all of them in a few stripes.
uint64_t Mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// The stripe of a key: the top 6 bits of its mix.
int StripeOfKey(int64_t key) {
  static_assert(EmbeddingTable::kNumStripes == 64, "StripeOfKey takes the top 6 bits");
  return static_cast<int>(Mix64(static_cast<uint64_t>(key)) >> 58);
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
    for (size_t i = Mix64(static_cast<uint64_t>(key)) & mask_;; i = (i + 1) & mask_) {
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

absl::Status WithTablePrefix(const std::string& table, const absl::Status& status) {
  return absl::Status(status.code(), absl::StrCat("table ", table, ": ", status.message()));
}

}  // namespace

constexpr int EmbeddingTable::kNumStripes;
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

absl::StatusOr<uint32_t> EmbeddingTable::FindOrAppendRowLocked(Stripe* stripe, int64_t key,
                                                               bool* appended) {
  const size_t new_row = stripe->update_counts.size();
  auto [it, inserted] = stripe->row_of.try_emplace(key, static_cast<uint32_t>(new_row));
  *appended = inserted;
  if (!inserted) return it->second;
  if (new_row >= std::numeric_limits<uint32_t>::max()) {
    stripe->row_of.erase(it);
    *appended = false;
    return absl::ResourceExhaustedError(
        absl::StrCat("table ", spec_.name(), ": cannot create the row of key ", key,
                     ": its stripe already holds ", new_row, " rows"));
  }
  stripe->arena.resize((new_row + 1) * static_cast<size_t>(stride_));
  stripe->update_counts.push_back(0);
  return static_cast<uint32_t>(new_row);
}

absl::StatusOr<uint32_t> EmbeddingTable::FindOrCreateRowLocked(Stripe* stripe, int64_t key) {
  bool appended;
  PS_ASSIGN_OR_RETURN(const uint32_t row, FindOrAppendRowLocked(stripe, key, &appended));
  if (!appended) return row;
  float* values = stripe->arena.data() + static_cast<size_t>(row) * stride_;
  absl::Status status = InitializeRow(spec_.initializer(), spec_.name(), key, dim_, values);
  if (!status.ok()) {
    // Undo the append (it is the stripe's last row).
    stripe->row_of.erase(key);
    stripe->arena.resize(static_cast<size_t>(row) * stride_);
    stripe->update_counts.pop_back();
    return WithTablePrefix(spec_.name(), status);
  }
  for (int s = 0; s < num_slots_; ++s) {
    std::fill_n(values + (1 + s) * dim_, dim_, optimizer_->slot_initial_value(s));
  }
  return row;
}

absl::Status EmbeddingTable::Pull(const int64_t* keys, int64_t n, float* out) {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec_.name(), ": pull of ", n, " keys"));
  }
  PS_RETURN_IF_ERROR(CheckOwned(keys, n));
  if (n == 0) return absl::OkStatus();
  StripeGroups groups;
  GroupByStripe(keys, n, /*with_order=*/true, &groups);
  const size_t row_bytes = static_cast<size_t>(dim_) * sizeof(float);
  std::vector<int64_t> absent;
  for (int s = 0; s < kNumStripes; ++s) {
    const int64_t begin = groups.begin[s];
    const int64_t end = groups.begin[s + 1];
    if (begin == end) continue;
    Stripe& stripe = stripes_[s];
    absent.clear();
    {
      // Rows that exist are copied under the shared lock, so pulls do not block each other.
      absl::ReaderMutexLock lock(&stripe.mu);
      for (int64_t j = begin; j < end; ++j) {
        const int64_t pos = groups.order[j];
        auto it = stripe.row_of.find(keys[pos]);
        if (it == stripe.row_of.end()) {
          absent.push_back(pos);
          continue;
        }
        std::memcpy(out + pos * dim_,
                    stripe.arena.data() + static_cast<size_t>(it->second) * stride_, row_bytes);
      }
    }
    if (absent.empty()) continue;
    // Another thread may create some of these rows in between; FindOrCreate handles it.
    absl::MutexLock lock(&stripe.mu);
    for (int64_t pos : absent) {
      PS_ASSIGN_OR_RETURN(const uint32_t row, FindOrCreateRowLocked(&stripe, keys[pos]));
      std::memcpy(out + pos * dim_, stripe.arena.data() + static_cast<size_t>(row) * stride_,
                  row_bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingTable::CheckPush(const int64_t* keys, int64_t n, const float* grads,
                                       bool allow_non_finite) const {
  if (n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("table ", spec_.name(), ": push of ", n, " keys"));
  }
  PS_RETURN_IF_ERROR(CheckOwned(keys, n));
  if (!allow_non_finite) {
    const int64_t bad = FindNonFinite(grads, n * dim_);
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
                                  bool allow_non_finite) {
  PS_RETURN_IF_ERROR(CheckPush(keys, n, grads, allow_non_finite));
  return ApplyPush(keys, n, grads);
}

absl::Status EmbeddingTable::ApplyPush(const int64_t* keys, int64_t n, const float* grads) {
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
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = next[groups.stripe_of[i]]++;
      sorted_keys[j] = keys[i];
      std::copy_n(grads + i * dim_, dim_, sorted_grads.data() + j * dim_);
    }
  }
  FirstOccurrenceIndex first_occurrence;
  std::vector<int64_t> distinct;  // Positions, in sorted order, of each key's first occurrence.
  std::vector<float*> slots(static_cast<size_t>(num_slots_));
  for (int s = 0; s < kNumStripes; ++s) {
    const int64_t begin = groups.begin[s];
    const int64_t end = groups.begin[s + 1];
    if (begin == end) continue;
    first_occurrence.Reset(end - begin);
    distinct.clear();
    for (int64_t j = begin; j < end; ++j) {
      const int64_t first = first_occurrence.FindOrInsert(sorted_keys[j], j);
      if (first == j) {
        distinct.push_back(j);
        continue;
      }
      float* sum = sorted_grads.data() + first * dim_;
      const float* grad = sorted_grads.data() + j * dim_;
      for (int64_t d = 0; d < dim_; ++d) sum[d] += grad[d];
    }
    Stripe& stripe = stripes_[s];
    absl::MutexLock lock(&stripe.mu);
    for (int64_t j : distinct) {
      PS_ASSIGN_OR_RETURN(const uint32_t row, FindOrCreateRowLocked(&stripe, sorted_keys[j]));
      float* values = stripe.arena.data() + static_cast<size_t>(row) * stride_;
      for (int k = 0; k < num_slots_; ++k) slots[k] = values + (1 + k) * dim_;
      const int64_t t = ++stripe.update_counts[row];
      optimizer_->Apply(values, slots.data(), sorted_grads.data() + j * dim_, dim_, t);
    }
  }
  SampleHotKeys(keys, n);
  return absl::OkStatus();
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
      auto it = stripe.row_of.find(keys[pos]);
      if (it == stripe.row_of.end()) continue;
      exists[pos] = 1;
      std::memcpy(gathered.data() + pos * dim_,
                  stripe.arena.data() + static_cast<size_t>(it->second) * stride_, row_bytes);
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
    rows += static_cast<int64_t>(stripes_[s].row_of.size());
  }
  return rows;
}

int64_t EmbeddingTable::bytes() const {
  return num_rows() *
         (stride_ * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(sizeof(int64_t)));
}

void EmbeddingTable::SampleHotKeys(const int64_t* keys, int64_t n) {
  if (n <= 0) return;
  // An evenly spaced sample, each key standing for `step` positions, so a 100k-key push costs
  // the sketch at most kHotKeySamplesPerPush updates. The offset changes from push to push so
  // that periodic key layouts are not always sampled at the same phase.
  const int64_t step = (n + kHotKeySamplesPerPush - 1) / kHotKeySamplesPerPush;
  absl::MutexLock lock(&hot_mu_);
  const int64_t offset =
      step == 1 ? 0 : static_cast<int64_t>(Mix64(hot_pushes_) % static_cast<uint64_t>(step));
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
    const size_t num_rows = stripe.update_counts.size();
    for (size_t row = 0; row < num_rows; ++row) all.Add(stripe.arena.data() + row * stride_, dim_);
  }
  all.Fill(stats);
}

void EmbeddingTable::ForEachRow(
    const std::function<void(int64_t key, const float* values_and_slots, int64_t t)>& fn) const {
  std::vector<int64_t> key_of_row;
  std::vector<float> arena;
  std::vector<int64_t> update_counts;
  for (int s = 0; s < kNumStripes; ++s) {
    const Stripe& stripe = stripes_[s];
    {
      // Copy, so that fn runs with no lock held.
      absl::ReaderMutexLock lock(&stripe.mu);
      key_of_row.resize(stripe.update_counts.size());
      for (const auto& [key, row] : stripe.row_of) key_of_row[row] = key;
      arena = stripe.arena;
      update_counts = stripe.update_counts;
    }
    for (size_t row = 0; row < key_of_row.size(); ++row) {
      fn(key_of_row[row], arena.data() + row * stride_, update_counts[row]);
    }
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
  bool appended;  // Either way, the row is overwritten below.
  PS_ASSIGN_OR_RETURN(const uint32_t row, FindOrAppendRowLocked(&stripe, key, &appended));
  std::memcpy(stripe.arena.data() + static_cast<size_t>(row) * stride_, values_and_slots,
              static_cast<size_t>(stride_) * sizeof(float));
  stripe.update_counts[row] = t;
  return absl::OkStatus();
}

}  // namespace pscluster
