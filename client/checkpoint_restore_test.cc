// Checkpoints written by 2 ps tasks restore into 1 and 3: dense partitions and optimizer slots
// re-split, sparse rows re-hashed to their new owners. Real RocksDB files; the ps tasks are the
// in-process fake over ParameterStore.
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "client/parameter_client.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/in_process_ps_transport.h"
#include "sharding/placement.h"
#include "storage/checkpoint.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

v1::ModelSpec Model() {
  v1::ModelSpec model;
  v1::VariableSpec* w = model.add_variables();
  w->set_name("w");
  w->mutable_shape()->add_dims(10);
  w->mutable_shape()->add_dims(3);
  w->mutable_initializer()->set_kind(v1::InitializerSpec::NORMAL);
  w->mutable_initializer()->set_stddev(1);
  w->mutable_optimizer()->mutable_adam()->set_learning_rate(0.1f);
  v1::VariableSpec* b = model.add_variables();
  b->set_name("b");
  b->mutable_shape()->add_dims(3);
  b->mutable_optimizer()->mutable_momentum()->set_learning_rate(0.1f);
  b->mutable_optimizer()->mutable_momentum()->set_momentum(0.9f);
  v1::TableSpec* t = model.add_tables();
  t->set_name("emb");
  t->set_dim(4);
  t->mutable_initializer()->set_kind(v1::InitializerSpec::UNIFORM);
  t->mutable_initializer()->set_min(-1);
  t->mutable_initializer()->set_max(1);
  t->mutable_optimizer()->mutable_adagrad()->set_learning_rate(0.1f);
  return model;
}

std::unique_ptr<ParameterClient> Client(int num_ps) {
  v1::PlacementOptions options;
  options.set_max_partition_bytes(24);  // w: 2 rows per partition, 5 partitions
  options.set_num_virtual_shards(64);
  auto placement = ComputePlacement(Model(), num_ps, options);
  CHECK(placement.ok());
  auto client = ParameterClient::Create(
      Model(), *placement, std::make_unique<InProcessPsTransport>(num_ps, ParameterStoreOptions()),
      {});
  CHECK(client.ok());
  CHECK((*client)->CreateAll(v1::SyncOptions()).ok());
  return *std::move(client);
}

std::vector<int64_t> Keys() {
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 200; ++k) keys.push_back(k * 1000003 - 77);
  return keys;
}

// A few pushes so that values, slots and update counts are all non-trivial.
void Train(ParameterClient& c, int steps, int seed) {
  std::vector<int64_t> keys = Keys();
  for (int s = 0; s < steps; ++s) {
    std::vector<float> gw(30), gb(3), grows(keys.size() * 4);
    for (size_t i = 0; i < gw.size(); ++i) gw[i] = std::sin(i + s * 7 + seed);
    for (size_t i = 0; i < gb.size(); ++i) gb[i] = std::cos(i + s + seed);
    for (size_t i = 0; i < grows.size(); ++i) grows[i] = std::sin(i * 0.3 + s + seed);
    CHECK(c.Push({"w", "b"}, {gw.data(), gb.data()}, s).ok());
    CHECK(c.PushRows("emb", keys.data(), keys.size(), grows.data(), s).ok());
  }
}

struct Values {
  std::vector<std::vector<float>> dense;
  std::vector<float> rows;
};

Values Read(ParameterClient& c) {
  Values v;
  CHECK(c.Pull({"w", "b"}, &v.dense).ok());
  std::vector<int64_t> keys = Keys();
  v.rows.resize(keys.size() * 4);
  CHECK(c.PullRows("emb", keys.data(), keys.size(), v.rows.data()).ok());
  return v;
}

std::string Save(ParameterClient& c, const std::string& name, std::vector<v1::SavedShard>* saved) {
  const std::string path = absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  std::filesystem::remove_all(path);
  int64_t bytes = 0;
  auto shards = c.SaveShards(path, 5, &bytes);
  CHECK(shards.ok()) << shards.status();
  *saved = *shards;
  EXPECT_GT(bytes, 0);
  return path;
}

TEST(CheckpointRestoreTest, TwoPsRestoreIntoOneAndThreeWithSlots) {
  std::unique_ptr<ParameterClient> two = Client(2);
  Train(*two, 5, 0);
  std::vector<v1::SavedShard> saved;
  const std::string path = Save(*two, "ckpt-2ps", &saved);
  const Values before = Read(*two);
  for (int num_ps : {1, 3}) {
    SCOPED_TRACE(num_ps);
    std::unique_ptr<ParameterClient> other = Client(num_ps);
    ASSERT_TRUE(other->RestoreShards(path, saved, 5).ok());
    Values restored = Read(*other);
    EXPECT_EQ(restored.dense, before.dense);
    EXPECT_EQ(restored.rows, before.rows);
    // The optimizer slots and update counts came along: one more identical step gives identical
    // values on both (Adam, momentum and Adagrad all depend on their slots).
    Train(*two, 1, 9);
    Train(*other, 1, 9);
    Values a = Read(*two), b = Read(*other);
    for (size_t v = 0; v < a.dense.size(); ++v) {
      for (size_t i = 0; i < a.dense[v].size(); ++i) {
        ASSERT_FLOAT_EQ(a.dense[v][i], b.dense[v][i]) << v << "/" << i;
      }
    }
    for (size_t i = 0; i < a.rows.size(); ++i) ASSERT_FLOAT_EQ(a.rows[i], b.rows[i]) << i;
    // Put the 2-ps model back where the checkpoint has it for the next round.
    ASSERT_TRUE(two->RestoreShards(path, saved, 5).ok());
  }
}

// A restore brings a table back to the checkpoint's rows exactly: rows created after it are
// gone, so a key touched again gets its initial values, as in the run the checkpoint came from.
TEST(CheckpointRestoreTest, RowsCreatedAfterTheCheckpointDoNotSurviveARestore) {
  std::unique_ptr<ParameterClient> two = Client(2);
  Train(*two, 2, 3);
  std::vector<v1::SavedShard> saved;
  const std::string path = Save(*two, "ckpt-later-rows", &saved);
  auto rows_held = [&](ParameterClient& c) {
    int64_t rows = 0;
    for (int ps = 0; ps < c.num_ps(); ++ps) {
      auto shards = c.ListShards(ps);
      CHECK(shards.ok());
      for (const v1::ShardStats& s : shards->shards()) {
        if (s.is_table()) rows += s.rows();
      }
    }
    return rows;
  };
  const int64_t saved_rows = rows_held(*two);
  ASSERT_EQ(saved_rows, static_cast<int64_t>(Keys().size()));
  // New keys, trained after the checkpoint.
  std::vector<int64_t> later = {5, 6, 7, 123456789};
  std::vector<float> grads(later.size() * 4, 0.75f);
  ASSERT_TRUE(two->PushRows("emb", later.data(), later.size(), grads.data(), 9).ok());
  std::vector<float> trained(later.size() * 4);
  ASSERT_TRUE(two->PullRows("emb", later.data(), later.size(), trained.data()).ok());
  ASSERT_EQ(rows_held(*two), saved_rows + 4);

  ASSERT_TRUE(two->RestoreShards(path, saved, 5).ok());
  EXPECT_EQ(rows_held(*two), saved_rows);
  // Touched again, they start from their initial values, as on a fresh cluster.
  std::unique_ptr<ParameterClient> fresh = Client(2);
  std::vector<float> again(later.size() * 4), initial(later.size() * 4);
  ASSERT_TRUE(two->PullRows("emb", later.data(), later.size(), again.data()).ok());
  ASSERT_TRUE(fresh->PullRows("emb", later.data(), later.size(), initial.data()).ok());
  EXPECT_EQ(again, initial);
  EXPECT_NE(again, trained);
  std::unique_ptr<ParameterClient> other = Client(2);
  ASSERT_TRUE(other->RestoreShards(path, saved, 5).ok());
  EXPECT_EQ(Read(*two).rows, Read(*other).rows);
}

TEST(CheckpointRestoreTest, CorruptedShardIsDataLossAndChangesNothing) {
  std::unique_ptr<ParameterClient> two = Client(2);
  Train(*two, 2, 1);
  std::vector<v1::SavedShard> saved;
  const std::string path = Save(*two, "ckpt-corrupt", &saved);
  for (const auto& f : std::filesystem::directory_iterator(path + "/ps-1")) {
    if (f.path().extension() != ".sst") continue;
    std::fstream file(f.path(), std::ios::in | std::ios::out | std::ios::binary);
    for (int at = 100; at < 4000; at += 13) {
      file.seekp(at);
      file.put('\x33');
    }
  }
  std::unique_ptr<ParameterClient> one = Client(1);
  const Values fresh = Read(*one);
  absl::Status s = one->RestoreShards(path, saved, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path + "/ps-1"));
  const Values after = Read(*one);
  EXPECT_EQ(after.dense, fresh.dense);
}

}  // namespace
}  // namespace pscluster
