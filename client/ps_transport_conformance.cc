#include "client/ps_transport_conformance.h"

#include <cmath>
#include <limits>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/parameter_client.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "sharding/placement.h"
#include "testing/small_model.h"

namespace pscluster {

v1::ModelSpec ConformanceModel() {
  v1::ModelSpec model;
  CHECK(google::protobuf::TextFormat::ParseFromString(kSmallModelText, &model));
  return model;
}

v1::Placement ConformancePlacement() {
  v1::PlacementOptions options;
  options.set_max_partition_bytes(1024);
  options.set_num_virtual_shards(1024);
  absl::StatusOr<v1::Placement> p = ComputePlacement(ConformanceModel(), 2, options);
  CHECK(p.ok()) << p.status();
  return *p;
}

void PsTransportConformanceTest::SetUp() {
  env_ = GetParam().make();
  ASSERT_NE(env_, nullptr);
}

namespace {

using ::testing::HasSubstr;

struct Shard {
  int ps = 0;
  v1::ShardRef ref;
  int64_t num_elements = 0;
};

// Where each partition of w and b lives.
std::map<std::string, std::vector<Shard>> Shards() {
  std::map<std::string, std::vector<Shard>> out;
  const v1::Placement placement = ConformancePlacement();
  for (const v1::DensePartition& p : placement.partitions()) {
    Shard s;
    s.ps = p.ps_task();
    s.ref.set_variable(p.variable());
    s.ref.set_partition(p.partition());
    s.num_elements = (p.row_end() - p.row_begin()) * (p.variable() == "w" ? 16 : 1);
    out[p.variable()].push_back(s);
  }
  return out;
}

std::unique_ptr<ParameterClient> Client(std::unique_ptr<PsTransport> transport,
                                        ParameterClientOptions options = {}) {
  auto client = ParameterClient::Create(ConformanceModel(), ConformancePlacement(),
                                        std::move(transport), options);
  CHECK(client.ok()) << client.status();
  return *std::move(client);
}

std::vector<float> PullOne(PsTransport& t, const Shard& s, v1::DataType wire = v1::DT_FLOAT32) {
  std::vector<float> v(s.num_elements, -99);
  DenseSlice slice;
  slice.ref = s.ref;
  slice.num_elements = s.num_elements;
  slice.pull_into = v.data();
  absl::Status st = t.PullDense(s.ps, {slice}, wire, -1);
  CHECK(st.ok()) << st;
  return v;
}

absl::Status PushOne(PsTransport& t, const Shard& s, const std::vector<float>& g,
                     const PushMeta& meta, v1::PushDenseResponse* resp) {
  DenseSlice slice;
  slice.ref = s.ref;
  slice.num_elements = static_cast<int64_t>(g.size());
  slice.push_from = g.data();
  return t.PushDense(s.ps, {slice}, meta, resp);
}

TEST_P(PsTransportConformanceTest, PushesApplyTheOptimizerAndPullsSeeIt) {
  std::unique_ptr<ParameterClient> client = Client(env_->NewTransport());
  std::vector<std::vector<float>> before, after;
  ASSERT_TRUE(client->Pull({"w", "b"}, &before).ok()) << env_->Logs();
  ASSERT_EQ(before[0].size(), 64u * 16);
  std::vector<float> gw(64 * 16), gb(16);
  for (size_t i = 0; i < gw.size(); ++i) gw[i] = static_cast<float>(i % 7) - 3;
  for (size_t i = 0; i < gb.size(); ++i) gb[i] = 0.25f * static_cast<float>(i);
  ASSERT_TRUE(client->Push({"w", "b"}, {gw.data(), gb.data()}, 0).ok());
  ASSERT_TRUE(client->Pull({"w", "b"}, &after).ok());
  for (size_t i = 0; i < gw.size(); ++i) {
    ASSERT_EQ(after[0][i], before[0][i] - gw[i] * 0.5f) << i;
  }
  for (size_t i = 0; i < gb.size(); ++i) ASSERT_EQ(after[1][i], -gb[i] * 0.5f) << i;
}

TEST_P(PsTransportConformanceTest, SixteenBitWiresRoundAsTheCodecDoes) {
  std::unique_ptr<PsTransport> t = env_->NewTransport();
  const Shard w0 = Shards()["w"][0];
  const std::vector<float> exact = PullOne(*t, w0);
  const std::vector<float> half = PullOne(*t, w0, v1::DT_FLOAT16);
  const std::vector<float> bf16 = PullOne(*t, w0, v1::DT_BFLOAT16);
  for (size_t i = 0; i < exact.size(); ++i) {
    EXPECT_NEAR(half[i], exact[i], std::abs(exact[i]) * std::ldexp(1.0, -11) + 1e-7) << i;
    EXPECT_NEAR(bf16[i], exact[i], std::abs(exact[i]) * std::ldexp(1.0, -8) + 1e-7) << i;
  }
  // A bfloat16 push of 1.0 is exact: the same SGD step as float32.
  PushMeta meta;
  meta.wire_dtype = v1::DT_BFLOAT16;
  v1::PushDenseResponse resp;
  ASSERT_TRUE(PushOne(*t, w0, std::vector<float>(w0.num_elements, 1.0f), meta, &resp).ok());
  const std::vector<float> pushed = PullOne(*t, w0);
  for (size_t i = 0; i < exact.size(); ++i) ASSERT_EQ(pushed[i], exact[i] - 0.5f) << i;
}

TEST_P(PsTransportConformanceTest, SparseRowsAreCreatedOnFirstTouchAndUpdated) {
  std::unique_ptr<ParameterClient> client = Client(env_->NewTransport());
  std::vector<int64_t> keys = {5, -17, 123456789012345, 5};
  std::vector<float> rows(keys.size() * 8), again(keys.size() * 8);
  ASSERT_TRUE(client->PullRows("emb", keys.data(), keys.size(), rows.data()).ok());
  for (int d = 0; d < 8; ++d) EXPECT_EQ(rows[d], rows[3 * 8 + d]);  // the same key twice
  for (float v : rows) {
    EXPECT_GE(v, -0.5f);
    EXPECT_LE(v, 0.5f);
  }
  std::vector<float> grads(keys.size() * 8, 1.0f);
  ASSERT_TRUE(client->PushRows("emb", keys.data(), keys.size(), grads.data(), 0).ok());
  ASSERT_TRUE(client->PullRows("emb", keys.data(), keys.size(), again.data()).ok());
  // Adagrad, lr 0.1, initial accumulator 0.1: key 5's gradient is the sum 2 of its two rows.
  const float step5 = 0.1f * 2.0f / (std::sqrt(0.1f + 4.0f) + 1e-7f);
  const float step1 = 0.1f * 1.0f / (std::sqrt(0.1f + 1.0f) + 1e-7f);
  for (int d = 0; d < 8; ++d) {
    EXPECT_NEAR(again[d], rows[d] - step5, 1e-6);
    EXPECT_NEAR(again[8 + d], rows[8 + d] - step1, 1e-6);
  }
}

// PushSparseGather sends the rows at the positions it is given, each key with its own row, on
// a float32 and a 16-bit wire alike.
TEST_P(PsTransportConformanceTest, PushSparseGatherSendsEachKeyItsOwnRow) {
  std::unique_ptr<PsTransport> t = env_->NewTransport();
  const v1::Placement placement = ConformancePlacement();
  for (const v1::DataType wire : {v1::DT_FLOAT32, v1::DT_BFLOAT16}) {
    SCOPED_TRACE(v1::DataType_Name(wire));
    // A request of 400 keys, of which the part for ps 0, in an order of its own (reversed).
    std::vector<int64_t> keys(400);
    std::vector<float> grads(keys.size() * 8);
    for (size_t i = 0; i < keys.size(); ++i) {
      keys[i] = static_cast<int64_t>(i) * 7919 + (wire == v1::DT_FLOAT32 ? 1 : 2);
      // Multiples of 1/4 in [-2, 2): exact in bfloat16 too.
      for (int d = 0; d < 8; ++d)
        grads[i * 8 + d] = 0.25f * static_cast<float>((i + 3 * d) % 16) - 2;
    }
    std::vector<int64_t> positions;
    for (int64_t i = static_cast<int64_t>(keys.size()) - 1; i >= 0; --i) {
      if (PsOfKey(placement, keys[i]) == 0) positions.push_back(i);
    }
    ASSERT_GT(positions.size(), 100u);
    const int64_t n = static_cast<int64_t>(positions.size());
    std::vector<int64_t> part_keys;
    for (int64_t p : positions) part_keys.push_back(keys[p]);
    std::vector<float> before(n * 8), after(n * 8);
    ASSERT_TRUE(
        t->PullSparse(0, "emb", part_keys.data(), n, 8, v1::DT_FLOAT32, -1, before.data()).ok())
        << env_->Logs();
    PushMeta meta;
    meta.wire_dtype = wire;
    v1::PushSparseResponse resp;
    absl::Status s = t->PushSparseGather(0, "emb", keys.data(), positions.data(), n, 8,
                                         grads.data(), meta, &resp);
    ASSERT_TRUE(s.ok()) << s << env_->Logs();
    ASSERT_TRUE(
        t->PullSparse(0, "emb", part_keys.data(), n, 8, v1::DT_FLOAT32, -1, after.data()).ok());
    // Adagrad, lr 0.1, initial accumulator 0.1, each row's first update.
    for (int64_t i = 0; i < n; ++i) {
      for (int d = 0; d < 8; ++d) {
        const float g = grads[positions[i] * 8 + d];
        const float step = 0.1f * g / (std::sqrt(0.1f + g * g) + 1e-7f);
        ASSERT_NEAR(after[i * 8 + d], before[i * 8 + d] - step, 1e-6)
            << "key " << part_keys[i] << " element " << d;
      }
    }
  }
}

// A sparse request larger than what a ps task takes is split by the client; one sent whole
// is refused before any row is created.
TEST_P(PsTransportConformanceTest, LargeSparseRequestsAreSplitAndOversizeOnesChangeNothing) {
  ParameterClientOptions options;
  options.max_sparse_keys_per_request = kConformanceMaxSparseKeys;
  std::unique_ptr<ParameterClient> client = Client(env_->NewTransport(), options);
  const int64_t n = 5 * kConformanceMaxSparseKeys;
  std::vector<int64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) keys[i] = i * 7919;
  std::vector<float> rows(n * 8);
  ASSERT_TRUE(client->PullRows("emb", keys.data(), n, rows.data()).ok()) << env_->Logs();
  std::vector<float> grads(n * 8, 0.5f);
  ASSERT_TRUE(client->PushRows("emb", keys.data(), n, grads.data(), 0).ok());
  std::vector<float> after(n * 8);
  ASSERT_TRUE(client->PullRows("emb", keys.data(), n, after.data()).ok());
  const float step = 0.1f * 0.5f / (std::sqrt(0.1f + 0.25f) + 1e-7f);
  for (int64_t i = 0; i < n * 8; i += 97) ASSERT_NEAR(after[i], rows[i] - step, 1e-6) << i;

  std::unique_ptr<PsTransport> t = env_->NewTransport();
  std::vector<int64_t> fresh(kConformanceMaxSparseKeys + 1);
  for (size_t i = 0; i < fresh.size(); ++i) fresh[i] = -1000000 - static_cast<int64_t>(i);
  int64_t rows_before = 0;
  for (int ps = 0; ps < 2; ++ps) {
    auto list = t->ListShards(ps, v1::ListShardsRequest());
    ASSERT_TRUE(list.ok());
    for (const v1::ShardStats& s : list->shards()) rows_before += s.rows();
  }
  std::vector<float> out(fresh.size() * 8);
  // Every key to ps 0, whole: the ps refuses it.
  absl::Status s =
      t->PullSparse(0, "emb", fresh.data(), fresh.size(), 8, v1::DT_FLOAT32, -1, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("over this ps task's limit of 1000 keys"));
  int64_t rows_after = 0;
  for (int ps = 0; ps < 2; ++ps) {
    auto list = t->ListShards(ps, v1::ListShardsRequest());
    ASSERT_TRUE(list.ok());
    for (const v1::ShardStats& st : list->shards()) rows_after += st.rows();
  }
  EXPECT_EQ(rows_after, rows_before);
}

// The same request id twice: applied once, and the second answer says so.
TEST_P(PsTransportConformanceTest, APushRepeatedWithItsIdIsAppliedOnce) {
  std::unique_ptr<PsTransport> t = env_->NewTransport();
  const Shard b = Shards()["b"][0];
  PushMeta meta;
  meta.request_id.set_client(0xfeedULL);
  meta.request_id.set_seq(1);
  v1::PushDenseResponse first, second;
  ASSERT_TRUE(PushOne(*t, b, std::vector<float>(16, 1.0f), meta, &first).ok());
  // From another connection, as a retry after a lost answer would come.
  std::unique_ptr<PsTransport> other = env_->NewTransport();
  ASSERT_TRUE(PushOne(*other, b, std::vector<float>(16, 1.0f), meta, &second).ok());
  EXPECT_FALSE(first.duplicate());
  EXPECT_TRUE(second.duplicate());
  EXPECT_EQ(second.accepted(), 1);
  EXPECT_THAT(PullOne(*t, b), ::testing::Each(-0.5f));
  // The sparse path too.
  const int64_t key = 77;
  std::vector<float> row(8), after(8), g(8, 1.0f);
  ASSERT_TRUE(t->PullSparse(PsOfKey(ConformancePlacement(), key), "emb", &key, 1, 8, v1::DT_FLOAT32,
                            -1, row.data())
                  .ok());
  meta.request_id.set_seq(2);
  v1::PushSparseResponse s1, s2;
  const int ps = PsOfKey(ConformancePlacement(), key);
  ASSERT_TRUE(t->PushSparse(ps, "emb", &key, 1, 8, g.data(), meta, &s1).ok());
  ASSERT_TRUE(other->PushSparse(ps, "emb", &key, 1, 8, g.data(), meta, &s2).ok());
  EXPECT_FALSE(s1.duplicate());
  EXPECT_TRUE(s2.duplicate());
  ASSERT_TRUE(t->PullSparse(ps, "emb", &key, 1, 8, v1::DT_FLOAT32, -1, after.data()).ok());
  const float step = 0.1f / (std::sqrt(1.1f) + 1e-7f);
  for (int d = 0; d < 8; ++d) EXPECT_NEAR(after[d], row[d] - step, 1e-6);
}

// Bad requests get the same error from every transport, and change nothing.
TEST_P(PsTransportConformanceTest, BadRequestsAreRefusedAlikeAndChangeNothing) {
  std::unique_ptr<PsTransport> t = env_->NewTransport();
  const Shard b = Shards()["b"][0];
  const std::vector<float> before = PullOne(*t, b);
  v1::PushDenseResponse resp;
  PushMeta meta;

  // A gradient of the wrong size.
  absl::Status s = PushOne(*t, b, std::vector<float>(15, 1.0f), meta, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("variable b/0: gradient has 15 elements, expected 16"));

  // A NaN.
  std::vector<float> nan_grad(16, 1.0f);
  nan_grad[3] = std::numeric_limits<float>::quiet_NaN();
  s = PushOne(*t, b, nan_grad, meta, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("variable b/0: gradient element 3 is nan"));

  // A shard named twice.
  DenseSlice slice;
  slice.ref = b.ref;
  slice.num_elements = 16;
  std::vector<float> ones(16, 1.0f);
  slice.push_from = ones.data();
  s = t->PushDense(b.ps, {slice, slice}, meta, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("variable b/0 is named twice in one push"));

  // An unknown shard, pulled and pushed.
  Shard nope = b;
  nope.ref.set_variable("nope");
  std::vector<float> out(16);
  slice.ref = nope.ref;
  slice.pull_into = out.data();
  s = t->PullDense(b.ps, {slice}, v1::DT_FLOAT32, -1);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown variable nope/0"));
  s = PushOne(*t, nope, ones, meta, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;

  // A wire dtype that is not a float encoding.
  meta.wire_dtype = v1::DT_INT64;
  s = PushOne(*t, b, ones, meta, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("DT_INT64"));
  meta.wire_dtype = v1::DT_FLOAT32;

  // Sparse: an unknown table, a key of the other ps task, an Inf gradient.
  const int64_t key = 1;
  std::vector<float> g(8, 1.0f);
  v1::PushSparseResponse sresp;
  s = t->PushSparse(0, "nope", &key, 1, 8, g.data(), meta, &sresp);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown table nope"));
  const int owner = PsOfKey(ConformancePlacement(), key);
  s = t->PushSparse(1 - owner, "emb", &key, 1, 8, g.data(), meta, &sresp);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("placement mismatch"));
  g[2] = std::numeric_limits<float>::infinity();
  s = t->PushSparse(owner, "emb", &key, 1, 8, g.data(), meta, &sresp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("non-finite"));
  v1::InspectShardRequest inspect;
  inspect.mutable_shard()->set_variable("emb");
  inspect.mutable_shard()->set_partition(-1);
  inspect.add_keys(key);
  auto found = t->InspectShard(owner, inspect);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->missing_keys_size(), 1);  // no refused request created the row

  // Nothing changed, and the transport still works.
  EXPECT_EQ(PullOne(*t, b), before);
  ASSERT_TRUE(PushOne(*t, b, ones, meta, &resp).ok());
  const std::vector<float> after = PullOne(*t, b);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(after[i], before[i] - 0.5f);
}

// Concurrent calls on one transport: each client's pushes all arrive, exactly once.
TEST_P(PsTransportConformanceTest, ConcurrentCallsShareATransport) {
  std::unique_ptr<ParameterClient> client = Client(env_->NewTransport());
  std::vector<std::vector<float>> before;
  ASSERT_TRUE(client->Pull({"b"}, &before).ok());
  constexpr int kThreads = 4, kPushes = 25;
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      std::vector<float> g(16, 0.125f);
      std::vector<std::vector<float>> pulled;
      for (int k = 0; k < kPushes && errors[i].ok(); ++k) {
        errors[i] = client->Push({"b"}, {g.data()}, k);
        if (errors[i].ok()) errors[i] = client->Pull({"w", "b"}, &pulled);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  for (const absl::Status& e : errors) ASSERT_TRUE(e.ok()) << e;
  std::vector<std::vector<float>> after;
  ASSERT_TRUE(client->Pull({"b"}, &after).ok());
  // 100 SGD steps of 0.5 * 0.125, each exact in float.
  for (int i = 0; i < 16; ++i) EXPECT_EQ(after[0][i], before[0][i] - 100 * 0.0625f);
  EXPECT_EQ(client->duplicate_pushes(), 0);
}

}  // namespace
}  // namespace pscluster
