#include "sharding/placement.h"

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/model.pb.h"
#include "sharding/sparse_hash.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

void AddVariable(v1::ModelSpec& model, const std::string& name,
                 std::initializer_list<int64_t> dims) {
  v1::VariableSpec* variable = model.add_variables();
  variable->set_name(name);
  variable->set_dtype(v1::DT_FLOAT32);
  for (int64_t dim : dims) variable->mutable_shape()->add_dims(dim);
}

void AddTable(v1::ModelSpec& model, const std::string& name, int64_t dim) {
  v1::TableSpec* table = model.add_tables();
  table->set_name(name);
  table->set_dim(dim);
}

v1::PlacementOptions Options(v1::PlacementOptions::Strategy strategy, int64_t max_partition_bytes,
                             int32_t num_virtual_shards) {
  v1::PlacementOptions options;
  options.set_strategy(strategy);
  options.set_max_partition_bytes(max_partition_bytes);
  options.set_num_virtual_shards(num_virtual_shards);
  return options;
}

// A model on which the two strategies differ. With max_partition_bytes = 80 (20 floats):
//   big   [5, 10]: 40-byte rows, 2 rows a partition -> [0,2) 80, [2,4) 80, [4,5) 40 bytes
//   small [1, 5]:  one partition of 20 bytes
//   mid   [2, 10]: one partition of 80 bytes
// plus a table "emb" of dim 16.
v1::ModelSpec MixedModel() {
  v1::ModelSpec model;
  AddVariable(model, "big", {5, 10});
  AddVariable(model, "small", {1, 5});
  AddVariable(model, "mid", {2, 10});
  AddTable(model, "emb", 16);
  return model;
}

struct Expected {
  std::string variable;
  int32_t partition;
  int32_t num_partitions;
  int64_t row_begin;
  int64_t row_end;
  int32_t ps_task;
  int64_t bytes;
};

void ExpectPartitions(const v1::Placement& placement, const std::vector<Expected>& expected) {
  ASSERT_EQ(placement.partitions_size(), static_cast<int>(expected.size()));
  for (int i = 0; i < placement.partitions_size(); ++i) {
    SCOPED_TRACE(testing::Message() << "partition #" << i);
    const v1::DensePartition& got = placement.partitions(i);
    EXPECT_EQ(got.variable(), expected[i].variable);
    EXPECT_EQ(got.partition(), expected[i].partition);
    EXPECT_EQ(got.num_partitions(), expected[i].num_partitions);
    EXPECT_EQ(got.row_begin(), expected[i].row_begin);
    EXPECT_EQ(got.row_end(), expected[i].row_end);
    EXPECT_EQ(got.ps_task(), expected[i].ps_task);
    EXPECT_EQ(got.bytes(), expected[i].bytes);
  }
}

TEST(ComputePlacementTest, RoundRobinPutsKthPartitionOnPsKModNumPs) {
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(MixedModel(), 3, Options(v1::PlacementOptions::ROUND_ROBIN, 80, 8));
  ASSERT_TRUE(placement.ok()) << placement.status();
  ExpectPartitions(*placement, {{"big", 0, 3, 0, 2, 0, 80},
                                {"big", 1, 3, 2, 4, 1, 80},
                                {"big", 2, 3, 4, 5, 2, 40},
                                {"small", 0, 1, 0, 1, 0, 20},
                                {"mid", 0, 1, 0, 2, 1, 80}});
  EXPECT_EQ(placement->num_ps(), 3);
  ASSERT_EQ(placement->tables_size(), 1);
  EXPECT_EQ(placement->tables(0).table(), "emb");
  EXPECT_EQ(placement->tables(0).dim(), 16);
  EXPECT_THAT(placement->virtual_shard_to_ps(), ElementsAre(0, 1, 2, 0, 1, 2, 0, 1));
}

TEST(ComputePlacementTest, GreedyBytesPutsEachPartitionOnLeastLoadedPs) {
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(MixedModel(), 3, Options(v1::PlacementOptions::GREEDY_BYTES, 80, 8));
  ASSERT_TRUE(placement.ok()) << placement.status();
  // Loads (ps0, ps1, ps2) before each: big/0 (0,0,0) -> 0; big/1 (80,0,0) -> 1;
  // big/2 (80,80,0) -> 2; small (80,80,40) -> 2; mid (80,80,60) -> 2. Round robin would
  // have put small on 0 and mid on 1.
  ExpectPartitions(*placement, {{"big", 0, 3, 0, 2, 0, 80},
                                {"big", 1, 3, 2, 4, 1, 80},
                                {"big", 2, 3, 4, 5, 2, 40},
                                {"small", 0, 1, 0, 1, 2, 20},
                                {"mid", 0, 1, 0, 2, 2, 80}});
}

TEST(ComputePlacementTest, GreedyBreaksTiesTowardLowestIndex) {
  v1::ModelSpec model;
  AddVariable(model, "a", {4});  // 16 bytes
  AddVariable(model, "b", {4});
  AddVariable(model, "c", {2});  // 8 bytes
  AddVariable(model, "d", {2});
  AddVariable(model, "e", {1});
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(model, 3, Options(v1::PlacementOptions::GREEDY_BYTES, 0, 0));
  ASSERT_TRUE(placement.ok()) << placement.status();
  // (0,0,0) a->0; (16,0,0) b->1; (16,16,0) c->2; (16,16,8) d->2; (16,16,16) e->0.
  std::vector<int32_t> ps;
  for (const v1::DensePartition& partition : placement->partitions()) {
    ps.push_back(partition.ps_task());
  }
  EXPECT_THAT(ps, ElementsAre(0, 1, 2, 2, 0));
}

TEST(ComputePlacementTest, MorePsThanPartitions) {
  v1::ModelSpec model;
  AddVariable(model, "a", {4});
  AddVariable(model, "b", {0, 3});  // no rows: one empty partition
  for (auto strategy : {v1::PlacementOptions::ROUND_ROBIN, v1::PlacementOptions::GREEDY_BYTES}) {
    absl::StatusOr<v1::Placement> placement = ComputePlacement(model, 100, Options(strategy, 0, 0));
    ASSERT_TRUE(placement.ok()) << placement.status();
    ExpectPartitions(*placement, {{"a", 0, 1, 0, 4, 0, 16}, {"b", 0, 1, 0, 0, 1, 0}});
  }
}

TEST(ComputePlacementTest, ScalarAndUnsetDtypeAreFloat32) {
  v1::ModelSpec model;
  v1::VariableSpec* step = model.add_variables();
  step->set_name("global_step");  // a scalar, dtype left unset
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(model, 2, Options(v1::PlacementOptions::ROUND_ROBIN, 0, 0));
  ASSERT_TRUE(placement.ok()) << placement.status();
  ExpectPartitions(*placement, {{"global_step", 0, 1, 0, 1, 0, 4}});
}

TEST(ComputePlacementTest, ZeroVirtualShardsMeansDefault) {
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(MixedModel(), 2, Options(v1::PlacementOptions::ROUND_ROBIN, 0, 0));
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->virtual_shard_to_ps_size(), kDefaultNumVirtualShards);
  EXPECT_EQ(placement->options().num_virtual_shards(), kDefaultNumVirtualShards);
  for (int v = 0; v < kDefaultNumVirtualShards; ++v) {
    EXPECT_EQ(placement->virtual_shard_to_ps(v), v % 2);
  }
}

TEST(ComputePlacementTest, IsDeterministic) {
  const v1::PlacementOptions options = Options(v1::PlacementOptions::GREEDY_BYTES, 80, 0);
  absl::StatusOr<v1::Placement> first = ComputePlacement(MixedModel(), 3, options);
  absl::StatusOr<v1::Placement> second = ComputePlacement(MixedModel(), 3, options);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(first->version(), second->version());
  EXPECT_EQ(first->SerializeAsString(), second->SerializeAsString());
  EXPECT_GT(first->version(), 0);
  EXPECT_EQ(PlacementVersion(*first), first->version());
}

// The fingerprint, worked out independently (FNV-1a 64 in Python over the same encoding), is
// pinned: processes built from different revisions must still agree on it.
TEST(ComputePlacementTest, VersionMatchesPinnedFingerprint) {
  absl::StatusOr<v1::Placement> round_robin =
      ComputePlacement(MixedModel(), 3, Options(v1::PlacementOptions::ROUND_ROBIN, 80, 8));
  absl::StatusOr<v1::Placement> greedy =
      ComputePlacement(MixedModel(), 3, Options(v1::PlacementOptions::GREEDY_BYTES, 80, 8));
  ASSERT_TRUE(round_robin.ok()) << round_robin.status();
  ASSERT_TRUE(greedy.ok()) << greedy.status();
  EXPECT_EQ(round_robin->version(), int64_t{5518282270572791665});
  EXPECT_EQ(greedy->version(), int64_t{5251045357339718679});
}

// A large variable is spread over every ps task by default (as ps-lite spreads key ranges); a
// small one stays whole; a negative split_bytes keeps the old behaviour.
TEST(ComputePlacementTest, LargeVariablesAreSplitOverEveryPsTaskByDefault) {
  v1::ModelSpec model;
  v1::VariableSpec* big = model.add_variables();
  big->set_name("big");
  big->mutable_shape()->add_dims(784);
  big->mutable_shape()->add_dims(256);  // 784 KiB
  v1::VariableSpec* small = model.add_variables();
  small->set_name("small");
  small->mutable_shape()->add_dims(256);
  absl::StatusOr<v1::Placement> p = ComputePlacement(model, 3, v1::PlacementOptions());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->options().split_bytes(), kDefaultSplitBytes);
  ASSERT_EQ(p->partitions_size(), 4);
  std::set<int> big_ps;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(p->partitions(i).variable(), "big");
    EXPECT_EQ(p->partitions(i).num_partitions(), 3);
    big_ps.insert(p->partitions(i).ps_task());
  }
  EXPECT_EQ(big_ps.size(), 3u);
  EXPECT_EQ(p->partitions(0).row_end() - p->partitions(0).row_begin(), 262);
  EXPECT_EQ(p->partitions(2).row_end(), 784);
  EXPECT_EQ(p->partitions(3).variable(), "small");
  EXPECT_EQ(p->partitions(3).num_partitions(), 1);
  v1::PlacementOptions never;
  never.set_split_bytes(-1);
  absl::StatusOr<v1::Placement> whole = ComputePlacement(model, 3, never);
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->partitions_size(), 2);
  // One ps task: nothing to spread over.
  absl::StatusOr<v1::Placement> one = ComputePlacement(model, 1, v1::PlacementOptions());
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->partitions_size(), 2);
}

TEST(ComputePlacementTest, VersionChangesWithContent) {
  const v1::PlacementOptions options = Options(v1::PlacementOptions::ROUND_ROBIN, 80, 0);
  absl::StatusOr<v1::Placement> base = ComputePlacement(MixedModel(), 3, options);
  ASSERT_TRUE(base.ok()) << base.status();

  absl::StatusOr<v1::Placement> other_num_ps = ComputePlacement(MixedModel(), 4, options);
  ASSERT_TRUE(other_num_ps.ok()) << other_num_ps.status();
  EXPECT_NE(base->version(), other_num_ps->version());

  v1::ModelSpec renamed = MixedModel();
  renamed.mutable_variables(0)->set_name("bigger");
  absl::StatusOr<v1::Placement> other_name = ComputePlacement(renamed, 3, options);
  ASSERT_TRUE(other_name.ok()) << other_name.status();
  EXPECT_NE(base->version(), other_name->version());

  absl::StatusOr<v1::Placement> other_split =
      ComputePlacement(MixedModel(), 3, Options(v1::PlacementOptions::ROUND_ROBIN, 40, 0));
  ASSERT_TRUE(other_split.ok()) << other_split.status();
  EXPECT_NE(base->version(), other_split->version());

  // A table that becomes a vocabulary moves its keys: another version; it is listed too.
  v1::ModelSpec vocabulary = MixedModel();
  vocabulary.mutable_tables(0)->set_vocabulary_size(1000);
  absl::StatusOr<v1::Placement> other_keys = ComputePlacement(vocabulary, 3, options);
  ASSERT_TRUE(other_keys.ok()) << other_keys.status();
  EXPECT_NE(base->version(), other_keys->version());
  EXPECT_EQ(other_keys->tables(0).vocabulary_size(), 1000);
  EXPECT_EQ(base->tables(0).vocabulary_size(), 0);
  EXPECT_THAT(PlacementDebugString(*other_keys), HasSubstr("ids < 1000"));

  v1::Placement edited = *base;
  edited.mutable_partitions(0)->set_ps_task(2);
  EXPECT_NE(PlacementVersion(edited), base->version());
  // The version field itself is not part of the fingerprint.
  edited = *base;
  edited.set_version(12345);
  EXPECT_EQ(PlacementVersion(edited), base->version());
}

TEST(PartitionsOfTest, ReturnsPartitionsInOrder) {
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(MixedModel(), 3, Options(v1::PlacementOptions::ROUND_ROBIN, 80, 0));
  ASSERT_TRUE(placement.ok()) << placement.status();
  absl::StatusOr<std::vector<const v1::DensePartition*>> partitions =
      PartitionsOf(*placement, "big");
  ASSERT_TRUE(partitions.ok()) << partitions.status();
  ASSERT_EQ(partitions->size(), 3u);
  for (int p = 0; p < 3; ++p) {
    EXPECT_EQ((*partitions)[p]->variable(), "big");
    EXPECT_EQ((*partitions)[p]->partition(), p);
    EXPECT_EQ((*partitions)[p], &placement->partitions(p));
  }
}

TEST(PartitionsOfTest, UnknownVariableIsNotFound) {
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(MixedModel(), 3, Options(v1::PlacementOptions::ROUND_ROBIN, 80, 0));
  ASSERT_TRUE(placement.ok()) << placement.status();
  absl::StatusOr<std::vector<const v1::DensePartition*>> partitions =
      PartitionsOf(*placement, "nope");
  EXPECT_EQ(partitions.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(partitions.status().message(), HasSubstr("variable 'nope'"));
  // A table is not a dense variable.
  EXPECT_EQ(PartitionsOf(*placement, "emb").status().code(), absl::StatusCode::kNotFound);
}

TEST(PsOfKeyTest, FollowsVirtualShardAssignment) {
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(MixedModel(), 3, Options(v1::PlacementOptions::ROUND_ROBIN, 0, 64));
  ASSERT_TRUE(placement.ok()) << placement.status();
  std::vector<int> keys_per_ps(3, 0);
  for (int64_t key = -500; key < 10000; ++key) {
    const int32_t ps = PsOfKey(*placement, key);
    ASSERT_GE(ps, 0);
    ASSERT_LT(ps, 3);
    EXPECT_EQ(ps, VirtualShardOfKey(key, 64) % 3);
    ++keys_per_ps[ps];
  }
  for (int count : keys_per_ps) EXPECT_GT(count, 0);
}

TEST(PsOfKeyTest, EmptyPlacementHasNoOwner) { EXPECT_EQ(PsOfKey(v1::Placement(), 42), -1); }

TEST(PlacementDebugStringTest, ListsPartitionsTablesAndPsLoadsAligned) {
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(MixedModel(), 4, Options(v1::PlacementOptions::GREEDY_BYTES, 80, 8));
  ASSERT_TRUE(placement.ok()) << placement.status();
  const std::string text = PlacementDebugString(*placement);
  EXPECT_THAT(text, HasSubstr("4 ps tasks, strategy GREEDY_BYTES"));
  EXPECT_THAT(text, HasSubstr("big       0/3        [0, 2)        0     80"));
  EXPECT_THAT(text, HasSubstr("small     0/1        [0, 1)        3     20"));
  EXPECT_THAT(text, HasSubstr("emb     16"));
  EXPECT_THAT(text, HasSubstr("virtual shards"));

  // Every line of the partition table is as long as its header, bytes being right-aligned.
  const std::vector<std::string> lines = absl::StrSplit(text, '\n');
  size_t header = 0;
  while (header < lines.size() && lines[header].find("variable") == std::string::npos) ++header;
  ASSERT_LT(header + 5, lines.size()) << text;
  for (size_t i = header + 1; i <= header + 5; ++i) {
    EXPECT_EQ(lines[i].size(), lines[header].size()) << text;
  }
}

TEST(PlacementDebugStringTest, CountsIdlePsTasks) {
  v1::ModelSpec model;
  AddVariable(model, "a", {4});
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(model, 10, Options(v1::PlacementOptions::ROUND_ROBIN, 0, 4));
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_THAT(PlacementDebugString(*placement), HasSubstr("(6 other ps tasks hold nothing)"));
}

void ExpectInvalid(const v1::ModelSpec& model, int32_t num_ps, const v1::PlacementOptions& options,
                   const std::string& substring) {
  absl::StatusOr<v1::Placement> placement = ComputePlacement(model, num_ps, options);
  EXPECT_EQ(placement.status().code(), absl::StatusCode::kInvalidArgument) << placement.status();
  EXPECT_THAT(placement.status().message(), HasSubstr(substring));
}

v1::PlacementOptions RoundRobin() { return Options(v1::PlacementOptions::ROUND_ROBIN, 0, 0); }

TEST(ComputePlacementTest, RejectsNumPsBelowOne) {
  ExpectInvalid(MixedModel(), 0, RoundRobin(), "num_ps must be >= 1, got 0");
  ExpectInvalid(MixedModel(), -3, RoundRobin(), "num_ps must be >= 1, got -3");
}

TEST(ComputePlacementTest, RejectsDuplicateVariableName) {
  v1::ModelSpec model = MixedModel();
  AddVariable(model, "small", {3});
  ExpectInvalid(model, 2, RoundRobin(), "name 'small' is used by both variable #1 and variable #3");
}

TEST(ComputePlacementTest, RejectsNameSharedByVariableAndTable) {
  v1::ModelSpec model = MixedModel();
  AddTable(model, "mid", 8);
  ExpectInvalid(model, 2, RoundRobin(), "name 'mid' is used by both variable #2 and table #1");
}

TEST(ComputePlacementTest, RejectsDuplicateTableName) {
  v1::ModelSpec model = MixedModel();
  AddTable(model, "emb", 8);
  ExpectInvalid(model, 2, RoundRobin(), "name 'emb' is used by both table #0 and table #1");
}

TEST(ComputePlacementTest, RejectsEmptyNames) {
  v1::ModelSpec model = MixedModel();
  AddVariable(model, "", {3});
  ExpectInvalid(model, 2, RoundRobin(), "variable #3 has an empty name");

  model = MixedModel();
  AddTable(model, "", 4);
  ExpectInvalid(model, 2, RoundRobin(), "table #1 has an empty name");
}

TEST(ComputePlacementTest, RejectsNegativeDimension) {
  v1::ModelSpec model = MixedModel();
  AddVariable(model, "bad", {3, -2});
  ExpectInvalid(model, 2, RoundRobin(), "variable 'bad': dimension 1 of shape [3, -2] is negative");
}

TEST(ComputePlacementTest, RejectsTableDimBelowOne) {
  v1::ModelSpec model = MixedModel();
  AddTable(model, "flat", 0);
  ExpectInvalid(model, 2, RoundRobin(), "table 'flat' has dim 0");

  model = MixedModel();
  AddTable(model, "negative", -4);
  ExpectInvalid(model, 2, RoundRobin(), "table 'negative' has dim -4");
}

TEST(ComputePlacementTest, RejectsNegativeNumVirtualShards) {
  ExpectInvalid(MixedModel(), 2, Options(v1::PlacementOptions::ROUND_ROBIN, 0, -1),
                "options.num_virtual_shards must be >= 0");
  ExpectInvalid(MixedModel(), 2, Options(v1::PlacementOptions::ROUND_ROBIN, 0, -1), "got -1");
}

TEST(ComputePlacementTest, RejectsNegativeMaxPartitionBytes) {
  ExpectInvalid(MixedModel(), 2, Options(v1::PlacementOptions::ROUND_ROBIN, -8, 0),
                "options.max_partition_bytes must be >= 0");
}

TEST(ComputePlacementTest, RejectsUnknownStrategy) {
  ExpectInvalid(MixedModel(), 2, Options(static_cast<v1::PlacementOptions::Strategy>(7), 0, 0),
                "options.strategy 7 is not a known strategy");
}

TEST(ComputePlacementTest, RejectsNonFloat32Variable) {
  v1::ModelSpec model = MixedModel();
  model.mutable_variables(1)->set_dtype(v1::DT_INT64);
  ExpectInvalid(model, 2, RoundRobin(), "variable 'small' has dtype DT_INT64");
}

// With replication 2 every dense partition and virtual shard has a backup on another task; a
// task's virtual shards have their backups on every other task in turn, so that its death
// moves its load to all of them; each task backs up about as many virtual shards as it owns;
// the primaries are where they were without backups. Replication 0 or 1 changes nothing, the
// version included.
TEST(ComputePlacementTest, ReplicationTwoGivesEveryItemABackupSpreadOverTheOtherTasks) {
  v1::ModelSpec model = MixedModel();
  AddVariable(model, "wide", {64, 1024});  // 256 KiB: split over every task
  for (const int32_t num_ps : {2, 3, 4, 7}) {
    SCOPED_TRACE(num_ps);
    v1::PlacementOptions options = Options(v1::PlacementOptions::ROUND_ROBIN, 0, 1024);
    const absl::StatusOr<v1::Placement> plain = ComputePlacement(model, num_ps, options);
    options.set_replication(1);
    const absl::StatusOr<v1::Placement> one = ComputePlacement(model, num_ps, options);
    options.set_replication(2);
    const absl::StatusOr<v1::Placement> two = ComputePlacement(model, num_ps, options);
    ASSERT_TRUE(plain.ok()) << plain.status();
    ASSERT_TRUE(one.ok()) << one.status();
    ASSERT_TRUE(two.ok()) << two.status();
    EXPECT_EQ(one->version(), plain->version());
    EXPECT_TRUE(one->virtual_shard_to_backup_ps().empty());
    EXPECT_NE(two->version(), plain->version());
    EXPECT_EQ(two->version(), PlacementVersion(*two));

    EXPECT_THAT(two->virtual_shard_to_ps(),
                ::testing::ElementsAreArray(plain->virtual_shard_to_ps()));
    ASSERT_EQ(two->virtual_shard_to_backup_ps_size(), two->virtual_shard_to_ps_size());
    std::vector<std::set<int32_t>> backed_up_on(num_ps);
    std::vector<int64_t> owned(num_ps, 0), backups(num_ps, 0);
    for (int v = 0; v < two->virtual_shard_to_ps_size(); ++v) {
      const int32_t primary = two->virtual_shard_to_ps(v);
      const int32_t backup = two->virtual_shard_to_backup_ps(v);
      ASSERT_GE(backup, 0);
      ASSERT_LT(backup, num_ps);
      EXPECT_NE(backup, primary) << "virtual shard " << v;
      backed_up_on[primary].insert(backup);
      ++owned[primary];
      ++backups[backup];
    }
    for (int32_t ps = 0; ps < num_ps; ++ps) {
      EXPECT_EQ(backed_up_on[ps].size(), static_cast<size_t>(num_ps - 1)) << "ps " << ps;
      EXPECT_LE(std::abs(backups[ps] - owned[ps]), num_ps) << "ps " << ps;
    }

    ASSERT_EQ(two->partitions_size(), plain->partitions_size());
    std::set<int32_t> wide_backups;
    for (int i = 0; i < two->partitions_size(); ++i) {
      const v1::DensePartition& partition = two->partitions(i);
      EXPECT_EQ(partition.ps_task(), plain->partitions(i).ps_task());
      EXPECT_NE(partition.backup_ps_task(), partition.ps_task())
          << partition.variable() << "/" << partition.partition();
      EXPECT_GE(partition.backup_ps_task(), 0);
      EXPECT_LT(partition.backup_ps_task(), num_ps);
      if (partition.variable() == "wide") wide_backups.insert(partition.backup_ps_task());
    }
    // One partition of "wide" on each task; their backups on more than one task.
    EXPECT_GT(wide_backups.size(), 1u);

    const std::string listing = PlacementDebugString(*two);
    EXPECT_THAT(listing, HasSubstr("each with a backup"));
    EXPECT_THAT(listing, HasSubstr("backup shards"));
    EXPECT_THAT(PlacementDebugString(*plain), ::testing::Not(HasSubstr("backup")));
  }
}

TEST(ComputePlacementTest, RejectsReplicationItCannotPlace) {
  v1::PlacementOptions options = RoundRobin();
  options.set_replication(2);
  ExpectInvalid(
      MixedModel(), 1, options,
      "options.replication 2 needs at least 2 ps tasks (a backup on another task), got 1");
  for (const int32_t replication : {-1, 3}) {
    options.set_replication(replication);
    ExpectInvalid(MixedModel(), 3, options,
                  absl::StrCat("options.replication must be 0 or 1 (no backup) or 2 (a primary "
                               "and a backup), got ",
                               replication));
  }
}

TEST(PlacementKeysTest, EveryVirtualShardHasOneOwnerAndEveryKeyGoesToIt) {
  absl::StatusOr<v1::Placement> placement =
      ComputePlacement(MixedModel(), 3, Options(v1::PlacementOptions::ROUND_ROBIN, 80, 8));
  ASSERT_TRUE(placement.ok()) << placement.status();
  const std::vector<std::vector<int32_t>> owned = VirtualShardsByPs(*placement);
  ASSERT_EQ(owned.size(), 3u);
  EXPECT_THAT(owned[0], ElementsAre(0, 3, 6));
  EXPECT_THAT(owned[1], ElementsAre(1, 4, 7));
  EXPECT_THAT(owned[2], ElementsAre(2, 5));
  for (int64_t key : {int64_t{0}, int64_t{1}, int64_t{-5}, int64_t{1} << 40}) {
    const int32_t v = VirtualShardOfKey(key, 8);
    const int32_t ps = PsOfKey(*placement, key);
    EXPECT_THAT(owned[ps], ::testing::Contains(v)) << key;
  }
  EXPECT_EQ(PsOfKey(v1::Placement(), 7), -1);
}

}  // namespace
}  // namespace pscluster
