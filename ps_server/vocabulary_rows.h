#ifndef PSCLUSTER_PS_SERVER_VOCABULARY_ROWS_H_
#define PSCLUSTER_PS_SERVER_VOCABULARY_ROWS_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "sharding/sparse_hash.h"

namespace pscluster {

// The rows of a vocabulary table (model.proto's TableSpec.vocabulary_size > 0) on one ps task,
// numbered by key instead of found through an index: the storage EmbeddingTable uses for such
// a table. A key's virtual shard is the key mod num_virtual_shards (VirtualShardOfTableKey);
// the owned shards, in order, take turns over the table's lock stripes (the i-th goes to stripe
// i mod num_stripes, so every stripe has shards whatever the number of tasks), and each
// stripe's shards lie together: shard v's ceil(vocabulary_size / num_virtual_shards) rows start
// at its base row, and stripe s holds rows [FirstRow(s), EndRow(s)). The row of key k is its
// shard's base + k / num_virtual_shards.
//
// Each row has `stride` floats (the values, then the optimizer's slots) and a count: 0 until
// the row is created, then 1 + its update count. Both come from HugePagePool, reserved whole
// when allocated; the counts start at 0 and the floats are written when a row is created.
//
// Thread-compatible: the table's stripe locks guard the rows and counts of their keys.
class VocabularyRows {
 public:
  // None: a hashed table's.
  VocabularyRows() = default;
  VocabularyRows(const VocabularyRows&) = delete;
  VocabularyRows& operator=(const VocabularyRows&) = delete;
  ~VocabularyRows();

  // Lays out and reserves the rows of the shards v with owned[v] (owned.size() virtual shards)
  // of a vocabulary of `vocabulary_size` ids, `stride` floats each, over `num_stripes` stripes
  // (at most 256). False if the memory cannot be allocated (then size() rows are laid out but
  // none is usable). REQUIRES: called once, vocabulary_size > 0.
  bool Allocate(int64_t vocabulary_size, const std::vector<bool>& owned, int64_t stride,
                int num_stripes);

  // The rows reserved: every row of every owned shard.
  int64_t size() const { return num_rows_; }
  // Whether every row laid out has its memory: true for none (a hashed table's) and after an
  // Allocate that succeeded, false after one that failed.
  bool usable() const { return num_rows_ == 0 || counts_ != nullptr; }

  // REQUIRES for the key functions: the key is in [0, vocabulary_size) and its shard owned.
  int32_t Shard(int64_t key) const {
    return VirtualShardOfTableKey(key, vocabulary_size_, num_virtual_shards_);
  }
  int StripeOf(int64_t key) const { return stripe_of_shard_[static_cast<size_t>(Shard(key))]; }
  int64_t Row(int64_t key) const {
    const int64_t quotient = shard_shift_ >= 0 ? key >> shard_shift_ : key / num_virtual_shards_;
    return base_of_shard_[static_cast<size_t>(Shard(key))] + quotient;
  }
  // log2(num_virtual_shards) when it is a power of two (a key's shard is then key & (n - 1)),
  // else -1; and the stripe of each virtual shard (0 for one not owned): for a caller that
  // groups many keys by stripe without a call per key.
  int shard_shift() const { return shard_shift_; }
  const uint8_t* stripe_of_shard() const { return stripe_of_shard_.data(); }

  float* Values(int64_t row) const { return values_ + row * stride_; }
  uint32_t& Count(int64_t row) const { return counts_[row]; }
  int64_t FirstRow(int stripe) const { return stripe_first_row_[static_cast<size_t>(stripe)]; }
  int64_t EndRow(int stripe) const { return stripe_first_row_[static_cast<size_t>(stripe) + 1]; }

  // Calls fn(key, row) for every created row of `stripe`, in row order.
  template <typename Fn>
  void ForEachCreated(int stripe, Fn fn) const {
    for (int64_t row = FirstRow(stripe); row < EndRow(stripe); ++row) {
      if (counts_[row] == 0) continue;
      const int64_t shard = shard_at_[static_cast<size_t>(row / rows_per_shard_)];
      fn((row % rows_per_shard_) * num_virtual_shards_ + shard, row);
    }
  }
  // Marks every row of `stripe` not created.
  void ClearStripe(int stripe);

 private:
  int64_t vocabulary_size_ = 0;
  int32_t num_virtual_shards_ = 1;
  int64_t stride_ = 0;
  int shard_shift_ = -1;
  int64_t rows_per_shard_ = 0;             // ceil(vocabulary_size_ / num_virtual_shards_)
  std::vector<int64_t> base_of_shard_;     // -1 for a shard not owned
  std::vector<uint8_t> stripe_of_shard_;   // 0 for a shard not owned
  std::vector<int32_t> shard_at_;          // the owned shards, in row order
  std::vector<int64_t> stripe_first_row_;  // num_stripes + 1 of them
  int64_t num_rows_ = 0;                   // shard_at_.size() * rows_per_shard_
  float* values_ = nullptr;                // num_rows_ * stride_ floats
  uint32_t* counts_ = nullptr;             // num_rows_ counts
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_VOCABULARY_ROWS_H_
