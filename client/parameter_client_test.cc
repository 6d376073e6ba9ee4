#include "client/parameter_client.h"

#include <atomic>
#include <cmath>
#include <vector>

#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/in_process_ps_transport.h"
#include "ps_server/initializer.h"
#include "sharding/placement.h"

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
  w->mutable_initializer()->set_seed(7);
  w->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.5f);
  v1::VariableSpec* b = model.add_variables();
  b->set_name("b");
  b->mutable_shape()->add_dims(3);
  b->mutable_optimizer()->mutable_sgd()->set_learning_rate(0.5f);
  v1::TableSpec* t = model.add_tables();
  t->set_name("emb");
  t->set_dim(4);
  t->mutable_initializer()->set_kind(v1::InitializerSpec::UNIFORM);
  t->mutable_initializer()->set_min(-1);
  t->mutable_initializer()->set_max(1);
  t->mutable_optimizer()->mutable_sgd()->set_learning_rate(1.0f);
  // A dim the row copies have no fixed-size loop for.
  v1::TableSpec* odd = model.add_tables();
  *odd = *t;
  odd->set_name("odd");
  odd->set_dim(3);
  return model;
}

struct Fixture {
  InProcessPsTransport* transport = nullptr;  // owned by client
  std::unique_ptr<ParameterClient> client;
};

Fixture Make(int num_ps, ParameterClientOptions options = {}) {
  v1::PlacementOptions placement_options;
  placement_options.set_max_partition_bytes(36);  // w: 3 rows of 12 bytes per partition
  placement_options.set_num_virtual_shards(16);
  auto placement = ComputePlacement(Model(), num_ps, placement_options);
  CHECK(placement.ok()) << placement.status();
  auto transport = std::make_unique<InProcessPsTransport>(num_ps, ParameterStoreOptions());
  Fixture f;
  f.transport = transport.get();
  options.initial_backoff = absl::Milliseconds(1);
  auto client = ParameterClient::Create(Model(), *placement, std::move(transport), options);
  CHECK(client.ok()) << client.status();
  f.client = *std::move(client);
  CHECK(f.client->CreateAll(v1::SyncOptions()).ok());
  return f;
}

TEST(ParameterClientTest, PullJoinsPartitionsFromEveryPs) {
  Fixture f = Make(3);
  ASSERT_GT(f.client->placement().partitions_size(), 3);
  std::vector<std::vector<float>> values;
  ASSERT_TRUE(f.client->Pull({"b", "w"}, &values).ok());
  ASSERT_EQ(values[1].size(), 30u);
  std::vector<float> whole(30);
  ASSERT_TRUE(InitializeDense(Model().variables(0).initializer(), "w", Model().variables(0).shape(),
                              0, whole.data(), 30)
                  .ok());
  EXPECT_EQ(values[1], whole);
  EXPECT_THAT(values[0], ::testing::Each(0.0f));
  // Every ps task took part.
  for (int ps = 0; ps < 3; ++ps) EXPECT_GT(f.transport->calls(ps), 1) << ps;
}

TEST(ParameterClientTest, PushSplitsGradientsAcrossPartitions) {
  Fixture f = Make(2);
  std::vector<float> gw(30), gb = {1, 2, 3};
  for (int i = 0; i < 30; ++i) gw[i] = i;
  std::vector<std::vector<float>> before, after;
  ASSERT_TRUE(f.client->Pull({"w", "b"}, &before).ok());
  ASSERT_TRUE(f.client->Push({"w", "b"}, {gw.data(), gb.data()}, 0).ok());
  ASSERT_TRUE(f.client->Pull({"w", "b"}, &after).ok());
  for (int i = 0; i < 30; ++i) EXPECT_FLOAT_EQ(after[0][i], before[0][i] - 0.5f * i) << i;
  EXPECT_THAT(after[1], ::testing::ElementsAre(-0.5f, -1.0f, -1.5f));
}

TEST(ParameterClientTest, SparseRowsAreRoutedAndGatheredInOrder) {
  Fixture f = Make(3);
  std::vector<int64_t> keys;
  for (int64_t k = -50; k < 50; ++k) keys.push_back(k * 7919);
  std::vector<float> rows(keys.size() * 4);
  ASSERT_TRUE(f.client->PullRows("emb", keys.data(), keys.size(), rows.data()).ok());
  for (size_t i = 0; i < keys.size(); ++i) {
    float expected[4];
    ASSERT_TRUE(InitializeRow(Model().tables(0).initializer(), "emb", keys[i], 4, expected).ok());
    for (int j = 0; j < 4; ++j) ASSERT_EQ(rows[i * 4 + j], expected[j]) << keys[i];
  }
  // Push 1.0 to every element of the first key twice (duplicates are summed).
  std::vector<int64_t> push_keys = {keys[0], keys[0]};
  std::vector<float> grads(8, 1.0f);
  ASSERT_TRUE(f.client->PushRows("emb", push_keys.data(), 2, grads.data(), 0).ok());
  std::vector<float> row(4);
  ASSERT_TRUE(f.client->PullRows("emb", keys.data(), 1, row.data()).ok());
  for (int j = 0; j < 4; ++j) EXPECT_FLOAT_EQ(row[j], rows[j] - 2.0f);
}

// Every key's row reaches its ps task and comes back to its own position, for a dim with a
// fixed-size copy (4) and one without (3): each key gets its own gradient, and after the push
// each row is its initial value less exactly that gradient (SGD, learning rate 1).
TEST(ParameterClientTest, SparsePushAndPullKeepEachKeysRowAcrossTasks) {
  Fixture f = Make(3);
  for (const auto& [table, dim] : {std::pair<std::string, int64_t>{"emb", 4}, {"odd", 3}}) {
    SCOPED_TRACE(table);
    std::vector<int64_t> keys;
    for (int64_t k = 0; k < 300; ++k) keys.push_back(k * 104729 - 7000000);
    const int64_t n = static_cast<int64_t>(keys.size());
    std::vector<float> before(n * dim), after(n * dim), grads(n * dim);
    for (int64_t j = 0; j < n * dim; ++j) grads[j] = static_cast<float>(j % 97) / 8.0f;
    ASSERT_TRUE(f.client->PullRows(table, keys.data(), n, before.data()).ok());
    ASSERT_TRUE(f.client->PushRows(table, keys.data(), n, grads.data(), 0).ok());
    ASSERT_TRUE(f.client->PullRows(table, keys.data(), n, after.data()).ok());
    for (int64_t i = 0; i < n; ++i) {
      float initial[4];
      ASSERT_TRUE(
          InitializeRow(Model().tables(0).initializer(), table, keys[i], dim, initial).ok());
      for (int64_t d = 0; d < dim; ++d) {
        ASSERT_EQ(before[i * dim + d], initial[d]) << "key " << keys[i];
        ASSERT_EQ(after[i * dim + d], initial[d] - grads[i * dim + d]) << "key " << keys[i];
      }
    }
  }
  for (int ps = 0; ps < 3; ++ps) EXPECT_GT(f.transport->calls(ps), 1) << ps;
}

TEST(ParameterClientTest, RetriesUnavailableThenGivesUp) {
  ParameterClientOptions options;
  options.max_attempts = 3;
  Fixture f = Make(2, options);
  std::vector<std::vector<float>> values;
  f.transport->FailNextCalls(1, 2);
  EXPECT_TRUE(f.client->Pull({"w"}, &values).ok());
  f.transport->FailNextCalls(1, 3);
  absl::Status s = f.client->Pull({"w"}, &values);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ps:1 is unavailable"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("gave up after 3 attempts"));
}

// A task its caller knows to be lost (ParameterClientOptions::lost: the chief's, for one whose
// heartbeats stopped) is not tried again; the others are, as before, and so are pulls and
// pushes (a failover plans those again: the client's routes change, ABORTED).
TEST(ParameterClientTest, GivesUpAtOnceOnATaskKnownLost) {
  ParameterClientOptions options;
  options.max_attempts = 20;
  std::atomic<int> asked{0};
  options.lost = [&asked](int ps) {
    asked.fetch_add(1);
    return ps == 1;
  };
  Fixture f = Make(2, options);
  f.transport->FailNextCalls(1, 5);
  absl::StatusOr<v1::ListShardsResponse> listed = f.client->ListShards(1);
  EXPECT_EQ(listed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(listed.status().message()),
              HasSubstr("gave up after 1 attempts: ps:1 is lost"));
  EXPECT_EQ(asked.load(), 1);
  f.transport->FailNextCalls(1, 3);
  std::vector<std::vector<float>> values;
  EXPECT_TRUE(f.client->Pull({"w"}, &values).ok());
  EXPECT_EQ(asked.load(), 1);
  f.transport->FailNextCalls(0, 3);
  EXPECT_TRUE(f.client->ListShards(0).ok());
  EXPECT_EQ(asked.load(), 4);  // ps:0's three retries asked too
}

TEST(ParameterClientTest, Fp16WireRoundsWithinItsBound) {
  ParameterClientOptions options;
  options.wire_dtype = v1::DT_FLOAT16;
  Fixture half = Make(2, options);
  Fixture exact = Make(2);
  std::vector<std::vector<float>> h, e;
  ASSERT_TRUE(half.client->Pull({"w"}, &h).ok());
  ASSERT_TRUE(exact.client->Pull({"w"}, &e).ok());
  int differ = 0;
  for (size_t i = 0; i < e[0].size(); ++i) {
    EXPECT_LE(std::abs(h[0][i] - e[0][i]), std::abs(e[0][i]) * std::ldexp(1.0, -11)) << i;
    differ += h[0][i] != e[0][i];
  }
  EXPECT_GT(differ, 0);  // fp16 really was used
}

TEST(ParameterClientTest, RefusesUnknownNamesAndMismatchedPlacements) {
  Fixture f = Make(2);
  std::vector<std::vector<float>> values;
  absl::Status s = f.client->Pull({"nope"}, &values);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown variable nope"));
  int64_t key = 1;
  float row[4];
  EXPECT_EQ(f.client->PullRows("nope", &key, 1, row).code(), absl::StatusCode::kNotFound);

  auto placement = ComputePlacement(Model(), 3, v1::PlacementOptions());
  auto client = ParameterClient::Create(
      Model(), *placement, std::make_unique<InProcessPsTransport>(2, ParameterStoreOptions()), {});
  EXPECT_EQ(client.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(client.status().message()),
              HasSubstr("placement is for 3 ps tasks but 2 are reachable"));
}

}  // namespace
}  // namespace pscluster
