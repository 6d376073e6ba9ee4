#include "model/data/shard.h"

#include <algorithm>
#include <numeric>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/data/dataset.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;

// n examples where example p has label p, dense row {p, -p} and sparse ids {p} (none for odd p),
// so that any selection can be traced back to positions.
Dataset Numbered(int64_t n) {
  Dataset data;
  data.num_examples = n;
  data.dense_dim = 2;
  data.num_classes = static_cast<int>(std::max<int64_t>(n, 2));
  data.sparse_offsets.push_back(0);
  for (int64_t p = 0; p < n; ++p) {
    data.dense.push_back(static_cast<float>(p));
    data.dense.push_back(static_cast<float>(-p));
    if (p % 2 == 0) data.sparse_ids.push_back(1000 + p);
    data.sparse_offsets.push_back(static_cast<int64_t>(data.sparse_ids.size()));
    data.labels.push_back(static_cast<float>(p));
  }
  return data;
}

std::vector<int64_t> Positions(const Dataset& data) {
  std::vector<int64_t> out;
  for (const float label : data.labels) out.push_back(static_cast<int64_t>(label));
  return out;
}

// Every example of a selection is intact: the dense row and the sparse ids of its position.
void ExpectIntact(const Dataset& selection) {
  ASSERT_TRUE(ValidateDataset(selection).ok()) << ValidateDataset(selection);
  for (int64_t i = 0; i < selection.num_examples; ++i) {
    const int64_t p = static_cast<int64_t>(selection.labels[i]);
    EXPECT_EQ(selection.dense[2 * i], p);
    EXPECT_EQ(selection.dense[2 * i + 1], -p);
    const std::vector<int64_t> ids(selection.sparse_ids.begin() + selection.sparse_offsets[i],
                                   selection.sparse_ids.begin() + selection.sparse_offsets[i + 1]);
    if (p % 2 == 0) {
      EXPECT_THAT(ids, ElementsAre(1000 + p));
    } else {
      EXPECT_TRUE(ids.empty());
    }
  }
}

TEST(ShardDatasetTest, ShardsAreDisjointCoverEverythingAndBalanced) {
  const Dataset all = Numbered(23);
  for (int count = 1; count <= 7; ++count) {
    std::vector<int64_t> seen;
    int64_t smallest = all.num_examples, largest = 0;
    for (int index = 0; index < count; ++index) {
      const Dataset shard = ShardDataset(all, index, count);
      ExpectIntact(shard);
      const std::vector<int64_t> positions = Positions(shard);
      for (size_t k = 0; k < positions.size(); ++k) {
        EXPECT_EQ(positions[k], index + static_cast<int64_t>(k) * count);
      }
      seen.insert(seen.end(), positions.begin(), positions.end());
      smallest = std::min(smallest, shard.num_examples);
      largest = std::max(largest, shard.num_examples);
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> everything(all.num_examples);
    std::iota(everything.begin(), everything.end(), 0);
    EXPECT_EQ(seen, everything) << "count " << count;  // Disjoint and covering.
    EXPECT_LE(largest - smallest, 1) << "count " << count;
  }
}

TEST(ShardDatasetTest, MoreShardsThanExamplesGivesEmptyShards) {
  const Dataset all = Numbered(2);
  const Dataset shard = ShardDataset(all, 3, 4);
  EXPECT_EQ(shard.num_examples, 0);
  EXPECT_TRUE(ValidateDataset(shard).ok());
}

std::vector<int64_t> EpochOrder(BatchIterator* batches, int64_t epoch,
                                std::vector<int64_t>* batch_sizes = nullptr) {
  batches->StartEpoch(epoch);
  std::vector<int64_t> order;
  Dataset batch;
  while (batches->Next(&batch)) {
    ExpectIntact(batch);
    if (batch_sizes != nullptr) batch_sizes->push_back(batch.num_examples);
    const std::vector<int64_t> positions = Positions(batch);
    order.insert(order.end(), positions.begin(), positions.end());
  }
  EXPECT_FALSE(batches->Next(&batch));  // Stays at the end.
  return order;
}

TEST(BatchIteratorTest, EveryExampleOncePerEpochInBatches) {
  const Dataset data = Numbered(23);
  BatchIterator batches(&data, 5, /*seed=*/9);
  EXPECT_EQ(batches.batches_per_epoch(), 5);
  std::vector<int64_t> sizes;
  std::vector<int64_t> order = EpochOrder(&batches, 0, &sizes);
  EXPECT_THAT(sizes, ElementsAre(5, 5, 5, 5, 3));
  EXPECT_EQ(order, batches.epoch_order());
  std::sort(order.begin(), order.end());
  std::vector<int64_t> everything(23);
  std::iota(everything.begin(), everything.end(), 0);
  EXPECT_EQ(order, everything);
}

TEST(BatchIteratorTest, DropRemainderSkipsTheShortBatch) {
  const Dataset data = Numbered(23);
  BatchIterator batches(&data, 5, /*seed=*/9, /*drop_remainder=*/true);
  EXPECT_EQ(batches.batches_per_epoch(), 4);
  std::vector<int64_t> sizes;
  const std::vector<int64_t> order = EpochOrder(&batches, 0, &sizes);
  EXPECT_THAT(sizes, ElementsAre(5, 5, 5, 5));
  EXPECT_EQ(std::set<int64_t>(order.begin(), order.end()).size(), 20u);
}

TEST(BatchIteratorTest, OrderDependsOnlyOnSeedAndEpoch) {
  const Dataset data = Numbered(100);
  BatchIterator a(&data, 7, /*seed=*/1);
  BatchIterator b(&data, 13, /*seed=*/1);  // The batch size does not change the order.
  BatchIterator other_seed(&data, 7, /*seed=*/2);
  const std::vector<int64_t> a0 = EpochOrder(&a, 0);
  const std::vector<int64_t> a1 = EpochOrder(&a, 1);
  EXPECT_NE(a0, a1);
  EXPECT_EQ(EpochOrder(&b, 1), a1);  // Epochs can be visited in any order.
  EXPECT_EQ(EpochOrder(&b, 0), a0);
  EXPECT_EQ(EpochOrder(&a, 0), a0);  // Restarting an epoch repeats it.
  EXPECT_NE(EpochOrder(&other_seed, 0), a0);
  std::vector<int64_t> identity(100);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_NE(a0, identity);
}

TEST(BatchIteratorTest, StartEpochMidwayRestarts) {
  const Dataset data = Numbered(10);
  BatchIterator batches(&data, 4, /*seed=*/3);
  batches.StartEpoch(0);
  Dataset batch;
  ASSERT_TRUE(batches.Next(&batch));
  EXPECT_EQ(EpochOrder(&batches, 0).size(), 10u);
}

// Seek(e, b) gives exactly the b-th batch of epoch e of a sequential pass, in any order of
// seeks (how a sync worker finds the batch of a global step, also after a rewind).
TEST(BatchIteratorTest, SeekGivesTheSameBatchAsTheSequentialPass) {
  const Dataset data = Numbered(23);
  BatchIterator sequential(&data, 5, /*seed=*/4);
  std::vector<std::vector<int64_t>> expected;  // [epoch * 5 + batch]
  for (int epoch = 0; epoch < 2; ++epoch) {
    sequential.StartEpoch(epoch);
    Dataset batch;
    while (sequential.Next(&batch)) expected.push_back(Positions(batch));
  }
  ASSERT_EQ(expected.size(), 10u);
  BatchIterator seeking(&data, 5, /*seed=*/4);
  EXPECT_EQ(seeking.epoch(), -1);
  for (int64_t step : {7, 2, 9, 0, 4, 5, 5, 3}) {
    seeking.Seek(step / 5, step % 5);
    EXPECT_EQ(seeking.epoch(), step / 5);
    EXPECT_EQ(seeking.next_batch(), step % 5);
    Dataset batch;
    ASSERT_TRUE(seeking.Next(&batch));
    EXPECT_EQ(Positions(batch), expected[step]) << "step " << step;
    ExpectIntact(batch);
  }
}

TEST(BatchIteratorTest, EmptyDatasetHasNoBatches) {
  const Dataset data;
  BatchIterator batches(&data, 4, /*seed=*/3);
  EXPECT_EQ(batches.batches_per_epoch(), 0);
  batches.StartEpoch(0);
  Dataset batch;
  EXPECT_FALSE(batches.Next(&batch));
}

TEST(BatchIteratorDeathTest, NextBeforeStartEpochIsAProgrammerError) {
  const Dataset data = Numbered(3);
  BatchIterator batches(&data, 2, /*seed=*/3);
  Dataset batch;
  EXPECT_DEATH(batches.Next(&batch), "before StartEpoch");
}

TEST(ShardDatasetDeathTest, IndexOutOfRangeIsAProgrammerError) {
  const Dataset data = Numbered(3);
  EXPECT_DEATH(ShardDataset(data, 2, 2), "shard index 2 of 2");
}

}  // namespace
}  // namespace pscluster
