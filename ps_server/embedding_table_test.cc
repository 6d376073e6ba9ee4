#include "ps_server/embedding_table.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "proto/model.pb.h"
#include "proto/ps_service.pb.h"
#include "ps_server/initializer.h"
#include "ps_server/optimizer.h"
#include "sharding/sparse_hash.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::TableSpec ParseTable(const std::string& text) {
  v1::TableSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec)) << text;
  return spec;
}

// A table that owns every key (one virtual shard).
std::unique_ptr<EmbeddingTable> CreateOrNull(const v1::TableSpec& spec,
                                             std::vector<int32_t> owned = {0},
                                             int32_t num_virtual_shards = 1) {
  absl::StatusOr<std::unique_ptr<EmbeddingTable>> table =
      EmbeddingTable::Create(spec, std::move(owned), num_virtual_shards);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? *std::move(table) : nullptr;
}

std::vector<float> PullOrDie(EmbeddingTable& table, const std::vector<int64_t>& keys) {
  std::vector<float> out(keys.size() * table.dim(), -12345.0f);
  absl::Status status = table.Pull(keys.data(), static_cast<int64_t>(keys.size()), out.data());
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

absl::Status Push(EmbeddingTable& table, const std::vector<int64_t>& keys,
                  const std::vector<float>& grads, bool allow_non_finite = false) {
  EXPECT_EQ(grads.size(), keys.size() * table.dim());
  return table.Push(keys.data(), static_cast<int64_t>(keys.size()), grads.data(), allow_non_finite);
}

// Sparse updates flush denormals to zero too (optimizer.h).
TEST(EmbeddingTableTest, UpdatesFlushDenormalsToZero) {
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(R"pb(
    name: "emb"
    dim: 2
    initializer { kind: CONSTANT value: 2e-38 }
    optimizer { sgd { learning_rate: 1 } }
  )pb"));
  ASSERT_NE(table, nullptr);
  ASSERT_TRUE(Push(*table, {3}, {1.5e-38f, 0.0f}).ok());
  // 2e-38 - 1.5e-38 is denormal: 0. The untouched element stays 2e-38.
  EXPECT_THAT(PullOrDie(*table, {3}), ::testing::ElementsAre(0.0f, 2e-38f));
}

struct Row {
  std::vector<float> values_and_slots;
  int64_t t = 0;
  // Bitwise comparison, so that NaN rows compare equal to themselves.
  bool operator==(const Row& other) const {
    return t == other.t && values_and_slots.size() == other.values_and_slots.size() &&
           std::memcmp(values_and_slots.data(), other.values_and_slots.data(),
                       values_and_slots.size() * sizeof(float)) == 0;
  }
};

std::map<int64_t, Row> Snapshot(const EmbeddingTable& table) {
  const int64_t stride = (1 + table.optimizer().num_slots()) * table.dim();
  std::map<int64_t, Row> rows;
  table.ForEachRow([&](int64_t key, const float* values_and_slots, int64_t t, uint32_t) {
    EXPECT_EQ(rows.count(key), 0u) << "key " << key << " visited twice";
    rows[key] = Row{std::vector<float>(values_and_slots, values_and_slots + stride), t};
  });
  return rows;
}

std::vector<float> InitialRow(const v1::TableSpec& spec, int64_t key) {
  std::vector<float> row(spec.dim());
  absl::Status status = InitializeRow(spec.initializer(), spec.name(), key, spec.dim(), row.data());
  EXPECT_TRUE(status.ok()) << status;
  return row;
}

// A key of num_virtual_shards shards whose virtual shard differs from `key`'s.
int64_t KeyInOtherShard(int64_t key, int32_t num_virtual_shards) {
  const int32_t shard = VirtualShardOfKey(key, num_virtual_shards);
  for (int64_t other = key + 1;; ++other) {
    if (VirtualShardOfKey(other, num_virtual_shards) != shard) return other;
  }
}

constexpr char kNormalSgd[] = R"pb(
  name: "emb"
  dim: 8
  initializer { kind: NORMAL mean: 0.5 stddev: 2 seed: 42 }
  optimizer { sgd { learning_rate: 0.1 } }
)pb";

TEST(EmbeddingTableTest, RowsAreCreatedOnFirstTouchFromTheInitializer) {
  const v1::TableSpec spec = ParseTable(kNormalSgd);
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(spec);
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->num_rows(), 0);
  const std::vector<int64_t> keys = {5, -3, int64_t{1} << 40, std::numeric_limits<int64_t>::min()};
  const std::vector<float> first = PullOrDie(*table, keys);
  EXPECT_EQ(table->num_rows(), 4);
  for (size_t i = 0; i < keys.size(); ++i) {
    EXPECT_THAT(std::vector<float>(first.begin() + i * 8, first.begin() + (i + 1) * 8),
                ElementsAreArray(InitialRow(spec, keys[i])))
        << "key " << keys[i];
  }
  EXPECT_EQ(PullOrDie(*table, keys), first);
  EXPECT_EQ(table->num_rows(), 4);
  // Duplicates in one pull get the same row, and create it once.
  const std::vector<float> dup = PullOrDie(*table, {77, 77});
  EXPECT_EQ(std::vector<float>(dup.begin(), dup.begin() + 8),
            std::vector<float>(dup.begin() + 8, dup.end()));
  EXPECT_EQ(table->num_rows(), 5);
}

TEST(EmbeddingTableTest, RowsAreDeterministicAcrossTablesAndPlacements) {
  const v1::TableSpec spec = ParseTable(kNormalSgd);
  std::unique_ptr<EmbeddingTable> whole = CreateOrNull(spec);
  std::vector<int32_t> all_shards(8);
  for (int32_t v = 0; v < 8; ++v) all_shards[v] = v;
  std::unique_ptr<EmbeddingTable> sharded = CreateOrNull(spec, all_shards, 8);
  ASSERT_NE(whole, nullptr);
  ASSERT_NE(sharded, nullptr);
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < 200; ++k) keys.push_back(k * 7919 - 500);
  const std::vector<float> a = PullOrDie(*whole, keys);
  // The second table creates the rows in the opposite order.
  std::vector<int64_t> reversed(keys.rbegin(), keys.rend());
  PullOrDie(*sharded, reversed);
  EXPECT_EQ(PullOrDie(*sharded, keys), a);

  v1::TableSpec other_seed = spec;
  other_seed.mutable_initializer()->set_seed(43);
  std::unique_ptr<EmbeddingTable> reseeded = CreateOrNull(other_seed);
  ASSERT_NE(reseeded, nullptr);
  EXPECT_NE(PullOrDie(*reseeded, keys), a);
}

TEST(EmbeddingTableTest, SgdSumsDuplicateKeysIntoOneUpdate) {
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(R"pb(
    name: "emb"
    dim: 2
    initializer { kind: CONSTANT value: 1 }
    optimizer { sgd { learning_rate: 0.5 } }
  )pb"));
  ASSERT_NE(table, nullptr);
  // Key 7 twice: summed gradient (1 + 3, 2 + 4) = (4, 6); row = 1 - 0.5 * (4, 6) = (-1, -2).
  // Key 9 once: row = 1 - 0.5 * (10, 20) = (-4, -9).
  ASSERT_TRUE(Push(*table, {7, 9, 7}, {1, 2, 10, 20, 3, 4}).ok());
  EXPECT_THAT(PullOrDie(*table, {7, 9}), ElementsAre(-1, -2, -4, -9));
  const std::map<int64_t, Row> rows = Snapshot(*table);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows.at(7).t, 1);  // one update, not two
  EXPECT_EQ(rows.at(9).t, 1);
}

TEST(EmbeddingTableTest, AdagradTouchesOnlyPushedRows) {
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(R"pb(
    name: "emb"
    dim: 4
    initializer { kind: UNIFORM min: -1 max: 1 seed: 7 }
    optimizer { adagrad { learning_rate: 0.1 initial_accumulator_value: 0.1 } }
  )pb"));
  ASSERT_NE(table, nullptr);
  std::vector<int64_t> keys;
  for (int64_t k = 1; k <= 10; ++k) keys.push_back(k);
  PullOrDie(*table, keys);
  const std::map<int64_t, Row> before = Snapshot(*table);
  ASSERT_EQ(before.size(), 10u);
  for (const auto& [key, row] : before) {
    EXPECT_THAT(std::vector<float>(row.values_and_slots.begin() + 4, row.values_and_slots.end()),
                ElementsAre(0.1f, 0.1f, 0.1f, 0.1f));
    EXPECT_EQ(row.t, 0);
  }

  const std::vector<float> grads = {0.5, -1, 2, 0, 1, 1, -3, 0.25};
  ASSERT_TRUE(Push(*table, {3, 5}, grads).ok());
  const std::map<int64_t, Row> after = Snapshot(*table);
  ASSERT_EQ(after.size(), 10u);
  for (const auto& [key, row] : after) {
    if (key != 3 && key != 5) {
      EXPECT_TRUE(row == before.at(key)) << "key " << key << " changed";
      continue;
    }
    // The expected row: the optimizer applied once to a copy of the old row.
    std::vector<float> expected = before.at(key).values_and_slots;
    float* slots[] = {expected.data() + 4};
    const float* grad = grads.data() + (key == 3 ? 0 : 4);
    table->optimizer().Apply(expected.data(), slots, grad, 4, 1);
    EXPECT_THAT(row.values_and_slots, ElementsAreArray(expected)) << "key " << key;
    EXPECT_EQ(row.t, 1);
    // accumulator = 0.1 + g^2.
    EXPECT_FLOAT_EQ(row.values_and_slots[4 + 2], 0.1f + grad[2] * grad[2]);
  }
}

TEST(EmbeddingTableTest, AdamCountsUpdatesPerRow) {
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(R"pb(
    name: "emb"
    dim: 3
    initializer { kind: CONSTANT value: 0.5 }
    optimizer { adam { learning_rate: 0.01 } }
  )pb"));
  ASSERT_NE(table, nullptr);
  const std::vector<float> g = {0.1f, -0.2f, 0.3f};
  const std::vector<float> g2 = {0.1f, -0.2f, 0.3f, 0.1f, -0.2f, 0.3f};
  ASSERT_TRUE(Push(*table, {1}, g).ok());
  ASSERT_TRUE(Push(*table, {1, 2}, g2).ok());
  ASSERT_TRUE(Push(*table, {1, 1}, g2).ok());  // duplicates: one update with 2g
  std::map<int64_t, Row> rows = Snapshot(*table);
  EXPECT_EQ(rows.at(1).t, 3);
  EXPECT_EQ(rows.at(2).t, 1);

  // The same three updates applied by hand, with t = 1, 2, 3.
  std::vector<float> expected(9, 0.0f);
  std::fill_n(expected.begin(), 3, 0.5f);
  float* slots[] = {expected.data() + 3, expected.data() + 6};
  const std::vector<float> doubled = {0.2f, -0.4f, 0.6f};
  table->optimizer().Apply(expected.data(), slots, g.data(), 3, 1);
  table->optimizer().Apply(expected.data(), slots, g.data(), 3, 2);
  table->optimizer().Apply(expected.data(), slots, doubled.data(), 3, 3);
  EXPECT_THAT(rows.at(1).values_and_slots, ElementsAreArray(expected));
}

TEST(EmbeddingTableTest, NonFiniteGradientIsRefusedAndChangesNothing) {
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(R"pb(
    name: "emb"
    dim: 2
    initializer { kind: CONSTANT value: 1 }
    optimizer { adagrad { learning_rate: 0.1 } }
  )pb"));
  ASSERT_NE(table, nullptr);
  PullOrDie(*table, {1, 2});
  ASSERT_TRUE(Push(*table, {1}, {0.5, 0.5}).ok());
  const std::map<int64_t, Row> before = Snapshot(*table);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();

  // Key 100 is new: it must not be created. Key 2 at position 2 has the NaN.
  absl::Status status = Push(*table, {1, 100, 2}, {1, 1, 1, 1, 1, nan});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("table emb"));
  EXPECT_THAT(status.message(), HasSubstr("key 2 at position 2"));
  EXPECT_THAT(status.message(), HasSubstr("non-finite value nan"));
  EXPECT_EQ(table->num_rows(), 2);
  EXPECT_TRUE(Snapshot(*table) == before);

  status = Push(*table, {100, 1}, {-inf, 0, 0, 0});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("key 100 at position 0 has non-finite value -inf"));
  EXPECT_EQ(table->num_rows(), 2);
  EXPECT_TRUE(Snapshot(*table) == before);

  // Allowed: applied like any other gradient.
  ASSERT_TRUE(Push(*table, {1, 100, 2}, {1, 1, 1, 1, 1, nan}, /*allow_non_finite=*/true).ok());
  EXPECT_EQ(table->num_rows(), 3);
  const std::vector<float> row2 = PullOrDie(*table, {2});
  EXPECT_FALSE(std::isnan(row2[0]));
  EXPECT_TRUE(std::isnan(row2[1]));
}

TEST(EmbeddingTableTest, UnownedKeyIsRefusedAndNothingIsCreated) {
  constexpr int32_t kShards = 16;
  const int32_t owned_shard = VirtualShardOfKey(1, kShards);
  std::unique_ptr<EmbeddingTable> table =
      CreateOrNull(ParseTable(kNormalSgd), {owned_shard}, kShards);
  ASSERT_NE(table, nullptr);
  const int64_t stranger = KeyInOtherShard(1, kShards);
  EXPECT_TRUE(table->OwnsKey(1));
  EXPECT_FALSE(table->OwnsKey(stranger));
  const std::string expected_message = absl::StrCat(
      "key ", stranger, " of table emb hashes to virtual shard ",
      VirtualShardOfKey(stranger, kShards), ", not held by this ps task: placement mismatch");

  std::vector<int64_t> keys = {1, stranger};
  std::vector<float> out(16);
  absl::Status status = table->Pull(keys.data(), 2, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(expected_message));
  EXPECT_EQ(table->num_rows(), 0);

  status = Push(*table, keys, std::vector<float>(16, 1.0f));
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(expected_message));
  EXPECT_EQ(table->num_rows(), 0);

  status = table->InsertRow(stranger, std::vector<float>(8).data(), 0);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(expected_message));
  EXPECT_EQ(table->num_rows(), 0);
  EXPECT_THAT(table->HotKeys(10), IsEmpty());

  // The owned key alone is fine.
  PullOrDie(*table, {1});
  EXPECT_EQ(table->num_rows(), 1);
}

// A large request is checked on the pool in blocks; the error still names the first key not
// owned, whichever block finds its key first, and nothing is created.
TEST(EmbeddingTableTest, UnownedKeysOfALargeRequestOnAPoolReportTheFirst) {
  constexpr int32_t kShards = 16;
  std::vector<int32_t> owned;
  for (int32_t shard = 0; shard < kShards; shard += 2) owned.push_back(shard);
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(kNormalSgd), owned, kShards);
  ASSERT_NE(table, nullptr);
  ThreadPool pool(3);
  constexpr int64_t kKeys = 8 * EmbeddingTable::kMinParallelKeys;
  std::vector<int64_t> keys;
  for (int64_t key = 0; static_cast<int64_t>(keys.size()) < kKeys; ++key) {
    if (table->OwnsKey(key)) keys.push_back(key);
  }
  // Strangers at the last block's start and in the middle: the middle one comes first.
  int64_t stranger = 0;
  while (table->OwnsKey(stranger)) ++stranger;
  int64_t later_stranger = stranger + 1;
  while (table->OwnsKey(later_stranger)) ++later_stranger;
  keys[kKeys - kKeys / 4] = later_stranger;
  keys[kKeys / 2 + 1] = stranger;
  const std::string expected_message =
      absl::StrCat("key ", stranger, " of table emb hashes to virtual shard ",
                   VirtualShardOfKey(stranger, kShards));
  std::vector<float> buffer(kKeys * table->dim(), 0.5f);
  absl::Status status = table->Pull(keys.data(), kKeys, buffer.data(), &pool);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(expected_message));
  status = table->Push(keys.data(), kKeys, buffer.data(), /*allow_non_finite=*/false, &pool);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(expected_message));
  EXPECT_EQ(table->num_rows(), 0);
}

TEST(EmbeddingTableTest, LookupDoesNotCreate) {
  const v1::TableSpec spec = ParseTable(kNormalSgd);
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(spec);
  ASSERT_NE(table, nullptr);
  const std::vector<float> pulled = PullOrDie(*table, {1, 2});
  std::vector<int64_t> keys = {2, 3, 1, 3};
  std::vector<int64_t> found, missing;
  std::vector<float> rows;
  table->Lookup(keys.data(), 4, &found, &rows, &missing);
  EXPECT_THAT(found, ElementsAre(2, 1));
  EXPECT_THAT(missing, ElementsAre(3, 3));
  std::vector<float> expected(pulled.begin() + 8, pulled.end());
  expected.insert(expected.end(), pulled.begin(), pulled.begin() + 8);
  EXPECT_EQ(rows, expected);
  EXPECT_EQ(table->num_rows(), 2);
}

// Pushes 20 batches of 50 random keys of [key_min, key_max] to `source`, copies its rows into
// `restored` through ForEachRow and InsertRow, and checks that both hold the same rows, update
// counts included, and still do after one more identical push to each. Returns the keys.
std::vector<int64_t> ExpectRoundTrip(EmbeddingTable& source, EmbeddingTable& restored,
                                     int64_t key_min, int64_t key_max) {
  const int64_t dim = source.dim();
  std::mt19937 rng(1);
  std::uniform_int_distribution<int64_t> key_dist(key_min, key_max);
  std::normal_distribution<float> grad_dist(0, 1);
  for (int step = 0; step < 20; ++step) {
    std::vector<int64_t> keys(50);
    std::vector<float> grads(50 * dim);
    for (int64_t& k : keys) k = key_dist(rng);
    for (float& g : grads) g = grad_dist(rng);
    EXPECT_TRUE(Push(source, keys, grads).ok());
  }
  int64_t visited = 0;
  source.ForEachRow([&](int64_t key, const float* values_and_slots, int64_t t, uint32_t) {
    ++visited;
    EXPECT_TRUE(restored.InsertRow(key, values_and_slots, t).ok());
  });
  EXPECT_EQ(visited, source.num_rows());
  EXPECT_EQ(restored.num_rows(), source.num_rows());
  EXPECT_TRUE(Snapshot(restored) == Snapshot(source));

  std::vector<int64_t> all_keys;
  for (const auto& [key, row] : Snapshot(source)) all_keys.push_back(key);
  EXPECT_EQ(PullOrDie(restored, all_keys), PullOrDie(source, all_keys));
  // The restored update counts carry on: one more identical push keeps them identical.
  const std::vector<float> grads(all_keys.size() * dim, 0.5f);
  EXPECT_TRUE(Push(source, all_keys, grads).ok());
  EXPECT_TRUE(Push(restored, all_keys, grads).ok());
  EXPECT_TRUE(Snapshot(restored) == Snapshot(source));
  return all_keys;
}

TEST(EmbeddingTableTest, CheckpointRoundTripThroughForEachRowAndInsertRow) {
  const v1::TableSpec spec = ParseTable(R"pb(
    name: "emb"
    dim: 8
    initializer { kind: TRUNCATED_NORMAL stddev: 0.1 seed: 3 }
    optimizer { adam { learning_rate: 0.01 } }
  )pb");
  std::unique_ptr<EmbeddingTable> source = CreateOrNull(spec);
  std::unique_ptr<EmbeddingTable> restored = CreateOrNull(spec);
  ASSERT_NE(source, nullptr);
  ASSERT_NE(restored, nullptr);
  const std::vector<int64_t> all_keys = ExpectRoundTrip(*source, *restored, -1000, 1000);
  ASSERT_FALSE(all_keys.empty());

  // InsertRow overwrites an existing row, and refuses a negative count.
  std::vector<float> row(24, 3.0f);
  ASSERT_TRUE(restored->InsertRow(all_keys[0], row.data(), 9).ok());
  EXPECT_EQ(Snapshot(*restored).at(all_keys[0]).values_and_slots, row);
  EXPECT_EQ(Snapshot(*restored).at(all_keys[0]).t, 9);
  // A count past 2^32 - 1 is kept as 2^32 - 1, and stays there through further pushes.
  ASSERT_TRUE(restored->InsertRow(all_keys[0], row.data(), int64_t{1} << 40).ok());
  EXPECT_EQ(Snapshot(*restored).at(all_keys[0]).t, RowIndex::kMaxCount);
  ASSERT_TRUE(Push(*restored, {all_keys[0]}, std::vector<float>(8, 0.5f)).ok());
  EXPECT_EQ(Snapshot(*restored).at(all_keys[0]).t, RowIndex::kMaxCount);
  absl::Status status = restored->InsertRow(all_keys[0], row.data(), -1);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("negative update count -1"));
}

// InsertRows (a restore's) holds what InsertRow row by row holds, on a pool or not, for a
// hashed table with rows already there and for a vocabulary table; a key given twice keeps its
// last row; an unowned key or a negative count is refused, naming it, before anything changes.
TEST(EmbeddingTableTest, InsertRowsHoldsWhatInsertRowHolds) {
  ThreadPool pool(2);
  for (const char* text : {R"pb(name: "emb"
                                dim: 4
                                initializer { kind: CONSTANT value: 0.5 }
                                optimizer { adagrad { learning_rate: 0.1 } })pb",
                           R"pb(name: "emb"
                                dim: 4
                                vocabulary_size: 30000
                                initializer { kind: CONSTANT value: 0.5 }
                                optimizer { adagrad { learning_rate: 0.1 } })pb"}) {
    const v1::TableSpec spec = ParseTable(text);
    SCOPED_TRACE(spec.ShortDebugString());
    for (ThreadPool* threads : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::unique_ptr<EmbeddingTable> one = CreateOrNull(spec);
      std::unique_ptr<EmbeddingTable> bulk = CreateOrNull(spec);
      ASSERT_NE(one, nullptr);
      ASSERT_NE(bulk, nullptr);
      // Rows there before: some overwritten, some not.
      for (EmbeddingTable* table : {one.get(), bulk.get()}) {
        ASSERT_TRUE(Push(*table, {1, 2, 3, 20000}, std::vector<float>(16, 0.25f)).ok());
      }
      std::vector<int64_t> keys, t;
      std::vector<uint32_t> last;
      std::vector<float> rows;
      for (int64_t i = 0; i < 20000; ++i) {
        keys.push_back((i * 7919) % 25000);
        t.push_back(i % 9);
        last.push_back(0);
        for (int f = 0; f < 8; ++f) rows.push_back(static_cast<float>(i) + 0.125f * f);
      }
      keys.push_back(keys[5]);  // again, later: its last row wins
      t.push_back(77);
      last.push_back(0);
      rows.insert(rows.end(), 8, -1.0f);
      for (size_t i = 0; i < keys.size(); ++i) {
        ASSERT_TRUE(one->InsertRow(keys[i], rows.data() + i * 8, t[i], last[i]).ok());
      }
      ASSERT_TRUE(bulk->InsertRows(keys.data(), rows.data(), t.data(), last.data(),
                                   static_cast<int64_t>(keys.size()), threads)
                      .ok());
      const std::map<int64_t, Row> want = Snapshot(*one);
      EXPECT_EQ(Snapshot(*bulk), want);
      EXPECT_EQ(want.at(keys[5]).t, 77);
      EXPECT_EQ(want.at(keys[5]).values_and_slots, std::vector<float>(8, -1.0f));

      // Refusals change nothing.
      std::vector<int64_t> bad_t = t;
      bad_t[100] = -3;
      absl::Status status = bulk->InsertRows(keys.data(), rows.data(), bad_t.data(), last.data(),
                                             static_cast<int64_t>(keys.size()), threads);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(status.message(),
                  HasSubstr(absl::StrCat("key ", keys[100], " has negative update count -3")));
      // A key not held: the first of the request's.
      std::unique_ptr<EmbeddingTable> part =
          spec.vocabulary_size() > 0 ? CreateOrNull(spec) : CreateOrNull(spec, {0}, 2);
      ASSERT_NE(part, nullptr);
      std::vector<int64_t> mixed;
      for (int64_t k = 0; mixed.size() < 4; ++k) {
        if (part->OwnsKey(k)) mixed.push_back(k);
      }
      int64_t stranger = 40000;  // outside the vocabulary
      if (spec.vocabulary_size() == 0) {
        stranger = 0;
        while (part->OwnsKey(stranger)) ++stranger;
      }
      mixed[2] = stranger;
      status = part->InsertRows(mixed.data(), rows.data(), t.data(), last.data(), 4, threads);
      EXPECT_EQ(status.code(), spec.vocabulary_size() > 0 ? absl::StatusCode::kInvalidArgument
                                                          : absl::StatusCode::kFailedPrecondition);
      EXPECT_THAT(status.message(), HasSubstr(absl::StrCat("key ", stranger)));
      EXPECT_EQ(part->num_rows(), 0);
      EXPECT_EQ(Snapshot(*bulk), want);
    }
  }
}

// AdoptRows (a restore's, from a table filled beside the live one): the live table then holds
// exactly the staged rows (its own are gone, the staged table is empty), later pushes and new
// rows work on them, changes are no longer tracked (the next cut must be full), and a table of
// another stride, other virtual shards or a vocabulary table is refused, changing nothing.
TEST(EmbeddingTableTest, AdoptRowsTakesTheStagedRowsWhole) {
  const v1::TableSpec spec = ParseTable(R"pb(name: "emb"
                                             dim: 4
                                             initializer { kind: CONSTANT value: 0.5 }
                                             optimizer { adagrad { learning_rate: 0.1 } })pb");
  ThreadPool pool(2);
  std::unique_ptr<EmbeddingTable> live = CreateOrNull(spec, {0, 2}, 3);
  ASSERT_NE(live, nullptr);
  std::vector<int64_t> mine;
  for (int64_t k = 0; mine.size() < 9000; ++k) {
    if (live->OwnsKey(k)) mine.push_back(k);
  }
  // The live table's own rows: the first 3000 keys, pushed, changes tracked.
  live->MarkCut(/*delta=*/false, /*track_changes=*/true);
  live->DropCut();
  ASSERT_TRUE(Push(*live, std::vector<int64_t>(mine.begin(), mine.begin() + 3000),
                   std::vector<float>(3000 * 4, 0.25f))
                  .ok());
  ASSERT_TRUE(live->ChangesTracked());
  absl::StatusOr<std::unique_ptr<EmbeddingTable>> staged = live->EmptyLike();
  ASSERT_TRUE(staged.ok()) << staged.status();
  EXPECT_EQ((*staged)->num_rows(), 0);
  // The staged rows: keys 2000..9000 of them (some the live table has, most not).
  std::vector<int64_t> keys(mine.begin() + 2000, mine.end()), t;
  std::vector<uint32_t> last(keys.size(), 0);
  std::vector<float> rows;
  for (size_t i = 0; i < keys.size(); ++i) {
    t.push_back(static_cast<int64_t>(i % 5));
    for (int f = 0; f < 8; ++f) rows.push_back(static_cast<float>(i) + 0.5f * f);
  }
  ASSERT_TRUE((*staged)
                  ->InsertRows(keys.data(), rows.data(), t.data(), last.data(),
                               static_cast<int64_t>(keys.size()), &pool)
                  .ok());
  const std::map<int64_t, Row> want = Snapshot(**staged);
  ASSERT_EQ(want.size(), keys.size());

  // Refused: another stride, other shards, a vocabulary table.
  v1::TableSpec wider = spec;
  wider.set_dim(5);
  v1::TableSpec vocabulary = spec;
  vocabulary.set_vocabulary_size(100000);
  std::vector<std::unique_ptr<EmbeddingTable>> others;
  others.push_back(CreateOrNull(wider, {0, 2}, 3));
  others.push_back(CreateOrNull(spec, {0}, 3));
  others.push_back(CreateOrNull(vocabulary, {0, 2}, 3));
  for (const std::unique_ptr<EmbeddingTable>& other : others) {
    ASSERT_NE(other, nullptr);
    const absl::Status status = live->AdoptRows(*other);
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
    EXPECT_EQ(live->num_rows(), 3000);
  }

  ASSERT_TRUE(live->AdoptRows(**staged).ok());
  EXPECT_EQ(Snapshot(*live), want);
  EXPECT_EQ((*staged)->num_rows(), 0);
  EXPECT_FALSE(live->ChangesTracked());
  // It serves as any table: a push updates an adopted row, a pull of a new key creates one.
  ASSERT_TRUE(Push(*live, {keys[0]}, std::vector<float>(4, 1.0f)).ok());
  EXPECT_NE(Snapshot(*live).at(keys[0]).values_and_slots, want.at(keys[0]).values_and_slots);
  EXPECT_EQ(Snapshot(*live).at(keys[0]).t, want.at(keys[0]).t + 1);
  ASSERT_TRUE(Push(*live, {mine[0]}, std::vector<float>(4, 1.0f)).ok());
  EXPECT_EQ(live->num_rows(), static_cast<int64_t>(keys.size()) + 1);
}

TEST(EmbeddingTableTest, ConcurrentPushesLoseNoUpdateAndPullsSeeWholeRows) {
  // Every element of a row starts at 100 and each update subtracts 0.5 * (sum of gradients of
  // 1.0) from every element, so a row's elements are always equal (a torn read would show two
  // values) and the final value counts the pushes exactly (all values are exact in float).
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(R"pb(
    name: "emb"
    dim: 8
    initializer { kind: CONSTANT value: 100 }
    optimizer { sgd { learning_rate: 0.5 } }
  )pb"));
  ASSERT_NE(table, nullptr);
  constexpr int kPushers = 8, kPullers = 4, kPushesPerThread = 300, kKeysPerRequest = 64;
  constexpr int64_t kKeyRange = 512;
  std::vector<std::vector<int64_t>> pushes_of(kPushers, std::vector<int64_t>(kKeyRange, 0));
  std::atomic<int> pushers_running{kPushers};
  std::atomic<int64_t> torn_rows{0}, pulled_rows{0}, failed{0};

  std::vector<std::thread> threads;
  for (int p = 0; p < kPushers; ++p) {
    threads.emplace_back([&, p] {
      std::mt19937 rng(p);
      std::uniform_int_distribution<int64_t> key_dist(0, kKeyRange - 1);
      const std::vector<float> grads(kKeysPerRequest * 8, 1.0f);
      std::vector<int64_t> keys(kKeysPerRequest);
      for (int i = 0; i < kPushesPerThread; ++i) {
        for (int64_t& k : keys) {
          k = key_dist(rng);
          ++pushes_of[p][k];
        }
        if (!table->Push(keys.data(), kKeysPerRequest, grads.data(), false).ok()) ++failed;
      }
      --pushers_running;
    });
  }
  for (int p = 0; p < kPullers; ++p) {
    threads.emplace_back([&, p] {
      std::mt19937 rng(100 + p);
      // A wider range than the pushers': pulls also create rows while pushes run.
      std::uniform_int_distribution<int64_t> key_dist(0, kKeyRange + 64);
      std::vector<int64_t> keys(kKeysPerRequest);
      std::vector<float> out(kKeysPerRequest * 8);
      do {
        for (int64_t& k : keys) k = key_dist(rng);
        if (!table->Pull(keys.data(), kKeysPerRequest, out.data()).ok()) ++failed;
        for (int i = 0; i < kKeysPerRequest; ++i) {
          for (int d = 1; d < 8; ++d) {
            if (out[i * 8 + d] != out[i * 8]) {
              ++torn_rows;
              break;
            }
          }
        }
        pulled_rows += kKeysPerRequest;
      } while (pushers_running.load() > 0);
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_EQ(torn_rows.load(), 0) << "of " << pulled_rows.load() << " pulled rows";

  std::vector<int64_t> keys(kKeyRange);
  for (int64_t k = 0; k < kKeyRange; ++k) keys[k] = k;
  const std::vector<float> rows = PullOrDie(*table, keys);
  int64_t total = 0;
  for (int64_t k = 0; k < kKeyRange; ++k) {
    int64_t pushes = 0;
    for (int p = 0; p < kPushers; ++p) pushes += pushes_of[p][k];
    total += pushes;
    const float expected = 100.0f - 0.5f * static_cast<float>(pushes);
    for (int d = 0; d < 8; ++d) {
      ASSERT_EQ(rows[k * 8 + d], expected) << "key " << k << " pushed " << pushes << " times";
    }
  }
  EXPECT_EQ(total, int64_t{kPushers} * kPushesPerThread * kKeysPerRequest);
}

TEST(EmbeddingTableTest, HotKeysCountsSmallPushesExactly) {
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(kNormalSgd));
  ASSERT_NE(table, nullptr);
  const std::vector<float> grads(3 * 8, 0.0f);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Push(*table, {5, 6, 5}, grads).ok());
  const std::vector<v1::HotKey> hot = table->HotKeys(5);
  ASSERT_EQ(hot.size(), 2u);
  EXPECT_EQ(hot[0].key(), 5);
  EXPECT_EQ(hot[0].count(), 20);
  EXPECT_EQ(hot[1].key(), 6);
  EXPECT_EQ(hot[1].count(), 10);
  EXPECT_THAT(table->HotKeys(0), IsEmpty());
  EXPECT_EQ(table->HotKeys(1).size(), 1u);
}

TEST(EmbeddingTableTest, HotKeysFindsADominantKeyInLargePushes) {
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(kNormalSgd));
  ASSERT_NE(table, nullptr);
  std::mt19937_64 rng(5);
  std::uniform_int_distribution<int64_t> key_dist(1000, 1000000000);
  constexpr int kPushes = 100, kKeys = 1000;
  const std::vector<float> grads(kKeys * 8, 0.0f);
  int64_t true_count = 0;
  for (int p = 0; p < kPushes; ++p) {
    std::vector<int64_t> keys(kKeys);
    for (int i = 0; i < kKeys; ++i) {
      // A third of the positions are key 42, at random.
      if (rng() % 3 == 0) {
        keys[i] = 42;
        ++true_count;
      } else {
        keys[i] = key_dist(rng);
      }
    }
    ASSERT_TRUE(Push(*table, keys, grads).ok());
  }
  const std::vector<v1::HotKey> hot = table->HotKeys(3);
  ASSERT_EQ(hot.size(), 3u);
  EXPECT_EQ(hot[0].key(), 42);
  EXPECT_GT(hot[0].count(), true_count / 2);
  EXPECT_LT(hot[0].count(), true_count * 3 / 2);
  EXPECT_GT(hot[0].count(), 5 * hot[1].count());
  EXPECT_LE(table->HotKeys(1000).size(), static_cast<size_t>(EmbeddingTable::kHotKeyCounters));
}

TEST(EmbeddingTableTest, ValueStatsCoverValuesNotSlots) {
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(R"pb(
    name: "emb"
    dim: 2
    initializer { kind: CONSTANT value: 2 }
    optimizer { adagrad { learning_rate: 0.1 initial_accumulator_value: 5 } }
  )pb"));
  ASSERT_NE(table, nullptr);
  v1::ValueStats stats;
  table->ComputeValueStats(&stats);
  EXPECT_EQ(stats.count(), 0);

  PullOrDie(*table, {1, 2, 3});
  table->ComputeValueStats(&stats);
  EXPECT_EQ(stats.count(), 6);
  EXPECT_EQ(stats.min(), 2);
  EXPECT_EQ(stats.max(), 2);
  EXPECT_EQ(stats.mean(), 2);
  EXPECT_EQ(stats.std(), 0);
  EXPECT_DOUBLE_EQ(stats.l2_norm(), std::sqrt(24.0));
  EXPECT_EQ(stats.nan_count(), 0);
  EXPECT_EQ(stats.inf_count(), 0);

  const float nan = std::numeric_limits<float>::quiet_NaN();
  ASSERT_TRUE(Push(*table, {1}, {nan, nan}, /*allow_non_finite=*/true).ok());
  table->ComputeValueStats(&stats);
  EXPECT_EQ(stats.count(), 4);
  EXPECT_EQ(stats.nan_count(), 2);
  EXPECT_EQ(stats.inf_count(), 0);
  EXPECT_EQ(stats.mean(), 2);

  // Values 2, 2, 2, 6 (row 3 restored by hand): mean 3, std sqrt(3).
  std::vector<float> row = {2, 6, 5, 5};
  ASSERT_TRUE(table->InsertRow(3, row.data(), 0).ok());
  table->ComputeValueStats(&stats);
  EXPECT_EQ(stats.count(), 4);
  EXPECT_EQ(stats.min(), 2);
  EXPECT_EQ(stats.max(), 6);
  EXPECT_DOUBLE_EQ(stats.mean(), 3);
  EXPECT_DOUBLE_EQ(stats.std(), std::sqrt(3.0));
}

TEST(EmbeddingTableTest, BytesCountsValuesSlotsAndUpdateCounts) {
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(R"pb(
    name: "emb"
    dim: 8
    optimizer { adam { learning_rate: 0.01 } }
  )pb"));
  ASSERT_NE(table, nullptr);
  EXPECT_EQ(table->bytes(), 0);
  PullOrDie(*table, {1, 2, 3});
  // (1 + 2 slots) * 8 floats * 4 bytes + a 16-byte index entry, per row.
  EXPECT_EQ(table->bytes(), 3 * (3 * 8 * 4 + 16));
}

TEST(EmbeddingTableTest, CreateRefusesBadSpecs) {
  struct Case {
    std::string spec;
    std::vector<int32_t> owned;
    int32_t num_virtual_shards;
    std::string message;
  };
  const std::string sgd = "optimizer { sgd { learning_rate: 0.1 } }";
  const std::vector<Case> cases = {
      {"dim: 8 " + sgd, {0}, 1, "table spec has an empty name"},
      {"name: 'emb' dim: 0 " + sgd, {0}, 1, "table emb: dim 0 is not in [1, 2^31)"},
      {"name: 'emb' dim: 2147483648 " + sgd, {0}, 1, "dim 2147483648 is not in [1, 2^31)"},
      {"name: 'emb' dim: 8", {0}, 1, "table emb: "},
      {"name: 'emb' dim: 8 optimizer { sgd { learning_rate: -1 } }", {0}, 1, "learning_rate"},
      {"name: 'emb' dim: 8 initializer { kind: UNIFORM min: 1 max: 1 } " + sgd,
       {0},
       1,
       "table emb: "},
      {"name: 'emb' dim: 8 " + sgd, {0}, 0, "num_virtual_shards 0 is not positive"},
      {"name: 'emb' dim: 8 " + sgd, {0, 4}, 4, "owned virtual shard 4 is not in [0, 4)"},
      {"name: 'emb' dim: 8 " + sgd, {-1}, 4, "owned virtual shard -1 is not in [0, 4)"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<std::unique_ptr<EmbeddingTable>> table =
        EmbeddingTable::Create(ParseTable(c.spec), c.owned, c.num_virtual_shards);
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << c.spec;
    EXPECT_THAT(table.status().message(), HasSubstr(c.message)) << c.spec;
  }
  // An empty owned list is valid: the table refuses every key.
  absl::StatusOr<std::unique_ptr<EmbeddingTable>> empty =
      EmbeddingTable::Create(ParseTable("name: 'emb' dim: 8 " + sgd), {}, 4);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_FALSE((*empty)->OwnsKey(1));
}

TEST(EmbeddingTableTest, NegativeCountIsRefused) {
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(ParseTable(kNormalSgd));
  ASSERT_NE(table, nullptr);
  absl::Status status = table->Pull(nullptr, -1, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("pull of -1 keys"));
  status = table->Push(nullptr, -2, nullptr, false);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("push of -2 keys"));
  EXPECT_TRUE(table->Pull(nullptr, 0, nullptr).ok());
  EXPECT_TRUE(table->Push(nullptr, 0, nullptr, false).ok());
}

// Large requests spread over a pool's threads change exactly what the same requests on one
// thread change: the same rows, created with the same values, updated with the same bits.
TEST(EmbeddingTableTest, RequestsOnAPoolMatchRequestsOnOneThread) {
  const v1::TableSpec spec = ParseTable(R"pb(
    name: "emb"
    dim: 5
    initializer { kind: NORMAL stddev: 0.1 seed: 3 }
    optimizer { adam { learning_rate: 0.01 } }
  )pb");
  std::unique_ptr<EmbeddingTable> serial = CreateOrNull(spec);
  std::unique_ptr<EmbeddingTable> parallel = CreateOrNull(spec);
  ASSERT_NE(serial, nullptr);
  ASSERT_NE(parallel, nullptr);
  ThreadPool pool(3);
  constexpr int64_t kKeys = 4 * EmbeddingTable::kMinParallelKeys;
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> gradient(-1.0f, 1.0f);
  for (int round = 0; round < 4; ++round) {
    // Keys from a space a few times smaller than the request, so that requests repeat keys,
    // and a space that grows, so that every round creates rows.
    const uint64_t space = kKeys / 2 * static_cast<uint64_t>(round + 1);
    std::vector<int64_t> keys(kKeys);
    for (int64_t& key : keys) key = static_cast<int64_t>(rng() % space) * 7919;
    std::vector<float> grads(kKeys * spec.dim());
    for (float& g : grads) g = gradient(rng);

    std::vector<float> pulled_serial(kKeys * spec.dim()), pulled_parallel(kKeys * spec.dim());
    ASSERT_TRUE(serial->Pull(keys.data(), kKeys, pulled_serial.data()).ok());
    ASSERT_TRUE(parallel->Pull(keys.data(), kKeys, pulled_parallel.data(), &pool).ok());
    ASSERT_EQ(0, std::memcmp(pulled_serial.data(), pulled_parallel.data(),
                             pulled_serial.size() * sizeof(float)))
        << "round " << round;
    // Push keys of which some were never pulled: pushes create rows too.
    for (int64_t i = 0; i < kKeys; i += 3) keys[i] += 1;
    ASSERT_TRUE(serial->Push(keys.data(), kKeys, grads.data(), false).ok());
    ASSERT_TRUE(parallel->Push(keys.data(), kKeys, grads.data(), false, &pool).ok());
    ASSERT_EQ(serial->num_rows(), parallel->num_rows());
    ASSERT_TRUE(Snapshot(*serial) == Snapshot(*parallel)) << "round " << round;
  }
  EXPECT_GT(serial->num_rows(), kKeys);
}

// A push's repeated keys give the rows a table gets from the same push with each key once and
// its gradients summed in order of position: bit for bit, update counts included. Large pushes,
// on a pool and on one thread, to tables with and without admission and eviction (which find
// rows differently); some keys are new, so that rows created by a push are repeated in it.
TEST(EmbeddingTableTest, RepeatedKeysOfALargePushEqualTheirSumPushedOnce) {
  for (const bool managed : {false, true}) {
    v1::TableSpec spec = ParseTable(R"pb(
      name: "emb"
      dim: 3
      initializer { kind: NORMAL stddev: 0.1 seed: 11 }
      optimizer { adam { learning_rate: 0.01 } }
    )pb");
    if (managed) spec.mutable_eviction()->set_max_rows(1 << 30);  // tracks pushes, evicts none
    ThreadPool pool(2);
    for (ThreadPool* p : {static_cast<ThreadPool*>(nullptr), &pool}) {
      std::unique_ptr<EmbeddingTable> repeated = CreateOrNull(spec);
      std::unique_ptr<EmbeddingTable> summed = CreateOrNull(spec);
      ASSERT_NE(repeated, nullptr);
      ASSERT_NE(summed, nullptr);
      constexpr int64_t kKeys = 4 * EmbeddingTable::kMinParallelKeys;
      std::mt19937_64 rng(17);
      std::set<int64_t> all_keys;
      std::uniform_real_distribution<float> gradient(-1.0f, 1.0f);
      for (int round = 0; round < 3; ++round) {
        // About 3 occurrences per key, from a space that grows by a third each round.
        const uint64_t space = kKeys / 3 * static_cast<uint64_t>(round + 3) / 3;
        std::vector<int64_t> keys(kKeys);
        for (int64_t& key : keys) key = static_cast<int64_t>(rng() % space) * 31 - 500;
        std::vector<float> grads(kKeys * spec.dim());
        for (float& g : grads) g = gradient(rng);
        // The same push with each key once, in order of first occurrence.
        std::vector<int64_t> distinct;
        std::vector<float> sums;
        std::map<int64_t, size_t> place;
        int64_t repeats = 0;
        for (int64_t i = 0; i < kKeys; ++i) {
          auto [it, first] = place.emplace(keys[i], distinct.size());
          if (first) {
            distinct.push_back(keys[i]);
            sums.insert(sums.end(), grads.begin() + i * spec.dim(),
                        grads.begin() + (i + 1) * spec.dim());
            continue;
          }
          ++repeats;
          for (int64_t d = 0; d < spec.dim(); ++d) {
            sums[it->second * spec.dim() + d] += grads[i * spec.dim() + d];
          }
        }
        ASSERT_GT(repeats, kKeys / 2) << "round " << round;
        ASSERT_TRUE(repeated->Push(keys.data(), kKeys, grads.data(), false, p).ok());
        ASSERT_TRUE(summed
                        ->Push(distinct.data(), static_cast<int64_t>(distinct.size()), sums.data(),
                               false, p)
                        .ok());
        all_keys.insert(distinct.begin(), distinct.end());
        ASSERT_EQ(repeated->num_rows(), static_cast<int64_t>(all_keys.size()));
        ASSERT_TRUE(Snapshot(*repeated) == Snapshot(*summed))
            << "managed " << managed << ", pool " << (p != nullptr) << ", round " << round;
      }
    }
  }
}

// A vocabulary table split over two tasks (as two ps tasks hold it) holds what a hashed table
// holds after the same pulls and pushes, bit for bit, update counts included: rows created on
// first touch with the same values, repeated keys summed, one update per distinct row. Large
// requests on a pool and small ones on one thread; a power-of-two number of virtual shards
// (keys split by masks) and another (by division).
TEST(EmbeddingTableTest, AVocabularyTableHoldsWhatAHashedTableHolds) {
  for (const int32_t num_shards : {16, 12}) {
    v1::TableSpec hashed_spec = ParseTable(R"pb(
      name: "emb"
      dim: 3
      initializer { kind: NORMAL stddev: 0.1 seed: 11 }
      optimizer { adam { learning_rate: 0.01 } }
    )pb");
    constexpr int64_t kVocabulary = 50000;
    v1::TableSpec vocabulary_spec = hashed_spec;
    vocabulary_spec.set_vocabulary_size(kVocabulary);
    std::vector<int32_t> all, even, odd;
    for (int32_t v = 0; v < num_shards; ++v) {
      all.push_back(v);
      (v % 2 == 0 ? even : odd).push_back(v);
    }
    std::unique_ptr<EmbeddingTable> hashed = CreateOrNull(hashed_spec, all, num_shards);
    std::unique_ptr<EmbeddingTable> tasks[2] = {CreateOrNull(vocabulary_spec, even, num_shards),
                                                CreateOrNull(vocabulary_spec, odd, num_shards)};
    ASSERT_NE(hashed, nullptr);
    ASSERT_NE(tasks[0], nullptr);
    ASSERT_NE(tasks[1], nullptr);
    ASSERT_TRUE(tasks[0]->is_vocabulary());
    ASSERT_FALSE(hashed->is_vocabulary());
    ThreadPool pool(2);
    std::mt19937_64 rng(23);
    std::uniform_real_distribution<float> gradient(-1.0f, 1.0f);
    for (int round = 0; round < 6; ++round) {
      // Large rounds (on the pool, every other one) repeat keys about twice; small ones less.
      const bool large = round % 3 != 2;
      const int64_t n = large ? 4 * EmbeddingTable::kMinParallelKeys : 500;
      ThreadPool* p = round % 2 == 0 ? &pool : nullptr;
      std::vector<int64_t> keys(static_cast<size_t>(n));
      const uint64_t space =
          std::min<uint64_t>(kVocabulary, static_cast<uint64_t>(n) / 2 + 1000 * round);
      for (int64_t& key : keys) key = static_cast<int64_t>(rng() % space);
      keys[0] = kVocabulary - 1;  // the last id
      std::vector<float> grads(keys.size() * 3);
      for (float& g : grads) g = gradient(rng);
      // Each task gets its keys, in order, as a client routes them.
      std::vector<int64_t> part_keys[2];
      std::vector<float> part_grads[2];
      for (size_t i = 0; i < keys.size(); ++i) {
        const int task = VirtualShardOfTableKey(keys[i], kVocabulary, num_shards) % 2;
        ASSERT_TRUE(tasks[task]->OwnsKey(keys[i]));
        ASSERT_FALSE(tasks[1 - task]->OwnsKey(keys[i]));
        part_keys[task].push_back(keys[i]);
        part_grads[task].insert(part_grads[task].end(), grads.begin() + 3 * i,
                                grads.begin() + 3 * (i + 1));
      }
      // Pull half the keys first (pulls create rows too), then push them all.
      std::vector<float> want(keys.size() / 2 * 3), got(want.size());
      ASSERT_TRUE(hashed->Pull(keys.data(), n / 2, want.data(), p).ok());
      for (int task = 0; task < 2; ++task) {
        const int64_t m = static_cast<int64_t>(part_keys[task].size()) / 2;
        std::vector<float> out(static_cast<size_t>(m * 3));
        ASSERT_TRUE(tasks[task]->Pull(part_keys[task].data(), m, out.data(), p).ok());
        std::vector<float> expected(out.size());
        ASSERT_TRUE(hashed->Pull(part_keys[task].data(), m, expected.data()).ok());
        ASSERT_EQ(out, expected) << "round " << round << ", task " << task;
      }
      ASSERT_TRUE(hashed->Push(keys.data(), n, grads.data(), false, p).ok());
      for (int task = 0; task < 2; ++task) {
        ASSERT_TRUE(tasks[task]
                        ->Push(part_keys[task].data(), static_cast<int64_t>(part_keys[task].size()),
                               part_grads[task].data(), false, p)
                        .ok());
      }
      std::map<int64_t, Row> both = Snapshot(*tasks[0]);
      for (const auto& [key, row] : Snapshot(*tasks[1])) {
        ASSERT_EQ(both.count(key), 0u) << "key " << key << " on both tasks";
        both[key] = row;
      }
      ASSERT_EQ(tasks[0]->num_rows() + tasks[1]->num_rows(), hashed->num_rows());
      ASSERT_TRUE(both == Snapshot(*hashed))
          << num_shards << " shards, round " << round << ", pool " << (p != nullptr);
    }
    EXPECT_GT(tasks[0]->num_rows(), 1000);
    EXPECT_GT(tasks[1]->num_rows(), 1000);
  }
}

// A key outside [0, vocabulary_size) is refused with an error that names it, its position and
// the range; nothing is created; a key of another task's shard is refused as in a hashed table.
TEST(EmbeddingTableTest, AVocabularyTableRefusesKeysOutsideItsRange) {
  v1::TableSpec spec = ParseTable(kNormalSgd);
  spec.set_vocabulary_size(1000);
  std::unique_ptr<EmbeddingTable> table = CreateOrNull(spec, {0, 2, 4, 6}, 8);
  ASSERT_NE(table, nullptr);
  EXPECT_TRUE(table->OwnsKey(0));
  EXPECT_TRUE(table->OwnsKey(998));
  EXPECT_FALSE(table->OwnsKey(999));  // shard 7
  EXPECT_FALSE(table->OwnsKey(1000));
  EXPECT_FALSE(table->OwnsKey(-8));
  for (const int64_t bad : {int64_t{1000}, int64_t{-8}, std::numeric_limits<int64_t>::min()}) {
    std::vector<int64_t> keys = {2, 4, bad};
    std::vector<float> buffer(keys.size() * 8, 0.5f);
    const std::string expected = absl::StrCat("table emb: key ", bad,
                                              " at position 2 is not an id of the vocabulary: "
                                              "expected [0, 1000) (vocabulary_size)");
    absl::Status status = table->Pull(keys.data(), 3, buffer.data());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), expected);
    status = table->Push(keys.data(), 3, buffer.data(), false);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status.message(), expected);
    EXPECT_EQ(table->InsertRow(bad, buffer.data(), 1).code(),
              absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(table->num_rows(), 0);
  }
  std::vector<int64_t> stranger = {2, 3};
  std::vector<float> buffer(16);
  absl::Status status = table->Pull(stranger.data(), 2, buffer.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("key 3 of table emb hashes to virtual shard 3, not held by this ps task"));
  EXPECT_EQ(table->num_rows(), 0);
  // Lookup of any key is fine: those not held are missing.
  PullOrDie(*table, {2, 4});
  std::vector<int64_t> keys = {4, 3, -1, 1000, 2}, found, missing;
  std::vector<float> rows;
  table->Lookup(keys.data(), 5, &found, &rows, &missing);
  EXPECT_THAT(found, ElementsAre(4, 2));
  EXPECT_THAT(missing, ElementsAre(3, -1, 1000));
  EXPECT_EQ(rows.size(), 16u);
}

// ForEachRow and InsertRow carry a vocabulary table's rows and counts to another table; Clear
// empties it; its bytes are what its rows took up front (reserved_bytes).
TEST(EmbeddingTableTest, AVocabularyTableRoundTripsThroughItsRows) {
  v1::TableSpec spec = ParseTable(R"pb(
    name: "emb"
    dim: 8
    initializer { kind: TRUNCATED_NORMAL stddev: 0.1 seed: 3 }
    optimizer { adam { learning_rate: 0.01 } }
  )pb");
  spec.set_vocabulary_size(3000);
  std::unique_ptr<EmbeddingTable> source = CreateOrNull(spec, {0, 1, 2}, 3);
  std::unique_ptr<EmbeddingTable> restored = CreateOrNull(spec, {0, 1, 2}, 3);
  ASSERT_NE(source, nullptr);
  ASSERT_NE(restored, nullptr);
  // 3 shards of 1000 rows, each of (1 + 2 slots) * 8 floats and a 4-byte count.
  EXPECT_EQ(source->reserved_bytes(), 3000 * (3 * 8 * 4 + 4));
  const std::vector<int64_t> all_keys = ExpectRoundTrip(*source, *restored, 0, 2999);
  ASSERT_GT(all_keys.size(), 1u);
  EXPECT_EQ(source->bytes(), source->reserved_bytes());
  EXPECT_EQ(source->row_bytes(), 3 * 8 * 4 + 4);
  // A checkpoint's cut copies the same rows, counts and floats.
  EmbeddingTable::RowsCopy copy;
  source->CopyRows(&copy);
  const auto snapshot = Snapshot(*source);
  ASSERT_EQ(copy.keys.size(), snapshot.size());
  for (size_t i = 0; i < copy.keys.size(); ++i) {
    const auto& want = snapshot.at(copy.keys[i]);
    EXPECT_EQ(copy.counts[i], want.t);
    EXPECT_EQ(copy.last[i], 0u);
    EXPECT_EQ(std::vector<float>(&copy.rows[i * 24], &copy.rows[i * 24] + 24),
              want.values_and_slots);
  }
  // Counts saturate one below a hashed table's (the array stores 1 + the count).
  std::vector<float> row(24, 3.0f);
  ASSERT_TRUE(restored->InsertRow(all_keys[0], row.data(), int64_t{1} << 40).ok());
  ASSERT_TRUE(Push(*restored, {all_keys[0]}, std::vector<float>(8, 0.5f)).ok());
  EXPECT_EQ(Snapshot(*restored).at(all_keys[0]).t, RowIndex::kMaxCount - 1);

  restored->Clear();
  EXPECT_EQ(restored->num_rows(), 0);
  EXPECT_TRUE(Snapshot(*restored).empty());
  EXPECT_EQ(PullOrDie(*restored, {all_keys[1]}), InitialRow(spec, all_keys[1]));
}

TEST(EmbeddingTableTest, CreateRefusesBadVocabularies) {
  const std::string base = "name: 'emb' dim: 8 optimizer { sgd { learning_rate: 0.1 } } ";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {base + "vocabulary_size: -1",
       "table emb: vocabulary_size -1: expected 0 (a hashed table) or a number of ids in [1, "
       "2^48]"},
      {base + "vocabulary_size: 281474976710657", "vocabulary_size 281474976710657: expected"},
      {base + "vocabulary_size: 10 admission { min_count: 2 }",
       "table emb: a vocabulary table (vocabulary_size 10) keeps a row for every id: admission "
       "and eviction are for hashed tables"},
      {base + "vocabulary_size: 10 eviction { max_rows: 100 }", "admission and eviction"},
  };
  for (const auto& [text, message] : cases) {
    absl::StatusOr<std::unique_ptr<EmbeddingTable>> table =
        EmbeddingTable::Create(ParseTable(text), {0}, 1);
    EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(table.status().message(), HasSubstr(message)) << text;
    EXPECT_EQ(EmbeddingTable::ReservedBytes(ParseTable(text), 1, 1).status().code(),
              absl::StatusCode::kInvalidArgument)
        << text;
  }
  // 2^48 ids of 2^20 floats do not fit any machine: refused, not attempted.
  absl::StatusOr<std::unique_ptr<EmbeddingTable>> huge = EmbeddingTable::Create(
      ParseTable("name: 'emb' dim: 1048576 optimizer { sgd { learning_rate: 0.1 } } "
                 "vocabulary_size: 281474976710656"),
      {0}, 1);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(huge.status().message(), HasSubstr("needs"));
}

}  // namespace
}  // namespace pscluster
