#include "ps_server/parameter_store.h"

#include <cmath>
#include <limits>
#include <vector>

#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/initializer.h"
#include "sharding/placement.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

v1::VariableSpec Var(const std::string& name, std::vector<int64_t> dims, float lr = 0.1f) {
  v1::VariableSpec v;
  v.set_name(name);
  for (int64_t d : dims) v.mutable_shape()->add_dims(d);
  v.set_dtype(v1::DT_FLOAT32);
  v.mutable_initializer()->set_kind(v1::InitializerSpec::CONSTANT);
  v.mutable_initializer()->set_value(1.0f);
  v.mutable_optimizer()->mutable_sgd()->set_learning_rate(lr);
  return v;
}

v1::DenseShardSpec Whole(const v1::VariableSpec& v) {
  v1::DenseShardSpec s;
  *s.mutable_variable() = v;
  s.mutable_partition()->set_variable(v.name());
  s.mutable_partition()->set_num_partitions(1);
  s.mutable_partition()->set_row_end(v.shape().dims_size() ? v.shape().dims(0) : 1);
  return s;
}

v1::TableShardSpec Table(const std::string& name, int64_t dim) {
  v1::TableShardSpec t;
  t.mutable_table()->set_name(name);
  t.mutable_table()->set_dim(dim);
  t.mutable_table()->mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0f);
  t.set_num_virtual_shards(4);
  for (int v = 0; v < 4; ++v) t.add_virtual_shards(v);
  return t;
}

google::protobuf::RepeatedPtrField<v1::ShardRef> Refs(std::vector<std::string> names) {
  google::protobuf::RepeatedPtrField<v1::ShardRef> refs;
  for (const std::string& n : names) refs.Add()->set_variable(n);
  return refs;
}

// The newest values (every complete sync step applied).
std::vector<float> Read(ParameterStore& store, const std::string& name) {
  auto shards = store.FindDense(Refs({name}));
  CHECK(shards.ok());
  store.SettleDense(*shards, -1);
  std::vector<float> v((*shards)[0]->num_elements());
  (*shards)[0]->ReadValues(v.data());
  return v;
}

class ParameterStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::CreateShardsRequest req;
    *req.add_dense() = Whole(Var("a", {2, 2}));
    *req.add_dense() = Whole(Var("b", {3}));
    *req.add_tables() = Table("emb", 2);
    v1::CreateShardsResponse resp;
    ASSERT_TRUE(store_.CreateShards(req, &resp).ok());
    EXPECT_EQ(resp.created(), 3);
  }
  ParameterStore store_{ParameterStoreOptions()};
};

TEST_F(ParameterStoreTest, CreatingAgainIsHarmlessButADifferentShapeIsRefused) {
  v1::CreateShardsRequest same;
  *same.add_dense() = Whole(Var("a", {2, 2}));
  v1::CreateShardsResponse resp;
  ASSERT_TRUE(store_.CreateShards(same, &resp).ok());
  EXPECT_EQ(resp.created(), 0);
  EXPECT_EQ(resp.already_present(), 1);

  v1::CreateShardsRequest other;
  *other.add_dense() = Whole(Var("new", {5}));
  *other.add_dense() = Whole(Var("a", {4, 2}));
  absl::Status s = store_.CreateShards(other, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("variable a/0 already exists with shape [2, 2]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("requested shape [4, 2]"));
  // All or nothing: "new" was not created either.
  EXPECT_EQ(store_.FindDense(Refs({"new"})).status().code(), absl::StatusCode::kNotFound);
}

// A restarted ps task whose shards the chief creates again to restore them serves nothing
// until the restore: no worker may see or update initial values meanwhile.
TEST(ParameterStoreRestoreTest, ShardsCreatedForARestoreAreHeldUntilIt) {
  ParameterStore store{ParameterStoreOptions()};
  v1::CreateShardsRequest req;
  *req.add_dense() = Whole(Var("a", {2}));
  *req.add_tables() = Table("emb", 2);
  req.mutable_sync()->set_mode(v1::SYNC);
  req.mutable_sync()->set_replicas_to_aggregate(1);
  req.set_start_step(40);
  req.set_hold_until_restored(true);
  v1::CreateShardsResponse resp;
  ASSERT_TRUE(store.CreateShards(req, &resp).ok());
  absl::Status held = store.FindDense(Refs({"a"})).status();
  EXPECT_EQ(held.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(held.message()), HasSubstr("waits for the chief to restore"));
  EXPECT_EQ(store.FindTable("emb").status().code(), absl::StatusCode::kUnavailable);
  // CreateShards without the flag (the chief found nothing to restore) lets it serve.
  req.set_hold_until_restored(false);
  ASSERT_TRUE(store.CreateShards(req, &resp).ok());
  auto shards = store.FindDense(Refs({"a"}));
  ASSERT_TRUE(shards.ok()) << shards.status();
  // The accumulators start at the given step: older gradients are stale, newer ones dropped.
  v1::PushDenseResponse push;
  ASSERT_TRUE(store.PushDense(*shards, {{1, 1}}, 8, 39, 0, &push).ok());
  EXPECT_EQ(push.dropped_stale(), 1);
  ASSERT_TRUE(store.PushDense(*shards, {{1, 1}}, 8, 41, 0, &push).ok());
  EXPECT_EQ(push.dropped_stale(), 1);
  EXPECT_THAT(Read(store, "a"), ::testing::ElementsAre(1.0f, 1.0f));
  ASSERT_TRUE(store.PushDense(*shards, {{1, 1}}, 8, 40, 0, &push).ok());
  EXPECT_EQ(push.accepted(), 1);
  EXPECT_THAT(Read(store, "a"), ::testing::ElementsAre(0.9f, 0.9f));
}

// SYNC: a complete step's update waits until a later step needs it, so a worker restarted in
// the middle of its pushes of step s pulls the same values for step s as the first time.
TEST(ParameterStoreSyncTest, ACompleteStepIsAppliedWhenALaterStepNeedsIt) {
  ParameterStore store{ParameterStoreOptions()};
  v1::CreateShardsRequest req;
  *req.add_dense() = Whole(Var("a", {2}));
  req.mutable_sync()->set_mode(v1::SYNC);
  req.mutable_sync()->set_replicas_to_aggregate(2);
  v1::CreateShardsResponse resp;
  ASSERT_TRUE(store.CreateShards(req, &resp).ok());
  auto shards = store.FindDense(Refs({"a"}));
  ASSERT_TRUE(shards.ok());
  v1::PushDenseResponse push;
  ASSERT_TRUE(store.PushDense(*shards, {{1, 1}}, 8, 0, 0, &push).ok());
  ASSERT_TRUE(store.PushDense(*shards, {{3, 3}}, 8, 0, 1, &push).ok());
  // Step 0 is complete (counted as applied) but a pull for step 0 still sees the old values.
  EXPECT_EQ(store.ListShards().shards(0).applied_step(), 1);
  store.SettleDense(*shards, 0);
  std::vector<float> values(2);
  (*shards)[0]->ReadValues(values.data());
  EXPECT_THAT(values, ::testing::ElementsAre(1.0f, 1.0f));
  // Worker 1 pushes step 0 again (restarted): stale, dropped.
  ASSERT_TRUE(store.PushDense(*shards, {{3, 3}}, 8, 0, 1, &push).ok());
  EXPECT_EQ(push.dropped_stale(), 1);
  // A pull for step 1 applies the mean (2, 2) with SGD at rate 0.1, once.
  store.SettleDense(*shards, 1);
  store.SettleDense(*shards, 1);
  (*shards)[0]->ReadValues(values.data());
  EXPECT_THAT(values, ::testing::ElementsAre(0.8f, 0.8f));
}

TEST_F(ParameterStoreTest, PushAppliesSgd) {
  auto shards = store_.FindDense(Refs({"a", "b"}));
  ASSERT_TRUE(shards.ok());
  v1::PushDenseResponse resp;
  ASSERT_TRUE(store_.PushDense(*shards, {{1, 2, 3, 4}, {10, 0, -10}}, 28, 0, 0, &resp).ok());
  EXPECT_EQ(resp.accepted(), 2);
  EXPECT_THAT(Read(store_, "a"), ::testing::ElementsAre(0.9f, 0.8f, 0.7f, 0.6f));
  EXPECT_THAT(Read(store_, "b"), ::testing::ElementsAre(0.0f, 1.0f, 2.0f));
}

TEST_F(ParameterStoreTest, BadPushesChangeNothing) {
  auto shards = store_.FindDense(Refs({"a", "b"}));
  ASSERT_TRUE(shards.ok());
  v1::PushDenseResponse resp;
  absl::Status s = store_.PushDense(*shards, {{1, 2, 3, 4}, {1, 2}}, 0, 0, 0, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("variable b/0: gradient has 2 elements, expected 3 (shape [3])"));

  const float nan = std::numeric_limits<float>::quiet_NaN();
  s = store_.PushDense(*shards, {{1, 2, 3, 4}, {1, nan, 3}}, 0, 0, 0, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("variable b/0: gradient element 1 is nan"));
  // "a" was valid, but nothing of a refused request is applied.
  EXPECT_THAT(Read(store_, "a"), ::testing::Each(1.0f));
  EXPECT_THAT(Read(store_, "b"), ::testing::Each(1.0f));

  EXPECT_EQ(store_.FindDense(Refs({"nope"})).status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(store_.FindDense(Refs({"nope"})).status().message()),
              HasSubstr("unknown variable nope/0"));
  std::vector<float> out(2);
  int64_t key = 7;
  s = store_.PullSparse("nope", &key, 1, out.data(), 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown table nope"));
  v1::PushSparseResponse sresp;
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> g = {inf, 0};
  s = store_.PushSparse("emb", &key, 1, g.data(), 8, 0, 0, &sresp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  v1::InspectShardRequest ireq;
  ireq.mutable_shard()->set_variable("emb");
  ireq.mutable_shard()->set_partition(-1);
  ireq.add_keys(7);
  auto inspect = store_.Inspect(ireq);
  ASSERT_TRUE(inspect.ok());
  EXPECT_EQ(inspect->missing_keys_size(), 1);  // the refused push created nothing
}

TEST(ParameterStoreNanPolicyTest, AllowAppliesNonFiniteGradients) {
  ParameterStoreOptions options;
  options.allow_non_finite = true;
  ParameterStore store(options);
  v1::CreateShardsRequest req;
  *req.add_dense() = Whole(Var("b", {2}));
  v1::CreateShardsResponse cresp;
  ASSERT_TRUE(store.CreateShards(req, &cresp).ok());
  auto shards = store.FindDense(Refs({"b"}));
  v1::PushDenseResponse resp;
  ASSERT_TRUE(
      store.PushDense(*shards, {{std::numeric_limits<float>::quiet_NaN(), 0}}, 0, 0, 0, &resp).ok());
  EXPECT_TRUE(std::isnan(Read(store, "b")[0]));
}

TEST_F(ParameterStoreTest, SparsePushSumsDuplicatesAndStatsShowIt) {
  std::vector<int64_t> keys = {5, 9, 5};
  std::vector<float> grads = {1, 1, 2, 2, 0.5f, 0.5f};
  v1::PushSparseResponse resp;
  ASSERT_TRUE(store_.PushSparse("emb", keys.data(), 3, grads.data(), 24, 0, 0, &resp).ok());
  std::vector<float> rows(4);
  std::vector<int64_t> pull = {5, 9};
  ASSERT_TRUE(store_.PullSparse("emb", pull.data(), 2, rows.data(), 16).ok());
  // Zero-initialized rows, SGD lr 1: row 5 gets -(1 + 0.5), row 9 gets -2.
  EXPECT_THAT(rows, ::testing::ElementsAre(-1.5f, -1.5f, -2.0f, -2.0f));

  v1::ListShardsResponse list = store_.ListShards();
  ASSERT_EQ(list.shards_size(), 3);
  const v1::ShardStats& emb = list.shards(2);
  EXPECT_EQ(emb.name(), "emb");
  EXPECT_TRUE(emb.is_table());
  EXPECT_EQ(emb.rows(), 2);
  EXPECT_EQ(emb.pushes(), 1);
  EXPECT_EQ(emb.pulls(), 1);
  EXPECT_EQ(emb.bytes_in(), 24);
  EXPECT_EQ(list.shards(0).name(), "a");
  EXPECT_EQ(list.shards(0).optimizer(), "sgd");
}

TEST_F(ParameterStoreTest, InspectGivesStatsAndASlice) {
  auto shards = store_.FindDense(Refs({"a"}));
  v1::PushDenseResponse resp;
  ASSERT_TRUE(store_.PushDense(*shards, {{0, 10, 0, -10}}, 16, 0, 0, &resp).ok());
  v1::InspectShardRequest req;
  req.mutable_shard()->set_variable("a");
  req.set_values_offset(1);
  req.set_values_count(2);
  auto r = store_.Inspect(req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_DOUBLE_EQ(r->values().min(), 0.0);
  EXPECT_DOUBLE_EQ(r->values().max(), 2.0);
  EXPECT_DOUBLE_EQ(r->values().mean(), 1.0);
  ASSERT_EQ(r->slice().size(), 2 * sizeof(float));
  const float* slice = reinterpret_cast<const float*>(r->slice().data());
  EXPECT_FLOAT_EQ(slice[0], 0.0f);
  EXPECT_FLOAT_EQ(slice[1], 1.0f);
  EXPECT_EQ(r->shard().applied_step(), 1);
  req.set_values_offset(99);
  EXPECT_EQ(store_.Inspect(req).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ParameterStorePlacementTest, ShardsFromAPlacementHoldTheWholeVariable) {
  v1::ModelSpec model;
  v1::VariableSpec big = Var("big", {10, 4});
  big.mutable_initializer()->set_kind(v1::InitializerSpec::UNIFORM);
  big.mutable_initializer()->set_min(-1);
  big.mutable_initializer()->set_max(1);
  *model.add_variables() = big;
  v1::PlacementOptions options;
  options.set_max_partition_bytes(48);  // 3 rows of 16 bytes
  auto placement = ComputePlacement(model, 2, options);
  ASSERT_TRUE(placement.ok()) << placement.status();
  ASSERT_GT(placement->partitions_size(), 1);
  std::vector<std::unique_ptr<ParameterStore>> stores;
  std::vector<v1::CreateShardsRequest> requests(2);
  for (const v1::DensePartition& p : placement->partitions()) {
    v1::DenseShardSpec* spec = requests[p.ps_task()].add_dense();
    *spec->mutable_variable() = big;
    *spec->mutable_partition() = p;
  }
  for (int ps = 0; ps < 2; ++ps) {
    stores.push_back(std::make_unique<ParameterStore>(ParameterStoreOptions()));
    v1::CreateShardsResponse resp;
    ASSERT_TRUE(stores[ps]->CreateShards(requests[ps], &resp).ok());
  }
  // Joining the partitions, wherever they live, gives the variable a single process would make.
  std::vector<float> joined;
  for (const v1::DensePartition& p : placement->partitions()) {
    google::protobuf::RepeatedPtrField<v1::ShardRef> refs;
    refs.Add()->set_variable("big");
    refs.Mutable(0)->set_partition(p.partition());
    auto shard = stores[p.ps_task()]->FindDense(refs);
    ASSERT_TRUE(shard.ok()) << shard.status();
    std::vector<float> v((*shard)[0]->num_elements());
    (*shard)[0]->ReadValues(v.data());
    joined.insert(joined.end(), v.begin(), v.end());
  }
  std::vector<float> whole(40);
  ASSERT_TRUE(InitializeDense(big.initializer(), "big", big.shape(), 0, whole.data(), 40).ok());
  EXPECT_EQ(joined, whole);
}

}  // namespace
}  // namespace pscluster
