#ifndef PSCLUSTER_MODEL_DATA_SHARD_H_
#define PSCLUSTER_MODEL_DATA_SHARD_H_

#include <cstdint>
#include <vector>

#include "model/data/dataset.h"

namespace pscluster {

// The examples of worker `index` of `count`: those whose position p satisfies
// p % count == index, in their original order. The shards of index 0..count-1 are disjoint,
// together hold every example once, and their sizes differ by at most 1.
// REQUIRES: count >= 1, 0 <= index < count (checked); `all` is valid.
Dataset ShardDataset(const Dataset& all, int index, int count);

// Batches over a dataset for one epoch at a time: the order is a permutation of [0, n) that
// depends only on (seed, epoch) (and n), the same on every run and platform (a Fisher-Yates
// shuffle driven by std::mt19937_64; see seeded_random.h).
//
// Lifecycle: constructed -> StartEpoch(e) -> Next()... until it returns false ->
// StartEpoch(e') -> ... . StartEpoch may also be called in the middle of an epoch, which
// abandons it.
//
// Typical use, with each worker shuffling its own shard:
//   Dataset shard = ShardDataset(all, task_index, num_workers);
//   BatchIterator batches(&shard, 256, /*seed=*/42);
//   for (int64_t epoch = 0; epoch < num_epochs; ++epoch) {
//     batches.StartEpoch(epoch);
//     Dataset batch;
//     while (batches.Next(&batch)) Train(batch);
//   }
//
// Thread-compatible: one thread at a time, or external synchronization.
class BatchIterator {
 public:
  // `data` is not owned and must outlive the iterator, unchanged.
  // REQUIRES: data != nullptr, batch_size >= 1 (checked).
  BatchIterator(const Dataset* data, int batch_size, uint64_t seed, bool drop_remainder = false);

  BatchIterator(const BatchIterator&) = delete;
  BatchIterator& operator=(const BatchIterator&) = delete;

  // Starts epoch `epoch` (any value, e.g. 0, 1, 2, ...) from its first batch.
  void StartEpoch(int64_t epoch);

  // Positions the iterator at batch `batch` (0-based) of epoch `epoch`: the next Next returns
  // it. The epoch's order is computed again only when the epoch changes. Sync training uses
  // it to give global step s the same batch on every run, also after a recovery goes back.
  // REQUIRES: 0 <= batch < batches_per_epoch() (checked).
  void Seek(int64_t epoch, int64_t batch);

  // Fills *batch with the next batch (fewer than batch_size at the end unless drop_remainder,
  // which skips a final short batch); returns false at the end of the epoch, leaving *batch
  // unchanged. Reuses the capacity of *batch's vectors.
  // REQUIRES: StartEpoch has been called (checked); batch != nullptr.
  bool Next(Dataset* batch);

  // Batches per epoch: ceil(n / batch_size), or floor with drop_remainder.
  int64_t batches_per_epoch() const;
  // The current epoch (-1 before StartEpoch) and the index of the batch Next returns next.
  int64_t epoch() const { return started_ ? epoch_ : -1; }
  int64_t next_batch() const { return static_cast<int64_t>(next_ / batch_size_); }

  // The current epoch's order: positions into the dataset, in the order Next returns them.
  // Empty before the first StartEpoch.
  const std::vector<int64_t>& epoch_order() const { return order_; }

 private:
  const Dataset* const data_;  // Not owned.
  const int batch_size_;
  const uint64_t seed_;
  const bool drop_remainder_;
  bool started_ = false;
  int64_t epoch_ = 0;
  std::vector<int64_t> order_;
  size_t next_ = 0;  // Index into order_ of the next batch's first example.
};

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_SHARD_H_
