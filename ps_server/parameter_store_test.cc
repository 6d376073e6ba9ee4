#include "ps_server/parameter_store.h"

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/initializer.h"
#include "sharding/placement.h"
#include "storage/checkpoint.h"

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

// Collects a pull's values.
class VectorSink : public DensePullSink {
 public:
  absl::Status Begin(const std::vector<int64_t>& n) override {
    values.assign(n.size(), {});
    return absl::OkStatus();
  }
  absl::Status Values(int index, const float* v, int64_t n) override {
    values[index].assign(v, v + n);
    return absl::OkStatus();
  }
  std::vector<std::vector<float>> values;
};

// The values of `name` as a pull for `step` sees them (-1: the newest, every complete sync
// step applied).
std::vector<float> Read(ParameterStore& store, const std::string& name, int64_t step = -1) {
  v1::PullDenseRequest req;
  *req.mutable_shards() = Refs({name});
  if (step >= 0) req.set_step(step);
  VectorSink sink;
  absl::Status s = store.PullDense(req, &sink);
  CHECK(s.ok()) << s;
  return sink.values[0];
}

// A whole push of float32 gradients, one per named shard.
absl::Status Push(ParameterStore& store, const std::vector<std::string>& names,
                  const std::vector<std::vector<float>>& grads, int64_t step, int32_t worker,
                  v1::PushDenseResponse* resp, v1::RequestId id = v1::RequestId(),
                  bool delta = false) {
  v1::PushDenseHeader header;
  header.set_delta(delta);
  *header.mutable_shards() = Refs(names);
  for (const auto& g : grads) header.add_num_elements(static_cast<int64_t>(g.size()));
  header.set_step(step);
  header.set_worker(worker);
  *header.mutable_request_id() = id;
  DensePush push;
  PS_RETURN_IF_ERROR(store.StartPushDense(header, &push));
  for (size_t i = 0; i < grads.size(); ++i) {
    PS_RETURN_IF_ERROR(push.AddChunk(
        static_cast<int>(i), 0,
        absl::string_view(reinterpret_cast<const char*>(grads[i].data()), grads[i].size() * 4)));
  }
  return store.FinishPushDense(&push, resp);
}

absl::Status PushSparse(ParameterStore& store, const std::string& table,
                        const std::vector<int64_t>& keys, const std::vector<float>& grads,
                        v1::PushSparseResponse* resp) {
  v1::PushSparseRequest req;
  req.set_table(table);
  return store.PushSparse(
      req, keys.data(), static_cast<int64_t>(keys.size()),
      absl::string_view(reinterpret_cast<const char*>(grads.data()), grads.size() * 4), resp);
}

absl::Status PullSparse(ParameterStore& store, const std::string& table,
                        const std::vector<int64_t>& keys, std::vector<float>* rows) {
  v1::PullSparseRequest req;
  req.set_table(table);
  return store.PullSparse(req, keys.data(), static_cast<int64_t>(keys.size()), rows);
}

absl::StatusCode PullCode(ParameterStore& store, const std::string& name) {
  v1::PullDenseRequest req;
  *req.mutable_shards() = Refs({name});
  VectorSink sink;
  return store.PullDense(req, &sink).code();
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
  EXPECT_THAT(std::string(s.message()), HasSubstr("variable a/0 already exists with shape [2, 2]"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("requested shape [4, 2]"));
  // All or nothing: "new" was not created either.
  EXPECT_EQ(PullCode(store_, "new"), absl::StatusCode::kNotFound);
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
  v1::PullDenseRequest pull;
  *pull.mutable_shards() = Refs({"a"});
  VectorSink sink;
  absl::Status held = store.PullDense(pull, &sink);
  EXPECT_EQ(held.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(held.message()), HasSubstr("waits for the chief to restore"));
  EXPECT_EQ(store.TableDim("emb").status().code(), absl::StatusCode::kUnavailable);
  // CreateShards without the flag (the chief found nothing to restore) lets it serve.
  req.set_hold_until_restored(false);
  ASSERT_TRUE(store.CreateShards(req, &resp).ok());
  // The accumulators start at the given step: older gradients are stale, newer ones dropped.
  v1::PushDenseResponse push;
  ASSERT_TRUE(Push(store, {"a"}, {{1, 1}}, 39, 0, &push).ok());
  EXPECT_EQ(push.dropped_stale(), 1);
  ASSERT_TRUE(Push(store, {"a"}, {{1, 1}}, 41, 0, &push).ok());
  EXPECT_EQ(push.dropped_stale(), 1);
  EXPECT_THAT(Read(store, "a"), ::testing::ElementsAre(1.0f, 1.0f));
  ASSERT_TRUE(Push(store, {"a"}, {{1, 1}}, 40, 0, &push).ok());
  EXPECT_EQ(push.accepted(), 1);
  EXPECT_THAT(Read(store, "a"), ::testing::ElementsAre(0.9f, 0.9f));
}

// SYNC: a complete step's update waits until a later step needs it, so a worker restarted in
// the middle of its pushes of step s pulls the same values for step s as the first time.
// A chief replaced by a newer one cannot mix its half-done work into the newer one's: control
// requests of an older chief epoch are refused, naming both epochs, and change nothing.
TEST(ParameterStoreFencingTest, RequestsOfAnOlderChiefAreRefused) {
  ParameterStore store((ParameterStoreOptions()));
  v1::CreateShardsRequest create;
  v1::DenseShardSpec* spec = create.add_dense();
  spec->mutable_variable()->set_name("w");
  spec->mutable_variable()->mutable_shape()->add_dims(4);
  spec->mutable_variable()->mutable_optimizer()->mutable_sgd()->set_learning_rate(1);
  spec->mutable_partition()->set_variable("w");
  spec->mutable_partition()->set_row_end(4);
  create.set_chief_epoch(200);
  v1::CreateShardsResponse created;
  ASSERT_TRUE(store.CreateShards(create, &created).ok());
  EXPECT_EQ(created.created(), 1);

  v1::CreateShardsRequest older = create;
  older.set_chief_epoch(100);
  older.mutable_dense(0)->mutable_variable()->set_name("v");
  older.mutable_dense(0)->mutable_partition()->set_variable("v");
  absl::Status s = store.CreateShards(older, &created);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("CreateShards from chief epoch 100 refused: this task "
                                     "follows chief epoch 200 (a newer chief)"));
  v1::RestoreShardsRequest restore;
  restore.set_checkpoint_path(testing::TempDir() + "/fenced");
  restore.set_chief_epoch(199);
  v1::RestoreShardsResponse restored;
  s = store.Restore(restore, &restored);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(s.message(), HasSubstr("RestoreShards from chief epoch 199"));
  v1::SaveShardsRequest save;
  save.set_checkpoint_path(testing::TempDir() + "/fenced");
  save.set_chief_epoch(1);
  v1::SaveShardsResponse saved;
  s = store.Save(save, &saved);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(store.ListShards().shards_size(), 1);  // "v" was not created

  // The same and newer epochs pass (and raise it); epoch 0 (not a chief) always does.
  EXPECT_TRUE(store.CreateShards(create, &created).ok());
  create.set_chief_epoch(300);
  EXPECT_TRUE(store.CreateShards(create, &created).ok());
  create.set_chief_epoch(200);
  EXPECT_EQ(store.CreateShards(create, &created).code(), absl::StatusCode::kFailedPrecondition);
  create.set_chief_epoch(0);
  EXPECT_TRUE(store.CreateShards(create, &created).ok());
}

TEST(ParameterStoreSyncTest, ACompleteStepIsAppliedWhenALaterStepNeedsIt) {
  ParameterStore store{ParameterStoreOptions()};
  v1::CreateShardsRequest req;
  *req.add_dense() = Whole(Var("a", {2}));
  req.mutable_sync()->set_mode(v1::SYNC);
  req.mutable_sync()->set_replicas_to_aggregate(2);
  v1::CreateShardsResponse resp;
  ASSERT_TRUE(store.CreateShards(req, &resp).ok());
  v1::PushDenseResponse push;
  ASSERT_TRUE(Push(store, {"a"}, {{1, 1}}, 0, 0, &push).ok());
  ASSERT_TRUE(Push(store, {"a"}, {{3, 3}}, 0, 1, &push).ok());
  // Step 0 is complete (counted as applied) but a pull for step 0 still sees the old values.
  EXPECT_EQ(store.ListShards().shards(0).applied_step(), 1);
  EXPECT_THAT(Read(store, "a", 0), ::testing::ElementsAre(1.0f, 1.0f));
  // Worker 1 pushes step 0 again (restarted): stale, dropped.
  ASSERT_TRUE(Push(store, {"a"}, {{3, 3}}, 0, 1, &push).ok());
  EXPECT_EQ(push.dropped_stale(), 1);
  // A pull for step 1 applies the mean (2, 2) with SGD at rate 0.1, once.
  EXPECT_THAT(Read(store, "a", 1), ::testing::ElementsAre(0.8f, 0.8f));
  EXPECT_THAT(Read(store, "a", 1), ::testing::ElementsAre(0.8f, 0.8f));
}

TEST_F(ParameterStoreTest, PushAppliesSgd) {
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(store_, {"a", "b"}, {{1, 2, 3, 4}, {10, 0, -10}}, 0, 0, &resp).ok());
  EXPECT_EQ(resp.accepted(), 2);
  EXPECT_THAT(Read(store_, "a"), ::testing::ElementsAre(0.9f, 0.8f, 0.7f, 0.6f));
  EXPECT_THAT(Read(store_, "b"), ::testing::ElementsAre(0.0f, 1.0f, 2.0f));
}

// A delta (a worker's local steps) is added to the values, whatever the optimizer; once, on a
// retry with the same id. A shard that accumulates sync steps refuses it and changes nothing.
TEST_F(ParameterStoreTest, DeltaPushAddsToTheValues) {
  v1::PushDenseResponse resp;
  // Refused until the chief says the cluster runs local steps.
  absl::Status refused = Push(store_, {"b"}, {{10, 0, -10}}, 0, 0, &resp, v1::RequestId(),
                              /*delta=*/true);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()),
              HasSubstr("a delta push (local steps) to a cluster that does not run them"));
  EXPECT_THAT(Read(store_, "b"), ::testing::ElementsAre(1.0f, 1.0f, 1.0f));
  v1::CreateShardsRequest local;
  *local.add_dense() = Whole(Var("b", {3}));
  local.mutable_sync()->set_local_steps(4);
  v1::CreateShardsResponse created;
  ASSERT_TRUE(store_.CreateShards(local, &created).ok());
  v1::RequestId id;
  id.set_client(7);
  id.set_seq(1);
  ASSERT_TRUE(Push(store_, {"a", "b"}, {{1, 2, 3, 4}, {10, 0, -10}}, 0, 0, &resp, id,
                   /*delta=*/true)
                  .ok());
  EXPECT_EQ(resp.accepted(), 2);
  EXPECT_THAT(Read(store_, "a"), ::testing::ElementsAre(2.0f, 3.0f, 4.0f, 5.0f));
  EXPECT_THAT(Read(store_, "b"), ::testing::ElementsAre(11.0f, 1.0f, -9.0f));
  ASSERT_TRUE(Push(store_, {"a"}, {{1, 2, 3, 4}}, 0, 0, &resp, id, /*delta=*/true).ok());
  EXPECT_TRUE(resp.duplicate());
  EXPECT_THAT(Read(store_, "a"), ::testing::ElementsAre(2.0f, 3.0f, 4.0f, 5.0f));

  ParameterStore sync{ParameterStoreOptions()};
  v1::CreateShardsRequest req;
  *req.add_dense() = Whole(Var("s", {2}));
  req.mutable_sync()->set_mode(v1::SYNC);
  req.mutable_sync()->set_replicas_to_aggregate(1);
  req.mutable_sync()->set_local_steps(4);
  ASSERT_TRUE(sync.CreateShards(req, &created).ok());
  absl::Status s = Push(sync, {"s"}, {{5, 5}}, 0, 0, &resp, v1::RequestId(), /*delta=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("variable s/0 accumulates sync steps; a delta push (local steps) needs "
                        "async or ssp mode"));
  EXPECT_THAT(Read(sync, "s"), ::testing::ElementsAre(1.0f, 1.0f));
}

// Local steps are the workers' concern: a chief that asks for them (or a restarted one that
// no longer does) creates the same shards again, as long as the update mode is the same.
TEST_F(ParameterStoreTest, LocalStepsDoNotChangeWhatTheShardsAre) {
  v1::CreateShardsRequest again;
  *again.add_dense() = Whole(Var("a", {2, 2}));
  again.mutable_sync()->set_local_steps(8);
  v1::CreateShardsResponse resp;
  ASSERT_TRUE(store_.CreateShards(again, &resp).ok());
  EXPECT_EQ(resp.already_present(), 1);
  again.mutable_sync()->set_mode(v1::SSP);
  EXPECT_EQ(store_.CreateShards(again, &resp).code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(ParameterStoreTest, BadPushesChangeNothing) {
  v1::PushDenseResponse resp;
  absl::Status s = Push(store_, {"a", "b"}, {{1, 2, 3, 4}, {1, 2}}, 0, 0, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("variable b/0: gradient has 2 elements, expected 3 (shape [3])"));

  const float nan = std::numeric_limits<float>::quiet_NaN();
  s = Push(store_, {"a", "b"}, {{1, 2, 3, 4}, {1, nan, 3}}, 0, 0, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("variable b/0: gradient element 1 is nan"));
  // "a" was valid, but nothing of a refused request is applied.
  EXPECT_THAT(Read(store_, "a"), ::testing::Each(1.0f));
  EXPECT_THAT(Read(store_, "b"), ::testing::Each(1.0f));

  s = Push(store_, {"nope"}, {{1}}, 0, 0, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown variable nope/0"));
  std::vector<float> out;
  s = PullSparse(store_, "nope", {7}, &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown table nope"));
  v1::PushSparseResponse sresp;
  const float inf = std::numeric_limits<float>::infinity();
  s = PushSparse(store_, "emb", {7}, {inf, 0}, &sresp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  v1::InspectShardRequest ireq;
  ireq.mutable_shard()->set_variable("emb");
  ireq.mutable_shard()->set_partition(-1);
  ireq.add_keys(7);
  auto inspect = store_.Inspect(ireq);
  ASSERT_TRUE(inspect.ok());
  EXPECT_EQ(inspect->missing_keys_size(), 1);  // the refused push created nothing
}

// In-process pushes (UseFloats) are scanned for NaN and Inf at FinishPushDense, on the apply
// pool for large gradients: a bad element anywhere refuses the whole push before any of it is
// applied, with the same message as a pushed chunk gets.
TEST(ParameterStoreNanPolicyTest, UseFloatsPushesAreScannedBeforeAnythingIsApplied) {
  ParameterStoreOptions options;
  options.apply_threads = 3;
  ParameterStore store(options);
  const int64_t big = 5 * kParallelScanBlock + 3;
  v1::CreateShardsRequest req;
  *req.add_dense() = Whole(Var("small", {2}));
  *req.add_dense() = Whole(Var("big", {big}));
  v1::CreateShardsResponse cresp;
  ASSERT_TRUE(store.CreateShards(req, &cresp).ok());
  std::vector<float> small_grad = {1, 1};
  std::vector<float> big_grad(static_cast<size_t>(big), 1.0f);
  big_grad[4 * kParallelScanBlock + 9] = std::numeric_limits<float>::infinity();
  const auto push = [&](v1::PushDenseResponse* resp) {
    v1::PushDenseHeader header;
    *header.mutable_shards() = Refs({"small", "big"});
    header.add_num_elements(2);
    header.add_num_elements(big);
    DensePush p;
    PS_RETURN_IF_ERROR(store.StartPushDense(header, &p));
    PS_RETURN_IF_ERROR(p.UseFloats(0, small_grad.data(), 2));
    PS_RETURN_IF_ERROR(p.UseFloats(1, big_grad.data(), big));
    return store.FinishPushDense(&p, resp);
  };
  v1::PushDenseResponse resp;
  absl::Status s = push(&resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr(absl::StrCat("variable big/0: gradient element ",
                                     4 * kParallelScanBlock + 9, " is inf")));
  EXPECT_THAT(Read(store, "small"), ::testing::Each(1.0f));
  EXPECT_THAT(Read(store, "big"), ::testing::Each(1.0f));
  // The same push without the Inf is applied whole (lr 0.1: 1 - 0.1).
  big_grad[4 * kParallelScanBlock + 9] = 1.0f;
  ASSERT_TRUE(push(&resp).ok());
  EXPECT_EQ(resp.accepted(), 2);
  EXPECT_THAT(Read(store, "small"), ::testing::Each(::testing::FloatEq(0.9f)));
  EXPECT_THAT(Read(store, "big"), ::testing::Each(::testing::FloatEq(0.9f)));
}

TEST(ParameterStoreNanPolicyTest, AllowAppliesNonFiniteGradients) {
  ParameterStoreOptions options;
  options.allow_non_finite = true;
  ParameterStore store(options);
  v1::CreateShardsRequest req;
  *req.add_dense() = Whole(Var("b", {2}));
  v1::CreateShardsResponse cresp;
  ASSERT_TRUE(store.CreateShards(req, &cresp).ok());
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(store, {"b"}, {{std::numeric_limits<float>::quiet_NaN(), 0}}, 0, 0, &resp).ok());
  EXPECT_TRUE(std::isnan(Read(store, "b")[0]));
}

TEST_F(ParameterStoreTest, SparsePushSumsDuplicatesAndStatsShowIt) {
  v1::PushSparseResponse resp;
  ASSERT_TRUE(PushSparse(store_, "emb", {5, 9, 5}, {1, 1, 2, 2, 0.5f, 0.5f}, &resp).ok());
  std::vector<float> rows;
  ASSERT_TRUE(PullSparse(store_, "emb", {5, 9}, &rows).ok());
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
  v1::PushDenseResponse resp;
  ASSERT_TRUE(Push(store_, {"a"}, {{0, 10, 0, -10}}, 0, 0, &resp).ok());
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
    v1::PullDenseRequest req;
    req.add_shards()->set_variable("big");
    req.mutable_shards(0)->set_partition(p.partition());
    VectorSink sink;
    ASSERT_TRUE(stores[p.ps_task()]->PullDense(req, &sink).ok());
    joined.insert(joined.end(), sink.values[0].begin(), sink.values[0].end());
  }
  std::vector<float> whole(40);
  ASSERT_TRUE(InitializeDense(big.initializer(), "big", big.shape(), 0, whole.data(), 40).ok());
  EXPECT_EQ(joined, whole);
}

// The push path's defects found with a client written from proto/ alone, at the store: each is
// refused with a message naming the problem, and nothing is applied.
TEST_F(ParameterStoreTest, AChunkWhoseEndOverflowsIsRefused) {
  v1::PushDenseHeader header;
  *header.mutable_shards() = Refs({"a"});
  header.add_num_elements(4);
  DensePush push;
  ASSERT_TRUE(store_.StartPushDense(header, &push).ok());
  const float g = 1;
  absl::Status s = push.AddChunk(0, std::numeric_limits<int64_t>::max(),
                                 absl::string_view(reinterpret_cast<const char*>(&g), 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("does not fit variable a/0 of 4 elements"));
  s = push.AddChunk(0, -1, absl::string_view(reinterpret_cast<const char*>(&g), 4));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(push.Destination(0, 2, std::numeric_limits<int64_t>::max()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Read(store_, "a"), ::testing::Each(1.0f));
}

TEST_F(ParameterStoreTest, AChunkSentTwiceOrOutOfOrderIsRefused) {
  v1::PushDenseHeader header;
  *header.mutable_shards() = Refs({"a"});
  header.add_num_elements(4);
  DensePush push;
  ASSERT_TRUE(store_.StartPushDense(header, &push).ok());
  const float g[2] = {1, 1};
  const absl::string_view two(reinterpret_cast<const char*>(g), 8);
  ASSERT_TRUE(push.AddChunk(0, 0, two).ok());
  absl::Status s = push.AddChunk(0, 0, two);  // the same chunk again
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("out of order"));
  // The element count adds up with the repeated chunk, but the push is incomplete.
  v1::PushDenseResponse resp;
  s = store_.FinishPushDense(&push, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("received 2 of 4 gradient elements"));
  EXPECT_THAT(Read(store_, "a"), ::testing::Each(1.0f));
}

TEST_F(ParameterStoreTest, AHeaderNamingAShardTwiceIsRefused) {
  v1::PushDenseResponse resp;
  absl::Status s = Push(store_, {"b", "b"}, {{1, 1, 1}, {1, 1, 1}}, 0, 0, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("variable b/0 is named twice in one push"));
  EXPECT_THAT(Read(store_, "b"), ::testing::Each(1.0f));
}

TEST_F(ParameterStoreTest, ARetriedPushIsAppliedOnce) {
  v1::RequestId id;
  id.set_client(42);
  id.set_seq(1);
  v1::PushDenseResponse first, retry;
  ASSERT_TRUE(Push(store_, {"b"}, {{1, 1, 1}}, 0, 0, &first, id).ok());
  EXPECT_FALSE(first.duplicate());
  ASSERT_TRUE(Push(store_, {"b"}, {{1, 1, 1}}, 0, 0, &retry, id).ok());
  EXPECT_TRUE(retry.duplicate());
  EXPECT_EQ(retry.accepted(), 1);
  EXPECT_THAT(Read(store_, "b"),
              ::testing::Each(::testing::FloatEq(0.9f)));  // one SGD step of 0.1, not two
  // A sparse push likewise.
  v1::PushSparseRequest req;
  req.set_table("emb");
  *req.mutable_request_id() = id;
  req.mutable_request_id()->set_seq(2);
  const int64_t key = 3;
  const float g[2] = {1, 1};
  const absl::string_view bytes(reinterpret_cast<const char*>(g), 8);
  v1::PushSparseResponse s1, s2;
  ASSERT_TRUE(store_.PushSparse(req, &key, 1, bytes, &s1).ok());
  ASSERT_TRUE(store_.PushSparse(req, &key, 1, bytes, &s2).ok());
  EXPECT_FALSE(s1.duplicate());
  EXPECT_TRUE(s2.duplicate());
  std::vector<float> rows;
  ASSERT_TRUE(PullSparse(store_, "emb", {3}, &rows).ok());
  EXPECT_THAT(rows, ::testing::ElementsAre(-1.0f, -1.0f));  // SGD at rate 1, once
}

TEST(ParameterStoreLimitsTest, ASparsePullOverTheLimitCreatesNothing) {
  ParameterStoreOptions options;
  options.max_sparse_keys = 100;
  ParameterStore store(options);
  v1::CreateShardsRequest req;
  *req.add_tables() = Table("emb", 2);
  v1::CreateShardsResponse cresp;
  ASSERT_TRUE(store.CreateShards(req, &cresp).ok());
  std::vector<int64_t> keys(101);
  for (int i = 0; i < 101; ++i) keys[i] = i;
  std::vector<float> rows;
  absl::Status s = PullSparse(store, "emb", keys, &rows);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("over this ps task's limit of 100 keys"));
  EXPECT_EQ(store.ListShards().shards(0).rows(), 0);
}

TEST(ParameterStoreLimitsTest, NewRowsBeyondTheTableLimitAreRefusedBeforeAnyIsCreated) {
  ParameterStoreOptions options;
  options.max_table_rows = 10;
  ParameterStore store(options);
  v1::CreateShardsRequest req;
  *req.add_tables() = Table("emb", 2);
  v1::CreateShardsResponse cresp;
  ASSERT_TRUE(store.CreateShards(req, &cresp).ok());
  std::vector<int64_t> keys = {0, 1, 2, 3, 4, 5, 6, 7};
  std::vector<float> rows;
  ASSERT_TRUE(PullSparse(store, "emb", keys, &rows).ok());
  // 8 rows exist: known keys (even many of them, repeated) pass; 3 new ones do not.
  std::vector<int64_t> known(50, 3);
  EXPECT_TRUE(PullSparse(store, "emb", known, &rows).ok());
  std::vector<int64_t> more = {1, 8, 9, 10, 10};
  absl::Status s = PullSparse(store, "emb", more, &rows);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("table emb: 3 new rows would pass this ps task's limit of 10 rows per "
                        "table (--max_table_rows; it holds 8); nothing was done"));
  EXPECT_EQ(store.ListShards().shards(0).rows(), 8);
  std::vector<int64_t> two = {8, 9};
  EXPECT_TRUE(PullSparse(store, "emb", two, &rows).ok());
  EXPECT_EQ(store.ListShards().shards(0).rows(), 10);
}

// Without --max_table_rows, the memory budget bounds a table without eviction: a pull whose
// new rows would pass what the budget has left (after the dense shards and every table's
// rows) is refused before any row is created (issue 32: a pull of 5 M keys grew a ps by 270 MB
// before anything said no).
TEST(ParameterStoreLimitsTest, NewRowsBeyondTheMemoryBudgetAreRefusedBeforeAnyIsCreated) {
  ParameterStoreOptions options;
  options.memory_budget_bytes = 64 << 10;
  ParameterStore store(options);
  v1::CreateShardsRequest req;
  *req.add_tables() = Table("emb", 2);
  v1::CreateShardsResponse cresp;
  ASSERT_TRUE(store.CreateShards(req, &cresp).ok());
  std::vector<float> rows;
  ASSERT_TRUE(PullSparse(store, "emb", {0}, &rows).ok());
  const int64_t row_bytes = store.ListShards().shards(0).bytes();  // one row's
  ASSERT_GT(row_bytes, 0);
  const int64_t fit = (64 << 10) / row_bytes;
  std::vector<int64_t> keys(fit - 10);
  for (int64_t i = 0; i < fit - 10; ++i) keys[i] = i;
  ASSERT_TRUE(PullSparse(store, "emb", keys, &rows).ok());
  EXPECT_EQ(store.ListShards().shards(0).rows(), fit - 10);
  std::vector<int64_t> more(20);
  for (int64_t i = 0; i < 20; ++i) more[i] = fit + i;
  absl::Status s = PullSparse(store, "emb", more, &rows);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("table emb: 20 new rows of "));
  EXPECT_THAT(std::string(s.message()), HasSubstr("would pass this ps task's memory budget of "
                                                  "65536 bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("nothing was done"));
  EXPECT_EQ(store.ListShards().shards(0).rows(), fit - 10);
  // A push's new rows count the same; known keys and what still fits pass.
  v1::PushSparseResponse resp;
  EXPECT_EQ(PushSparse(store, "emb", more, std::vector<float>(40, 0.5f), &resp).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(PullSparse(store, "emb", keys, &rows).ok());
  std::vector<int64_t> ten(more.begin(), more.begin() + 10);
  EXPECT_TRUE(PullSparse(store, "emb", ten, &rows).ok());
  EXPECT_EQ(store.ListShards().shards(0).rows(), fit);
}

// A table with a capacity evicts where --max_table_rows would refuse; a pull of a table with
// eviction creates nothing and is not refused.
TEST(ParameterStoreLimitsTest, ATableWithACapacityEvictsInsteadOfBeingRefused) {
  ParameterStoreOptions options;
  options.max_table_rows = 10;
  ParameterStore store(options);
  v1::CreateShardsRequest req;
  v1::TableShardSpec table = Table("emb", 2);
  table.mutable_table()->mutable_eviction()->set_max_rows(640);  // 10 a stripe
  *req.add_tables() = table;
  v1::CreateShardsResponse cresp;
  ASSERT_TRUE(store.CreateShards(req, &cresp).ok());
  std::vector<int64_t> keys(2000);
  for (int64_t i = 0; i < 2000; ++i) keys[i] = i;
  std::vector<float> rows;
  ASSERT_TRUE(PullSparse(store, "emb", keys, &rows).ok());
  EXPECT_EQ(store.ListShards().shards(0).rows(), 0);
  v1::PushSparseResponse resp;
  ASSERT_TRUE(PushSparse(store, "emb", keys, std::vector<float>(4000, 0.5f), &resp).ok());
  const v1::ShardStats stats = store.ListShards().shards(0);
  EXPECT_LE(stats.rows(), 640);
  EXPECT_EQ(stats.admitted_rows(), 2000);
  EXPECT_EQ(stats.evicted_rows(), 2000 - stats.rows());
}

// Async pushes carry each worker's own step; a pull's step (an evaluator's global step, much
// higher) must not make rows look expired. In sync mode steps are comparable and a pull is
// judged at its own.
TEST(ParameterStoreTtlTest, AnAsyncPullIsJudgedAtThePushesClockNotItsOwnStep) {
  ParameterStore store(ParameterStoreOptions{});
  v1::CreateShardsRequest req;
  v1::TableShardSpec table = Table("emb", 1);
  table.mutable_table()->mutable_eviction()->set_ttl_steps(10);
  *req.add_tables() = table;
  v1::CreateShardsResponse cresp;
  ASSERT_TRUE(store.CreateShards(req, &cresp).ok());
  v1::PushSparseRequest push;
  push.set_table("emb");
  push.set_step(5);
  const float grad = 0.25f;
  const int64_t key = 3;
  v1::PushSparseResponse resp;
  ASSERT_TRUE(store
                  .PushSparse(push, &key, 1,
                              absl::string_view(reinterpret_cast<const char*>(&grad), 4), &resp)
                  .ok());
  v1::PullSparseRequest pull;
  pull.set_table("emb");
  pull.set_step(100000);
  std::vector<float> rows;
  ASSERT_TRUE(store.PullSparse(pull, &key, 1, &rows).ok());
  EXPECT_EQ(rows, std::vector<float>{-0.25f});  // zeros - 1.0 * 0.25: alive
}

TEST(ParameterStoreLimitsTest, ShardsBeyondTheMemoryBudgetAreRefusedBeforeAllocating) {
  ParameterStoreOptions options;
  options.memory_budget_bytes = 1 << 20;
  ParameterStore store(options);
  v1::CreateShardsRequest req;
  *req.add_dense() = Whole(Var("huge", {1000000, 1000000}));  // 10^12 elements
  v1::CreateShardsResponse resp;
  absl::Status s = store.CreateShards(req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("4000000000000 bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("memory budget is 1048576 bytes"));
  // Sizes whose product overflows are refused as such.
  v1::CreateShardsRequest overflow;
  *overflow.add_dense() = Whole(Var("wrap", {int64_t{1} << 40, int64_t{1} << 40}));
  s = store.CreateShards(overflow, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("is too large"));
  // What fits is created.
  v1::CreateShardsRequest small;
  *small.add_dense() = Whole(Var("small", {1000}));
  ASSERT_TRUE(store.CreateShards(small, &resp).ok());
  EXPECT_EQ(resp.created(), 1);
}

}  // namespace
}  // namespace pscluster

namespace pscluster {
namespace {

// With --checkpoint_dir, a save or restore names a checkpoint, resolved under the directory;
// paths, escapes and committed checkpoints are refused and write nothing (issue 14).
TEST(ParameterStoreCheckpointDirTest, RequestsNameACheckpointUnderTheDirectory) {
  const std::string root = testing::TempDir() + "/confined";
  const std::string dir = root + "/checkpoints";
  ASSERT_EQ(system(("rm -rf '" + root + "' && mkdir -p '" + dir + "'").c_str()), 0);
  ParameterStoreOptions options;
  options.checkpoint_dir = dir;
  ParameterStore store(options);
  v1::CreateShardsRequest create;
  *create.add_dense() = Whole(Var("a", {2}));
  v1::CreateShardsResponse created;
  ASSERT_TRUE(store.CreateShards(create, &created).ok());

  v1::SaveShardsRequest save;
  save.set_checkpoint("ckpt-0000000001");
  save.set_checkpoint_path("/etc/evil");  // ignored: the ps has its own directory
  v1::SaveShardsResponse saved;
  ASSERT_TRUE(store.Save(save, &saved).ok());
  EXPECT_EQ(access((dir + "/ckpt-0000000001/ps-0").c_str(), F_OK), 0);
  EXPECT_NE(access("/etc/evil", F_OK), 0);

  for (const std::string name : {"../escaped", "/tmp/abs", ""}) {
    save.set_checkpoint(name);
    absl::Status s = store.Save(save, &saved);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_THAT(std::string(s.message()), HasSubstr("--checkpoint_dir")) << name;
  }
  EXPECT_NE(access((root + "/escaped").c_str(), F_OK), 0);

  // Once committed, no ps may add a file to it (the ps_index 7 of issue 14).
  ASSERT_TRUE(CommitManifest(dir + "/ckpt-0000000001", v1::CheckpointManifest()).ok());
  save.set_checkpoint("ckpt-0000000001");
  save.set_ps_index(7);
  absl::Status s = store.Save(save, &saved);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("never written into again"));
  EXPECT_NE(access((dir + "/ckpt-0000000001/ps-7").c_str(), F_OK), 0);

  // A restore reads only ps-<index> files of a named checkpoint.
  v1::SaveShardsResponse first;
  save.set_checkpoint("ckpt-0000000002");
  save.set_ps_index(0);
  ASSERT_TRUE(store.Save(save, &first).ok());
  v1::RestoreShardsRequest restore;
  restore.set_checkpoint("ckpt-0000000002");
  *restore.mutable_saved() = first.shards();
  v1::RestoreShardsResponse restored;
  ASSERT_TRUE(store.Restore(restore, &restored).ok());
  restore.mutable_saved(0)->set_file("../../ckpt-0000000001/ps-0");
  s = store.Restore(restore, &restored);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("expected ps-<index>"));
}

TEST(ParameterStoreCheckpointDirTest, WithoutADirectoryTlsRefusesToSaveAtAll) {
  ParameterStoreOptions options;
  options.require_checkpoint_dir = true;
  ParameterStore store(options);
  v1::SaveShardsRequest save;
  save.set_checkpoint_path(testing::TempDir() + "/anywhere");
  save.set_checkpoint("anywhere");
  v1::SaveShardsResponse saved;
  absl::Status s = store.Save(save, &saved);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("no --checkpoint_dir"));
  EXPECT_NE(access((testing::TempDir() + "/anywhere").c_str(), F_OK), 0);
}

// Found by fuzz/parameter_store_fuzzer (ASan, then its restore invariant): Restore read table
// rows with the live table's stride, past the end of rows saved with another dim; a table of
// another dim (whatever its stride) is now refused, with nothing restored.
// A save in two halves: SAVE_CUT copies the shards and answers; pushes applied after it are
// not in the checkpoint, which SAVE_AWAIT answers once written. An await of a checkpoint this
// task did not cut, and a second cut of the same checkpoint, are refused and change nothing.
TEST_F(ParameterStoreTest, ACutSaveHoldsTheValuesOfTheCutWhilePushesGoOn) {
  const std::string path = testing::TempDir() + "/cut_then_push";
  std::filesystem::remove_all(path);
  // The memory for the cut, made for the rows held now (none): the cut copies 3,000 more.
  v1::SaveShardsRequest prepare;
  prepare.set_phase(v1::SAVE_PREPARE);
  v1::SaveShardsResponse prepared;
  ASSERT_TRUE(store_.Save(prepare, &prepared).ok());
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 3000; ++k) keys.push_back(k * 7919);
  v1::PushSparseResponse sparse;
  ASSERT_TRUE(
      PushSparse(store_, "emb", keys, std::vector<float>(2 * keys.size(), 0.5f), &sparse).ok());
  v1::PushDenseResponse pushed;
  ASSERT_TRUE(Push(store_, {"b"}, {{1, 2, 3}}, 0, 0, &pushed).ok());
  const std::vector<float> at_cut = Read(store_, "b");
  std::vector<float> rows_at_cut;
  ASSERT_TRUE(PullSparse(store_, "emb", keys, &rows_at_cut).ok());
  v1::SaveShardsRequest save;
  save.set_checkpoint_path(path);
  save.set_phase(v1::SAVE_AWAIT);
  v1::SaveShardsResponse saved;
  absl::Status s = store_.Save(save, &saved);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("no save of " + path + " was cut on this ps task"));

  save.set_phase(v1::SAVE_CUT);
  ASSERT_TRUE(store_.Save(save, &saved).ok());
  EXPECT_EQ(saved.shards_size(), 0);  // answered before the write
  ASSERT_TRUE(Push(store_, {"b"}, {{10, 10, 10}}, 1, 0, &pushed).ok());
  ASSERT_NE(Read(store_, "b"), at_cut);
  ASSERT_TRUE(
      PushSparse(store_, "emb", keys, std::vector<float>(2 * keys.size(), 1.0f), &sparse).ok());

  v1::SaveShardsRequest other = save;
  other.set_checkpoint_path(path + "_other");
  other.set_phase(v1::SAVE_AWAIT);
  s = store_.Save(other, &saved);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("(the last was " + path + ")"));

  save.set_phase(v1::SAVE_AWAIT);
  ASSERT_TRUE(store_.Save(save, &saved).ok());
  EXPECT_EQ(saved.shards_size(), 3);
  // Awaited again (a retry): the same answer.
  v1::SaveShardsResponse again;
  ASSERT_TRUE(store_.Save(save, &again).ok());
  EXPECT_EQ(again.SerializeAsString(), saved.SerializeAsString());

  // A second cut of it would write a second time over the first: refused by the write.
  save.set_phase(v1::SAVE_CUT);
  ASSERT_TRUE(store_.Save(save, &again).ok());
  save.set_phase(v1::SAVE_AWAIT);
  EXPECT_EQ(store_.Save(save, &again).code(), absl::StatusCode::kInvalidArgument);

  // The checkpoint holds the cut: restored, "b" is what it was then, not after the push.
  ParameterStore restored{ParameterStoreOptions()};
  v1::CreateShardsRequest create;
  *create.add_dense() = Whole(Var("a", {2, 2}));
  *create.add_dense() = Whole(Var("b", {3}));
  *create.add_tables() = Table("emb", 2);
  v1::CreateShardsResponse created;
  ASSERT_TRUE(restored.CreateShards(create, &created).ok());
  v1::RestoreShardsRequest restore;
  restore.set_checkpoint_path(path);
  *restore.mutable_saved() = saved.shards();
  v1::RestoreShardsResponse restored_resp;
  ASSERT_TRUE(restored.Restore(restore, &restored_resp).ok());
  EXPECT_EQ(Read(restored, "b"), at_cut);
  std::vector<float> rows;
  ASSERT_TRUE(PullSparse(restored, "emb", keys, &rows).ok());
  EXPECT_EQ(rows, rows_at_cut);

  // A chief replaced by a newer one prepares nothing.
  prepare.set_chief_epoch(1);
  restored.Save(prepare, &prepared).IgnoreError();
  prepare.set_chief_epoch(2);
  ASSERT_TRUE(restored.Save(prepare, &prepared).ok());
  prepare.set_chief_epoch(1);
  EXPECT_EQ(restored.Save(prepare, &prepared).code(), absl::StatusCode::kFailedPrecondition);
}

// Incremental saves: a delta is cut only on the checkpoint this task cut last with its changes
// tracked (otherwise FAILED_PRECONDITION, nothing written), holds only the changed rows, and a
// full checkpoint with two deltas restores as the state at the last one, bit for bit. A task
// that was restored since, or never cut, refuses a delta.
TEST_F(ParameterStoreTest, IncrementalSavesRestoreThroughTheirChain) {
  const std::string dir = testing::TempDir() + "/incremental";
  std::filesystem::remove_all(dir);
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 3000; ++k) keys.push_back(k * 7919);
  const auto push_rows = [&](int64_t begin, int64_t end, float grad) {
    v1::PushSparseResponse sparse;
    const std::vector<int64_t> some(keys.begin() + begin, keys.begin() + end);
    ASSERT_TRUE(
        PushSparse(store_, "emb", some, std::vector<float>(2 * some.size(), grad), &sparse).ok());
  };
  const auto save = [&](ParameterStore& store, const std::string& name, const std::string& base,
                        v1::SaveShardsResponse* saved) {
    v1::SaveShardsRequest req;
    req.set_checkpoint_path(dir + "/" + name);
    req.set_delta_base(base);
    req.set_track_changes(true);
    return store.Save(req, saved);
  };
  push_rows(0, 2000, 0.5f);
  v1::SaveShardsResponse full, delta1, delta2;
  ASSERT_TRUE(save(store_, "ckpt-1", "", &full).ok());
  absl::Status s = save(store_, "ckpt-2", "ckpt-9", &delta1);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("this ps task's last cut was ckpt-1"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/ckpt-2")) << "nothing written";

  push_rows(1500, 2500, 0.25f);  // 500 old rows, 500 new
  v1::PushDenseResponse pushed;
  ASSERT_TRUE(Push(store_, {"b"}, {{1, 2, 3}}, 0, 0, &pushed).ok());
  ASSERT_TRUE(save(store_, "ckpt-2", "ckpt-1", &delta1).ok());
  push_rows(2400, 3000, 1.0f);
  push_rows(0, 10, 2.0f);
  ASSERT_TRUE(save(store_, "ckpt-3", "ckpt-2", &delta2).ok());
  const auto table_part = [](const v1::SaveShardsResponse& r) {
    for (const v1::SavedShard& s : r.shards()) {
      if (s.is_table()) return s;
    }
    return v1::SavedShard();
  };
  EXPECT_FALSE(table_part(full).delta());
  EXPECT_EQ(table_part(full).rows(), 2000);
  EXPECT_TRUE(table_part(delta1).delta());
  EXPECT_EQ(table_part(delta1).rows(), 1000);
  EXPECT_EQ(table_part(delta2).rows(), 610);
  EXPECT_EQ(table_part(delta2).removed_keys(), 0);
  std::vector<float> want;
  ASSERT_TRUE(PullSparse(store_, "emb", keys, &want).ok());  // every key has its row: no new one
  const std::vector<float> want_b = Read(store_, "b");

  ParameterStore restored{ParameterStoreOptions()};
  v1::CreateShardsRequest create;
  *create.add_dense() = Whole(Var("a", {2, 2}));
  *create.add_dense() = Whole(Var("b", {3}));
  *create.add_tables() = Table("emb", 2);
  v1::CreateShardsResponse created;
  ASSERT_TRUE(restored.CreateShards(create, &created).ok());
  v1::RestoreShardsRequest restore;
  restore.set_checkpoint_path(dir + "/ckpt-3");
  *restore.mutable_saved() = delta2.shards();
  v1::RestoreShardsResponse restored_resp;
  // Without the checkpoints it builds on, the delta alone cannot be restored.
  s = restored.Restore(restore, &restored_resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("the full checkpoint is missing"));
  for (const auto& [name, r] :
       {std::make_pair("ckpt-1", &full), std::make_pair("ckpt-2", &delta1)}) {
    v1::CheckpointLink* link = restore.add_chain();
    link->set_checkpoint_path(dir + "/" + name);
    *link->mutable_saved() = r->shards();
  }
  ASSERT_TRUE(restored.Restore(restore, &restored_resp).ok());
  std::vector<float> got;
  ASSERT_TRUE(PullSparse(restored, "emb", keys, &got).ok());
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
  EXPECT_EQ(Read(restored, "b"), want_b);
  v1::ListShardsResponse listed = restored.ListShards();
  for (const v1::ShardStats& stats : listed.shards()) {
    if (stats.is_table()) EXPECT_EQ(stats.rows(), 3000);
  }

  // Restored or never cut: no delta.
  v1::SaveShardsResponse refused;
  s = save(restored, "ckpt-4", "ckpt-3", &refused);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("did not record changes"));
  restore.clear_chain();
  restore.set_checkpoint_path(dir + "/ckpt-1");
  *restore.mutable_saved() = full.shards();
  ASSERT_TRUE(store_.Restore(restore, &restored_resp).ok());
  EXPECT_EQ(save(store_, "ckpt-4", "ckpt-3", &refused).code(),
            absl::StatusCode::kFailedPrecondition);
  // A full one is always possible, and a delta on it then.
  v1::SaveShardsResponse full4, delta5;
  ASSERT_TRUE(save(store_, "ckpt-4", "", &full4).ok());
  push_rows(0, 5, 1.0f);
  ASSERT_TRUE(save(store_, "ckpt-5", "ckpt-4", &delta5).ok());
  EXPECT_EQ(table_part(delta5).rows(), 5);
}

// A full checkpoint's table is read a batch at a time into a table beside the restored one,
// which takes its rows only once every part checked out: a part of many batches that fails
// its checksum at its end leaves the restored table as it was, serving, and the same
// checkpoint with its right checksum then restores every row exactly.
TEST(ParameterStoreRestoreTest, ATablePartThatFailsItsChecksumAtItsEndChangesNothing) {
  constexpr int64_t kRows = 100000;  // several of the restore's batches
  v1::CreateShardsRequest create;
  *create.add_tables() = Table("emb", 2);
  v1::CreateShardsResponse created;
  ParameterStore saver{ParameterStoreOptions()};
  ASSERT_TRUE(saver.CreateShards(create, &created).ok());
  std::vector<int64_t> keys(kRows);
  std::vector<float> grads(2 * kRows);
  for (int64_t i = 0; i < kRows; ++i) {
    keys[i] = i * 7 - 3000;
    grads[2 * i] = static_cast<float>(i);
    grads[2 * i + 1] = -0.5f;
  }
  v1::PushSparseResponse pushed;
  ASSERT_TRUE(PushSparse(saver, "emb", keys, grads, &pushed).ok());
  v1::SaveShardsRequest save;
  save.set_checkpoint_path(testing::TempDir() + "/late_checksum");
  v1::SaveShardsResponse saved;
  ASSERT_TRUE(saver.Save(save, &saved).ok());
  std::vector<float> want;
  ASSERT_TRUE(PullSparse(saver, "emb", keys, &want).ok());

  ParameterStore store{ParameterStoreOptions()};
  ASSERT_TRUE(store.CreateShards(create, &created).ok());
  const std::vector<int64_t> own = {1, 5, -3000, 123456789};
  ASSERT_TRUE(PushSparse(store, "emb", own, std::vector<float>(8, 2.0f), &pushed).ok());
  std::vector<float> own_before;
  ASSERT_TRUE(PullSparse(store, "emb", own, &own_before).ok());

  v1::RestoreShardsRequest restore;
  restore.set_checkpoint_path(save.checkpoint_path());
  *restore.mutable_saved() = saved.shards();
  ASSERT_EQ(restore.saved_size(), 1);
  ASSERT_EQ(restore.saved(0).rows(), kRows);
  restore.mutable_saved(0)->set_checksum(saved.shards(0).checksum() ^ 1);
  v1::RestoreShardsResponse restored;
  absl::Status s = store.Restore(restore, &restored);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("fails its checksum"));
  EXPECT_EQ(store.ListShards().shards(0).rows(), 4);
  std::vector<float> own_after;
  ASSERT_TRUE(PullSparse(store, "emb", own, &own_after).ok());
  EXPECT_EQ(own_after, own_before);
  EXPECT_EQ(store.ListShards().shards(0).rows(), 4);

  *restore.mutable_saved() = saved.shards();
  ASSERT_TRUE(store.Restore(restore, &restored).ok());
  EXPECT_EQ(store.ListShards().shards(0).rows(), kRows);
  std::vector<float> got;
  ASSERT_TRUE(PullSparse(store, "emb", keys, &got).ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ(store.ListShards().shards(0).rows(), kRows);  // 123456789 and 1, 5 are gone
}

TEST(ParameterStoreRestoreTest, ATableOfAnotherDimIsRefused) {
  ParameterStore saver{ParameterStoreOptions()};
  v1::CreateShardsRequest create;
  *create.add_tables() = Table("emb", 2);
  v1::CreateShardsResponse created;
  ASSERT_TRUE(saver.CreateShards(create, &created).ok());
  std::vector<float> rows;
  const int64_t keys[] = {1, 2};
  v1::PullSparseRequest pull;
  pull.set_table("emb");
  ASSERT_TRUE(saver.PullSparse(pull, keys, 2, &rows).ok());
  v1::SaveShardsRequest save;
  save.set_checkpoint_path(testing::TempDir() + "/other_dim");
  v1::SaveShardsResponse saved;
  ASSERT_TRUE(saver.Save(save, &saved).ok());

  ParameterStore store{ParameterStoreOptions()};
  create.mutable_tables(0)->mutable_table()->set_dim(3);
  ASSERT_TRUE(store.CreateShards(create, &created).ok());
  v1::RestoreShardsRequest restore;
  restore.set_checkpoint_path(save.checkpoint_path());
  *restore.mutable_saved() = saved.shards();
  v1::RestoreShardsResponse restored;
  const absl::Status s = store.Restore(restore, &restored);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("checkpoint table emb in ps-0 has dim 2, this ps task's table has dim 3"));
  EXPECT_EQ(store.ListShards().shards(0).rows(), 0);
}

// A vocabulary table's checkpoint restores into vocabulary tables on more ps tasks, each
// taking the ids of its shards; a table of the other kind (hashed) is refused, restoring
// nothing, as a hashed table's checkpoint is by a vocabulary table.
TEST(ParameterStoreRestoreTest, AVocabularyTableRestoresIntoVocabularyTablesOnly) {
  v1::TableShardSpec vocabulary = Table("emb", 2);
  vocabulary.mutable_table()->set_vocabulary_size(100);
  ParameterStore saver{ParameterStoreOptions()};
  v1::CreateShardsRequest create;
  *create.add_tables() = vocabulary;
  v1::CreateShardsResponse created;
  ASSERT_TRUE(saver.CreateShards(create, &created).ok());
  std::vector<int64_t> keys;
  for (int64_t id = 0; id < 100; id += 3) keys.push_back(id);
  std::vector<float> grads(keys.size() * 2);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.25f * static_cast<float>(i % 7);
  v1::PushSparseResponse pushed;
  ASSERT_TRUE(PushSparse(saver, "emb", keys, grads, &pushed).ok());
  std::vector<float> want;
  ASSERT_TRUE(PullSparse(saver, "emb", keys, &want).ok());
  v1::SaveShardsRequest save;
  save.set_checkpoint_path(testing::TempDir() + "/vocabulary");
  v1::SaveShardsResponse saved;
  ASSERT_TRUE(saver.Save(save, &saved).ok());
  v1::RestoreShardsRequest restore;
  restore.set_checkpoint_path(save.checkpoint_path());
  *restore.mutable_saved() = saved.shards();
  v1::RestoreShardsResponse restored;

  // Two tasks, shards {0, 2} and {1, 3}: each restores the ids it owns (id mod 4).
  std::unique_ptr<ParameterStore> tasks[2];
  for (int t = 0; t < 2; ++t) {
    tasks[t] = std::make_unique<ParameterStore>(ParameterStoreOptions());
    v1::CreateShardsRequest part = create;
    part.mutable_tables(0)->clear_virtual_shards();
    part.mutable_tables(0)->add_virtual_shards(t);
    part.mutable_tables(0)->add_virtual_shards(t + 2);
    ASSERT_TRUE(tasks[t]->CreateShards(part, &created).ok());
    ASSERT_TRUE(tasks[t]->Restore(restore, &restored).ok());
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    std::vector<float> row;
    ASSERT_TRUE(PullSparse(*tasks[keys[i] % 2], "emb", {keys[i]}, &row).ok());
    EXPECT_EQ(row, std::vector<float>(want.begin() + 2 * i, want.begin() + 2 * i + 2))
        << "id " << keys[i];
  }
  EXPECT_EQ(tasks[0]->ListShards().shards(0).rows() + tasks[1]->ListShards().shards(0).rows(),
            static_cast<int64_t>(keys.size()));

  ParameterStore hashed{ParameterStoreOptions()};
  v1::CreateShardsRequest other = create;
  other.mutable_tables(0)->mutable_table()->set_vocabulary_size(0);
  ASSERT_TRUE(hashed.CreateShards(other, &created).ok());
  const absl::Status s = hashed.Restore(restore, &restored);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("checkpoint table emb in ps-0 has vocabulary_size 100, this ps task's "
                        "table has vocabulary_size 0 (0: hashed)"));
  EXPECT_EQ(hashed.ListShards().shards(0).rows(), 0);
}

// Found by fuzz/parameter_store_fuzzer: a variable named with bytes that are not UTF-8 was
// created and saved, but the JSON manifest could not carry its name, so the checkpoint named
// a shard that did not exist and could never be read back.
TEST(ParameterStoreNamesTest, NamesMustBeUtf8) {
  ParameterStore store{ParameterStoreOptions()};
  v1::CreateShardsRequest req;
  *req.add_dense() = Whole(Var("w\x8e", {2}));
  v1::CreateShardsResponse resp;
  absl::Status s = store.CreateShards(req, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("variable name \"w\\x8e\" is not valid UTF-8; names must be UTF-8"));
  v1::CreateShardsRequest tables;
  *tables.add_tables() = Table("\xed\xa0\x80", 2);  // a UTF-16 surrogate
  s = store.CreateShards(tables, &resp);
  EXPECT_THAT(std::string(s.message()), HasSubstr("table name"));
  EXPECT_TRUE(store.ListShards().shards().empty());
  v1::CreateShardsRequest ok;
  *ok.add_dense() =
      Whole(Var("w\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", {2}));  // w, e-acute, euro, emoji
  EXPECT_TRUE(store.CreateShards(ok, &resp).ok());
}

}  // namespace
}  // namespace pscluster
