#include "model/data/shard.h"

#include <algorithm>
#include <numeric>
#include <random>

#include "absl/types/span.h"
#include "glog/logging.h"
#include "model/data/seeded_random.h"

namespace pscluster {

Dataset ShardDataset(const Dataset& all, int index, int count) {
  CHECK_GE(count, 1) << "shard count";
  CHECK(index >= 0 && index < count) << "shard index " << index << " of " << count;
  std::vector<int64_t> positions;
  positions.reserve(static_cast<size_t>(all.num_examples / count + 1));
  for (int64_t p = index; p < all.num_examples; p += count) positions.push_back(p);
  Dataset shard;
  SelectExamples(all, positions, &shard);
  return shard;
}

BatchIterator::BatchIterator(const Dataset* data, int batch_size, uint64_t seed,
                             bool drop_remainder)
    : data_(data), batch_size_(batch_size), seed_(seed), drop_remainder_(drop_remainder) {
  CHECK(data_ != nullptr);
  CHECK_GE(batch_size_, 1) << "batch_size";
}

void BatchIterator::StartEpoch(int64_t epoch) {
  order_.resize(static_cast<size_t>(data_->num_examples));
  std::iota(order_.begin(), order_.end(), int64_t{0});
  std::mt19937_64 rng(CombineSeeds(seed_, static_cast<uint64_t>(epoch)));
  FisherYatesShuffle(&order_, &rng);
  next_ = 0;
  epoch_ = epoch;
  started_ = true;
}

void BatchIterator::Seek(int64_t epoch, int64_t batch) {
  CHECK(batch >= 0 && batch < batches_per_epoch())
      << "batch " << batch << " of " << batches_per_epoch();
  if (!started_ || epoch_ != epoch) StartEpoch(epoch);
  next_ = static_cast<size_t>(batch) * static_cast<size_t>(batch_size_);
}

bool BatchIterator::Next(Dataset* batch) {
  CHECK(started_) << "BatchIterator::Next before StartEpoch";
  CHECK(batch != nullptr);
  const size_t remaining = order_.size() - next_;
  if (remaining == 0) return false;
  const size_t size = std::min(remaining, static_cast<size_t>(batch_size_));
  if (drop_remainder_ && size < static_cast<size_t>(batch_size_)) {
    next_ = order_.size();
    return false;
  }
  SelectExamples(*data_, absl::MakeConstSpan(order_.data() + next_, size), batch);
  next_ += size;
  return true;
}

int64_t BatchIterator::batches_per_epoch() const {
  const int64_t n = data_->num_examples;
  return drop_remainder_ ? n / batch_size_ : (n + batch_size_ - 1) / batch_size_;
}

}  // namespace pscluster
