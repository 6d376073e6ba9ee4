// Sparse tables through a recovery, with the real daemons: wide & deep (two embedding tables,
// Adagrad and FTRL) on synthetic CTR data in sync mode. A ps task killed with SIGKILL after a
// checkpoint makes the chief restore every ps task to it; the surviving task must drop the
// table rows created since (EmbeddingTable::Clear), or the replayed steps would update rows
// that should start from their initial values. The final model, every table row with its
// update count and every dense value, must be bit for bit that of the undisturbed run.
#include <signal.h>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "storage/checkpoint.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

// A checkpoint's contents: dense shards by "name/partition", table rows by (table, key).
struct Model {
  int64_t step = 0;
  std::map<std::string, std::vector<float>> dense;
  std::map<std::tuple<std::string, int64_t>, std::vector<float>> rows;
  std::map<std::tuple<std::string, int64_t>, int64_t> counts;
};

Model ReadModel(const std::string& checkpoint) {
  Model m;
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(checkpoint);
  EXPECT_TRUE(manifest.ok()) << manifest.status();
  if (!manifest.ok()) return m;
  m.step = manifest->step();
  for (const v1::SavedShard& saved : manifest->shards()) {
    auto reader = CheckpointReader::Open(checkpoint + "/" + saved.file());
    EXPECT_TRUE(reader.ok()) << reader.status();
    if (!reader.ok()) continue;
    if (!saved.is_table()) {
      absl::StatusOr<DenseRecord> r = (*reader)->ReadDense(saved);
      EXPECT_TRUE(r.ok()) << r.status();
      if (r.ok()) m.dense[absl::StrCat(saved.name(), "/", saved.partition())] = r->values_and_slots;
      continue;
    }
    // values and one slot (Adagrad: accumulator; FTRL: two slots) per row.
    const int64_t slots = saved.table().optimizer().has_ftrl() ? 2 : 1;
    const int64_t floats = (1 + slots) * saved.table().dim();
    absl::Status s = (*reader)->ReadTable(saved, [&](int64_t key, const float* row, int64_t t) {
      m.rows[{saved.name(), key}] = std::vector<float>(row, row + floats);
      m.counts[{saved.name(), key}] = t;
    });
    EXPECT_TRUE(s.ok()) << s;
  }
  return m;
}

std::string TestDir(const std::string& name) {
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  std::filesystem::remove_all(dir);
  return dir;
}

// 2 ps, 2 workers, sync; 12,000 synthetic examples, batches of 50: 120 steps, a checkpoint
// every 40. The workers pause 30 ms a step, so that a test can act between checkpoints.
TestClusterOptions WideDeep(const std::string& checkpoint_dir) {
  TestClusterOptions options;
  options.flags["chief"] = {"--model_config=" + RunfilePath("configs/wide_deep_ctr.pbtxt"),
                            "--data=synthetic_ctr",
                            "--synthetic_examples=12000",
                            "--max_test_examples=1000",
                            "--mode=sync",
                            "--epochs=1",
                            "--batch_size=50",
                            "--eval_every_secs=60",
                            "--heartbeat_interval_ms=200",
                            "--heartbeat_timeout_ms=1500",
                            "--checkpoint_dir=" + checkpoint_dir,
                            "--checkpoint_every_steps=40"};
  options.flags["worker"] = {"--step_delay_ms=30"};
  return options;
}

v1::ClusterStatus AwaitFinished(v1::Coordinator::StubInterface& chief) {
  const absl::Time deadline = absl::Now() + absl::Seconds(240);
  v1::ClusterStatus s;
  do {
    s = ClusterStatusOf(chief);
    if (s.progress().finished()) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  return s;
}

// The newest committed checkpoint of `dir` (the final one once training is over).
std::string Newest(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> all = ListCheckpoints(dir);
  EXPECT_TRUE(all.ok() && !all->empty()) << dir;
  return all.ok() && !all->empty() ? all->front() : "";
}

TEST(TableRecoveryTest, AKilledPsIsRestoredWithItsTablesToTheUndisturbedModel) {
  // The undisturbed run.
  const std::string undisturbed_dir = TestDir("wide-deep-undisturbed");
  Model undisturbed;
  {
    auto cluster = TestCluster::Start(WideDeep(undisturbed_dir));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    auto chief = ChiefStubOf(**cluster);
    v1::ClusterStatus s = AwaitFinished(*chief);
    ASSERT_TRUE(s.progress().finished()) << (*cluster)->Logs();
    ASSERT_EQ(s.global_step(), 120);
    undisturbed = ReadModel(Newest(undisturbed_dir));
  }
  ASSERT_EQ(undisturbed.step, 120);
  ASSERT_FALSE(undisturbed.rows.empty());

  // The same run with ps:1 killed between the checkpoints of steps 40 and 80.
  const std::string dir = TestDir("wide-deep-ps-kill");
  auto cluster = TestCluster::Start(WideDeep(dir));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = ChiefStubOf(**cluster);
  ASSERT_TRUE(AwaitGlobalStep(*chief, 55, absl::Seconds(120))) << (*cluster)->Logs();
  ASSERT_TRUE((*cluster)->ps(1).Signal(SIGKILL).ok());
  ASSERT_TRUE((*cluster)->ps(1).WaitForExit(absl::Seconds(5)).ok());
  ASSERT_TRUE((*cluster)->StartTask("ps", 1).ok()) << (*cluster)->Logs();
  v1::ClusterStatus s = AwaitFinished(*chief);
  ASSERT_TRUE(s.progress().finished()) << (*cluster)->Logs(40);
  EXPECT_THAT((*cluster)->chief().LogTail(400),
              HasSubstr("restored every ps task to the checkpoint of step 40"));

  // The checkpoint restored from holds fewer rows than the end: rows were created after it,
  // on both ps tasks, and the surviving one had to drop its own.
  Model at40;
  absl::StatusOr<std::vector<std::string>> committed = ListCheckpoints(dir);
  ASSERT_TRUE(committed.ok()) << committed.status();
  for (const std::string& path : *committed) {
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(path);
    if (m.ok() && m->step() == 40) at40 = ReadModel(path);
  }
  ASSERT_EQ(at40.step, 40) << "the checkpoint of step 40 was pruned";
  EXPECT_LT(at40.rows.size(), undisturbed.rows.size());

  const Model disturbed = ReadModel(Newest(dir));
  ASSERT_EQ(disturbed.step, 120);
  EXPECT_EQ(disturbed.rows.size(), undisturbed.rows.size());
  int64_t differing_rows = 0;
  for (const auto& [key, row] : undisturbed.rows) {
    auto it = disturbed.rows.find(key);
    if (it == disturbed.rows.end() ||
        std::memcmp(it->second.data(), row.data(), row.size() * sizeof(float)) != 0 ||
        disturbed.counts.at(key) != undisturbed.counts.at(key)) {
      ++differing_rows;
    }
  }
  EXPECT_EQ(differing_rows, 0) << "of " << undisturbed.rows.size() << " rows";
  ASSERT_EQ(disturbed.dense.size(), undisturbed.dense.size());
  for (const auto& [name, values] : undisturbed.dense) {
    ASSERT_EQ(disturbed.dense.count(name), 1u) << name;
    EXPECT_EQ(
        std::memcmp(disturbed.dense.at(name).data(), values.data(), values.size() * sizeof(float)),
        0)
        << name;
  }
}

}  // namespace
}  // namespace pscluster
