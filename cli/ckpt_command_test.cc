// psctl's checkpoint commands over a checkpoint written with the storage library, as the ps
// tasks write theirs. tests/psctl_test.cc does the same with one the chief takes.
#include "cli/ckpt_command.h"

#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/checkpoint_source.h"
#include "cli/dump_command.h"
#include "cli/npy_reader.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "rocksdb/db.h"
#include "storage/checkpoint.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  const std::string d = absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

v1::DenseShardSpec Partition(const v1::VariableSpec& var, int partition, int64_t begin, int64_t end,
                             int num) {
  v1::DenseShardSpec spec;
  *spec.mutable_variable() = var;
  v1::DensePartition* p = spec.mutable_partition();
  p->set_variable(var.name());
  p->set_partition(partition);
  p->set_num_partitions(num);
  p->set_row_begin(begin);
  p->set_row_end(end);
  p->set_ps_task(partition % 2);
  return spec;
}

// "w" [4, 3] in two partitions on two ps tasks (with a momentum slot after the values), "b"
// [3] on ps-0, and a table part on each: the value of w[r][c] is 10 r + c.
// With a `chain`, an incremental checkpoint on it: its table parts are deltas that remove one
// key each.
std::string WriteCheckpoint(const std::string& dir, int64_t step,
                            const std::vector<std::string>& chain = {}) {
  const std::string path = absl::StrCat(dir, "/", CheckpointDirName(step));
  v1::CheckpointManifest manifest;
  manifest.set_step(step);
  for (const std::string& name : chain) manifest.add_chain(name);
  manifest.set_num_ps(2);
  v1::VariableSpec* w = manifest.mutable_model()->add_variables();
  w->set_name("dense/w");
  w->mutable_shape()->add_dims(4);
  w->mutable_shape()->add_dims(3);
  w->mutable_optimizer()->mutable_momentum()->set_learning_rate(0.1f);
  v1::VariableSpec* b = manifest.mutable_model()->add_variables();
  b->set_name("b");
  b->mutable_shape()->add_dims(3);
  v1::TableSpec* emb = manifest.mutable_model()->add_tables();
  emb->set_name("emb");
  emb->set_dim(2);
  for (int ps = 0; ps < 2; ++ps) {
    auto writer = CheckpointWriter::Open(path, ps);
    EXPECT_TRUE(writer.ok()) << writer.status();
    std::vector<float> values_and_slots;
    for (int r = 2 * ps; r < 2 * ps + 2; ++r) {
      for (int c = 0; c < 3; ++c) values_and_slots.push_back(10 * r + c);
    }
    values_and_slots.resize(12, -1.0f);  // the momentum slot
    auto dense =
        (*writer)->WriteDense(Partition(*w, ps, 2 * ps, 2 * ps + 2, 2), 5, values_and_slots);
    EXPECT_TRUE(dense.ok());
    *manifest.add_shards() = *dense;
    if (ps == 0) {
      auto bias = (*writer)->WriteDense(Partition(*b, 0, 0, 3, 1), 5, {7, 8, 9});
      EXPECT_TRUE(bias.ok());
      *manifest.add_shards() = *bias;
    }
    auto table = (*writer)->WriteTable(*emb, {ps * 100 + 1, ps * 100 + 2}, {1, 2, 3, 4}, {1, 1}, 2);
    EXPECT_TRUE(table.ok());
    if (!chain.empty()) EXPECT_TRUE((*writer)->WriteTableRemoved({ps * 100 + 3}, &*table).ok());
    *manifest.add_shards() = *table;
    EXPECT_TRUE((*writer)->Finish().ok());
  }
  EXPECT_TRUE(CommitManifest(path, manifest).ok());
  return path;
}

TEST(CkptCommandTest, ListShowsCommittedCheckpointsNewestFirst) {
  const std::string dir = FreshDir("list");
  WriteCheckpoint(dir, 10);
  const std::string newest = WriteCheckpoint(dir, 30);
  std::filesystem::create_directories(dir + "/" + CheckpointDirName(40));  // uncommitted
  CommandOutput out = RunCheckpointListCommand(dir, OutputFormat::kJson);
  ASSERT_TRUE(out.status.ok()) << out.status;
  psctl::CheckpointListReport report;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out.text, &report).ok()) << out.text;
  ASSERT_EQ(report.checkpoints_size(), 2);
  EXPECT_EQ(report.checkpoints(0).path(), newest);
  EXPECT_EQ(report.checkpoints(0).step(), 30);
  EXPECT_EQ(report.checkpoints(0).shards(), 5);
  EXPECT_EQ(report.checkpoints(1).step(), 10);
  out = RunCheckpointListCommand(dir, OutputFormat::kTable);
  EXPECT_THAT(out.text, HasSubstr("ckpt-0000000030"));
  EXPECT_THAT(out.text, ::testing::Not(HasSubstr("ckpt-0000000040")));

  out = RunCheckpointListCommand(dir + "/missing", OutputFormat::kTable);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(out.status.message()), HasSubstr(dir + "/missing"));
}

TEST(CkptCommandTest, ShowPrintsTheManifestOfTheNewestOrTheNamedOne) {
  const std::string dir = FreshDir("show");
  const std::string old = WriteCheckpoint(dir, 10);
  WriteCheckpoint(dir, 20);
  CommandOutput out = RunCheckpointShowCommand(dir, OutputFormat::kTable);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_THAT(out.text, HasSubstr("step 20"));
  EXPECT_THAT(out.text, HasSubstr("dense/w/1"));
  EXPECT_THAT(out.text, HasSubstr("momentum(learning_rate=0.1)"));
  out = RunCheckpointShowCommand(old, OutputFormat::kJson);
  psctl::CheckpointShowReport report;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(out.text, &report).ok());
  EXPECT_EQ(report.manifest().step(), 10);
  EXPECT_EQ(report.manifest().shards_size(), 5);

  out = RunCheckpointShowCommand(dir + "/nothing-here", OutputFormat::kTable);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kNotFound);
}

TEST(CkptCommandTest, VerifyPassesAnIntactCheckpointAndNamesACorruptedShard) {
  const std::string dir = FreshDir("verify");
  const std::string path = WriteCheckpoint(dir, 7);
  CommandOutput out = RunCheckpointVerifyCommand(path, OutputFormat::kTable);
  ASSERT_TRUE(out.status.ok()) << out.status << "\n" << out.text;
  EXPECT_THAT(out.text, HasSubstr("5 shards ok, 0 failed"));

  // Rewrite dense/w/1's record in ps-1 with one value changed: RocksDB stays valid, only the
  // shard's checksum can tell.
  {
    rocksdb::DB* raw = nullptr;
    ASSERT_TRUE(rocksdb::DB::Open(rocksdb::Options(), path + "/ps-1", &raw).ok());
    std::unique_ptr<rocksdb::DB> db(raw);
    std::string value;
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), "d/dense/w/1", &value).ok());
    value[8] ^= 0x01;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), "d/dense/w/1", value).ok());
  }
  absl::Status status;
  psctl::CheckpointVerifyReport report = VerifyCheckpointShards(path, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(status.message()), HasSubstr("dense/w/1"));
  EXPECT_EQ(report.ok(), 4);
  EXPECT_EQ(report.failed(), 1);
  for (const psctl::ShardCheck& c : report.shards()) {
    EXPECT_EQ(c.ok(), !(c.name() == "dense/w" && c.partition() == 1)) << c.ShortDebugString();
  }
  out = RunCheckpointVerifyCommand(path, OutputFormat::kTable);
  EXPECT_THAT(out.text, HasSubstr("4 shards ok, 1 failed"));

  // Dumping the damaged variable fails the same way; the intact one still dumps.
  auto source = CheckpointVariableSource::Open(path);
  ASSERT_TRUE(source.ok());
  EXPECT_EQ((*source)->Read("dense/w").status().code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE((*source)->Read("b").ok());
}

// An incremental checkpoint is listed as a delta on its full one, shown with its chain and the
// changed rows and removed keys of each table part, and verified with the checkpoints it builds
// on: with its full one gone, verification fails naming it.
TEST(CkptCommandTest, IncrementalCheckpointsShowAndVerifyTheirChain) {
  const std::string dir = FreshDir("chain");
  WriteCheckpoint(dir, 10);
  WriteCheckpoint(dir, 20, {CheckpointDirName(10)});
  const std::string last = WriteCheckpoint(dir, 30, {CheckpointDirName(10), CheckpointDirName(20)});
  CommandOutput out = RunCheckpointListCommand(dir, OutputFormat::kTable);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_THAT(out.text, HasSubstr("KIND"));
  EXPECT_THAT(out.text, HasSubstr("delta 2 on ckpt-0000000010"));
  EXPECT_THAT(out.text, HasSubstr("delta 1 on ckpt-0000000010"));
  EXPECT_THAT(out.text, HasSubstr("full"));
  out = RunCheckpointShowCommand(last, OutputFormat::kTable);
  ASSERT_TRUE(out.status.ok()) << out.status;
  EXPECT_THAT(out.text, HasSubstr("incremental: builds on ckpt-0000000010, ckpt-0000000020 "
                                  "(ckpt-0000000010 full)"));
  EXPECT_THAT(out.text, HasSubstr("2 changed, 1 removed"));
  out = RunCheckpointVerifyCommand(last, OutputFormat::kTable);
  ASSERT_TRUE(out.status.ok()) << out.status << "\n" << out.text;
  EXPECT_THAT(out.text, HasSubstr("CHECKPOINT"));
  EXPECT_THAT(out.text, HasSubstr("15 shards ok, 0 failed"));

  std::filesystem::remove_all(absl::StrCat(dir, "/", CheckpointDirName(10)));
  absl::Status status;
  psctl::CheckpointVerifyReport report = VerifyCheckpointShards(last, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("ckpt-0000000010"));
  EXPECT_EQ(report.failed(), 1);
  EXPECT_EQ(report.ok(), 10);
}

TEST(CkptCommandTest, DumpJoinsPartitionsIntoTheFullVariable) {
  const std::string dir = FreshDir("dump");
  WriteCheckpoint(dir, 3);
  auto source = CheckpointVariableSource::Open(dir);  // the newest under dir
  ASSERT_TRUE(source.ok()) << source.status();
  const std::string npy = dir + "/w.npy";
  CommandOutput out = RunDumpCommand(**source, "dense/w", npy, OutputFormat::kTable);
  ASSERT_TRUE(out.status.ok()) << out.status;
  auto array = ReadNpyFile(npy);
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_THAT(array->shape, ::testing::ElementsAre(4, 3));
  std::vector<float> want;
  for (int r = 0; r < 4; ++r) {
    for (int c = 0; c < 3; ++c) want.push_back(10 * r + c);
  }
  EXPECT_EQ(array->values, want);

  out = RunDumpCommand(**source, "nope", npy, OutputFormat::kTable);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(out.status.message()), HasSubstr("unknown variable \"nope\""));

  // --all: every dense variable plus index.json.
  psctl::DumpReport report;
  ASSERT_TRUE(ExportVariablesToNpy(dir + "/all", **source, &report).ok());
  EXPECT_THAT(report.skipped_tables(), ::testing::ElementsAre("emb"));
  std::ifstream in(dir + "/all/index.json");
  std::stringstream json;
  json << in.rdbuf();
  google::protobuf::Struct index;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(json.str(), &index).ok()) << json.str();
  ASSERT_EQ(index.fields().size(), 2u);
  const auto& w = index.fields().at("dense/w").struct_value().fields();
  EXPECT_EQ(w.at("file").string_value(), "dense__w.npy");
  EXPECT_EQ(w.at("dtype").string_value(), "float32");
  ASSERT_EQ(w.at("shape").list_value().values_size(), 2);
  EXPECT_EQ(w.at("shape").list_value().values(0).number_value(), 4);
  auto b = ReadNpyFile(dir + "/all/b.npy");
  ASSERT_TRUE(b.ok());
  EXPECT_THAT(b->values, ::testing::ElementsAre(7, 8, 9));
}

}  // namespace
}  // namespace pscluster
