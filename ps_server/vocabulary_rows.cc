#include "ps_server/vocabulary_rows.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "common/huge_page_pool.h"

namespace pscluster {

VocabularyRows::~VocabularyRows() {
  HugePagePool::Default().Free(values_, static_cast<size_t>(num_rows_ * stride_) * sizeof(float));
  HugePagePool::Default().Free(counts_, static_cast<size_t>(num_rows_) * sizeof(uint32_t));
}

bool VocabularyRows::Allocate(int64_t vocabulary_size, const std::vector<bool>& owned,
                              int64_t stride, int num_stripes) {
  vocabulary_size_ = vocabulary_size;
  num_virtual_shards_ = static_cast<int32_t>(owned.size());
  stride_ = stride;
  const size_t n = owned.size();
  if ((n & (n - 1)) == 0) {
    shard_shift_ = 0;
    while ((size_t{1} << shard_shift_) < n) ++shard_shift_;
  }
  rows_per_shard_ = (vocabulary_size_ + num_virtual_shards_ - 1) / num_virtual_shards_;
  std::vector<int32_t> owned_shards;
  for (size_t v = 0; v < n; ++v) {
    if (owned[v]) owned_shards.push_back(static_cast<int32_t>(v));
  }
  base_of_shard_.assign(n, -1);
  stripe_of_shard_.assign(n, 0);
  stripe_first_row_.assign(static_cast<size_t>(num_stripes) + 1, 0);
  for (int s = 0; s < num_stripes; ++s) {
    stripe_first_row_[static_cast<size_t>(s)] =
        static_cast<int64_t>(shard_at_.size()) * rows_per_shard_;
    for (size_t i = static_cast<size_t>(s); i < owned_shards.size();
         i += static_cast<size_t>(num_stripes)) {
      const size_t v = static_cast<size_t>(owned_shards[i]);
      base_of_shard_[v] = static_cast<int64_t>(shard_at_.size()) * rows_per_shard_;
      stripe_of_shard_[v] = static_cast<uint8_t>(s);
      shard_at_.push_back(owned_shards[i]);
    }
  }
  num_rows_ = static_cast<int64_t>(shard_at_.size()) * rows_per_shard_;
  stripe_first_row_[static_cast<size_t>(num_stripes)] = num_rows_;
  if (num_rows_ == 0) return true;
  try {
    values_ = static_cast<float*>(
        HugePagePool::Default().Allocate(static_cast<size_t>(num_rows_ * stride_) * sizeof(float)));
    counts_ = static_cast<uint32_t*>(
        HugePagePool::Default().Allocate(static_cast<size_t>(num_rows_) * sizeof(uint32_t)));
  } catch (const std::bad_alloc&) {
    HugePagePool::Default().Free(values_, static_cast<size_t>(num_rows_ * stride_) * sizeof(float));
    values_ = nullptr;
    counts_ = nullptr;
    return false;
  }
  std::memset(counts_, 0, static_cast<size_t>(num_rows_) * sizeof(uint32_t));
  return true;
}

void VocabularyRows::ClearStripe(int stripe) {
  std::fill(counts_ + FirstRow(stripe), counts_ + EndRow(stripe), 0);
}

}  // namespace pscluster
