// Sparse tables through a recovery, with the real daemons: wide & deep (two embedding tables,
// Adagrad and FTRL) on synthetic CTR data in sync mode. A ps task killed with SIGKILL after a
// checkpoint makes the chief restore every ps task to it; the surviving task must drop the
// table rows created since (EmbeddingTable::Clear), or the replayed steps would update rows
// that should start from their initial values. The final model, every table row with its
// update count and every dense value, must be bit for bit that of the undisturbed run. Every
// test runs three times: with tables that keep their rows; with managed tables, which admit a
// key at its second push and evict rows (a TTL in steps and a capacity per ps task), whose
// admissions (the count-min sketch is checkpointed) and evictions must replay exactly too; and
// with vocabulary tables (ids placed by id mod the virtual shards, rows in arrays numbered by
// id), whose rows must land on the right tasks whatever their number.
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "proto/ps_service.grpc.pb.h"
#include "storage/checkpoint.h"
#include "testing/model_snapshot.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// The model of a committed checkpoint; a failure if it cannot be read.
ModelSnapshot ReadModel(const std::string& checkpoint) {
  absl::StatusOr<ModelSnapshot> m = ReadModelSnapshot(checkpoint);
  EXPECT_TRUE(m.ok()) << m.status();
  return m.ok() ? *std::move(m) : ModelSnapshot();
}

std::string TestDir(const std::string& name) {
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/", name);
  std::filesystem::remove_all(dir);
  return dir;
}

// The kinds of table a test runs with.
enum class Tables { kKeeping, kManaged, kVocabulary };

// configs/wide_deep_ctr.pbtxt (kKeeping), or a copy whose two tables admit a key at its second
// push, remove rows not pushed for 8 steps and keep at most 1024 rows per ps task, least
// recently pushed going first (kManaged), or are vocabularies of the synthetic data's 8 fields
// of 10,000 ids (kVocabulary).
std::string WideDeepConfig(Tables tables) {
  const std::string path = RunfilePath("configs/wide_deep_ctr.pbtxt");
  if (tables == Tables::kKeeping) return path;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  const std::string option =
      tables == Tables::kManaged
          ? "admission { min_count: 2 } eviction { ttl_steps: 8 max_rows: 1024 }\n"
          : "vocabulary_size: 80000\n";
  const std::string config =
      absl::StrReplaceAll(text.str(), {{"combiner: MEAN\n", "combiner: MEAN\n" + option},
                                       {"combiner: SUM\n", "combiner: SUM\n" + option}});
  EXPECT_EQ(config.size(), text.str().size() + 2 * option.size()) << "two tables";
  const std::string out =
      absl::StrCat(getenv("TEST_TMPDIR"), "/wide_deep_", static_cast<int>(tables), ".pbtxt");
  std::ofstream(out) << config;
  return out;
}

// 2 ps, 2 workers, sync; 12,000 synthetic examples, batches of 50: 120 steps, a checkpoint
// every 40. The workers pause 30 ms a step, so that a test can act between checkpoints.
TestClusterOptions WideDeep(const std::string& checkpoint_dir, Tables tables) {
  TestClusterOptions options;
  options.flags["chief"] = {"--model_config=" + WideDeepConfig(tables),
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

// The tables' ListShards figures summed over the cluster's ps tasks.
v1::ShardStats TableCounts(const TestCluster& cluster, int num_ps) {
  v1::ShardStats sum;
  for (int ps = 0; ps < num_ps; ++ps) {
    auto stub = v1::ParameterServer::NewStub(grpc::CreateChannel(
        cluster.address(absl::StrCat("ps:", ps)), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::ListShardsResponse response;
    const grpc::Status status = stub->ListShards(&context, v1::ListShardsRequest(), &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    for (const v1::ShardStats& s : response.shards()) {
      if (!s.is_table()) continue;
      sum.set_rows(sum.rows() + s.rows());
      sum.set_admitted_rows(sum.admitted_rows() + s.admitted_rows());
      sum.set_unadmitted_keys(sum.unadmitted_keys() + s.unadmitted_keys());
      sum.set_evicted_rows(sum.evicted_rows() + s.evicted_rows());
      sum.set_expired_rows(sum.expired_rows() + s.expired_rows());
    }
  }
  return sum;
}

// Waits (at most 120 s) until the newest committed checkpoint in `dir` is one `wanted` accepts,
// then SIGKILLs ps:1 and starts it again.
void KillPsOnceCommitted(TestCluster& cluster, const std::string& dir,
                         const std::function<bool(const v1::CheckpointManifest&)>& wanted) {
  bool committed = false;
  for (const absl::Time give_up = absl::Now() + absl::Seconds(120);
       !committed && absl::Now() < give_up;) {
    absl::StatusOr<std::vector<std::string>> all = ListCheckpoints(dir);
    if (all.ok() && !all->empty()) {
      absl::StatusOr<v1::CheckpointManifest> newest = ReadManifest(all->front());
      committed = newest.ok() && wanted(*newest);
    }
    if (!committed) absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(committed) << cluster.Logs();
  ASSERT_TRUE(cluster.ps(1).Signal(SIGKILL).ok());
  ASSERT_TRUE(cluster.ps(1).WaitForExit(absl::Seconds(5)).ok());
  ASSERT_TRUE(cluster.StartTask("ps", 1).ok()) << cluster.Logs();
}

// Every table row of `expected` in `actual` with the same values, slots and update count, and
// every dense value bit for bit (testing/model_snapshot.h).
void ExpectSameModel(const ModelSnapshot& expected, const ModelSnapshot& actual) {
  absl::Status same = CompareModels(expected, actual);
  EXPECT_TRUE(same.ok()) << same.message();
}

class TableRecoveryTest : public ::testing::TestWithParam<Tables> {
 protected:
  bool evicting() const { return GetParam() == Tables::kManaged; }
  std::string Dir(const std::string& name) const {
    return TestDir(absl::StrCat(name, "-", static_cast<int>(GetParam())));
  }

  // The undisturbed run: its final model, and the tables' counts while it still runs.
  void RunUndisturbed(const std::string& dir, ModelSnapshot* model, v1::ShardStats* counts) {
    auto cluster = TestCluster::Start(WideDeep(dir, GetParam()));
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    auto chief = ChiefStubOf(**cluster);
    v1::ClusterStatus s = AwaitFinished(*chief);
    ASSERT_TRUE(s.progress().finished()) << (*cluster)->Logs();
    ASSERT_EQ(s.global_step(), 120);
    *counts = TableCounts(**cluster, 2);
    std::cout << "tables: " << counts->rows() << " rows resident, " << counts->admitted_rows()
              << " admitted, " << counts->evicted_rows() << " evicted, " << counts->expired_rows()
              << " expired, " << counts->unadmitted_keys() << " pushed keys not admitted\n";
    *model = ReadModel(Newest(dir));
    ASSERT_EQ(model->step, 120);
    ASSERT_FALSE(model->rows.empty());
    // The tables are of the kind asked for, as the checkpoint records them.
    absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(Newest(dir));
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    int tables = 0;
    for (const v1::SavedShard& saved : manifest->shards()) {
      if (!saved.is_table()) continue;
      ++tables;
      EXPECT_EQ(saved.table().vocabulary_size(), GetParam() == Tables::kVocabulary ? 80000 : 0)
          << saved.name();
    }
    EXPECT_EQ(tables, 4) << "two tables on each of two ps tasks";
    // Admission and eviction happened in the managed run and only there; the final checkpoint
    // holds what the tables held.
    if (evicting()) {
      EXPECT_GT(counts->unadmitted_keys(), 0);
      EXPECT_GT(counts->evicted_rows(), 0);
      EXPECT_GT(counts->expired_rows(), 0);
      EXPECT_LE(counts->rows(), 2 * 2 * 1024);
    } else {
      EXPECT_EQ(counts->evicted_rows() + counts->expired_rows() + counts->unadmitted_keys(), 0);
      EXPECT_EQ(counts->admitted_rows(), counts->rows());
    }
    // Rows past their TTL but not yet swept are counted, not saved; without eviction, an
    // evaluation after the final checkpoint may have created rows.
    EXPECT_LE(static_cast<int64_t>(model->rows.size()), counts->rows());
  }
};

INSTANTIATE_TEST_SUITE_P(Tables, TableRecoveryTest,
                         ::testing::Values(Tables::kKeeping, Tables::kManaged, Tables::kVocabulary),
                         [](const ::testing::TestParamInfo<Tables>& info) {
                           return info.param == Tables::kKeeping   ? "Keeping"
                                  : info.param == Tables::kManaged ? "Managed"
                                                                   : "Vocabulary";
                         });

TEST_P(TableRecoveryTest, AKilledPsIsRestoredWithItsTablesToTheUndisturbedModel) {
  ModelSnapshot undisturbed;
  v1::ShardStats counts;
  RunUndisturbed(Dir("wide-deep-undisturbed"), &undisturbed, &counts);
  if (HasFatalFailure()) return;

  // The same run with ps:1 killed between the checkpoints of steps 40 and 80.
  const std::string dir = Dir("wide-deep-ps-kill");
  auto cluster = TestCluster::Start(WideDeep(dir, GetParam()));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = ChiefStubOf(**cluster);
  // The checkpoint of step 40 is written while training goes on: killed once it is committed
  // (and before the next one, of step 80, can be: its write takes a second at least).
  KillPsOnceCommitted(**cluster, dir,
                      [](const v1::CheckpointManifest& newest) { return newest.step() == 40; });
  if (HasFatalFailure()) return;
  v1::ClusterStatus s = AwaitFinished(*chief);
  ASSERT_TRUE(s.progress().finished()) << (*cluster)->Logs(40);
  EXPECT_THAT((*cluster)->chief().LogTail(400),
              HasSubstr("restored every ps task to the checkpoint of step 40"));

  // The checkpoint restored from holds fewer rows than the end: rows were created after it,
  // on both ps tasks, and the surviving one had to drop its own.
  ModelSnapshot at40;
  absl::StatusOr<std::vector<std::string>> committed = ListCheckpoints(dir);
  ASSERT_TRUE(committed.ok()) << committed.status();
  for (const std::string& path : *committed) {
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(path);
    if (m.ok() && m->step() == 40) at40 = ReadModel(path);
  }
  ASSERT_EQ(at40.step, 40) << "the checkpoint of step 40 was pruned";
  if (!evicting()) {
    EXPECT_LT(at40.rows.size(), undisturbed.rows.size());
  }

  const ModelSnapshot disturbed = ReadModel(Newest(dir));
  ASSERT_EQ(disturbed.step, 120);
  ExpectSameModel(undisturbed, disturbed);
}

// Incremental checkpoints (issue 36): a checkpoint every 20 steps, full every fourth, so those of
// steps 20, 40 and 60 are deltas on the full one of step 0 (taken at the start). ps:1 is killed
// right after the second delta (40) is committed: the chief restores the full checkpoint and the
// two deltas after it, and the run ends with the undisturbed run's model bit for bit. The
// checkpoint of step 40, read through its chain, is the undisturbed run's (full) checkpoint of
// step 40 bit for bit, and the first checkpoint after the restore is full (the tables' changes
// since the last cut are no longer known).
TEST_P(TableRecoveryTest, AKilledPsIsRestoredFromAFullCheckpointAndItsDeltas) {
  if (GetParam() == Tables::kVocabulary) {
    GTEST_SKIP() << "vocabulary tables are written whole in every checkpoint";
  }
  const std::string undisturbed_dir = Dir("wide-deep-undisturbed-for-deltas");
  ModelSnapshot undisturbed;
  v1::ShardStats counts;
  RunUndisturbed(undisturbed_dir, &undisturbed, &counts);
  if (HasFatalFailure()) return;

  const std::string dir = Dir("wide-deep-deltas");
  TestClusterOptions options = WideDeep(dir, GetParam());
  std::vector<std::string>& chief_flags = options.flags["chief"];
  chief_flags.erase(std::remove(chief_flags.begin(), chief_flags.end(),
                                std::string("--checkpoint_every_steps=40")),
                    chief_flags.end());
  chief_flags.push_back("--checkpoint_every_steps=20");
  chief_flags.push_back("--full_checkpoint_every=4");
  chief_flags.push_back("--keep_checkpoints=20");
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = ChiefStubOf(**cluster);
  KillPsOnceCommitted(**cluster, dir, [](const v1::CheckpointManifest& newest) {
    return newest.chain_size() == 2;  // the second delta on the full checkpoint
  });
  if (HasFatalFailure()) return;
  v1::ClusterStatus s = AwaitFinished(*chief);
  ASSERT_TRUE(s.progress().finished()) << (*cluster)->Logs(40);
  const std::string log = (*cluster)->chief().LogTail(400);
  EXPECT_THAT(log, HasSubstr("incremental: on 2 checkpoints from " + CheckpointDirName(0)));
  const std::string restored_at = "restored every ps task to the checkpoint of step ";
  const size_t at = log.find(restored_at);
  ASSERT_NE(at, std::string::npos) << log;
  // After the restore the chief knew the next checkpoint had to be full: no delta was tried and
  // refused. (Before it, a delta may be: the kill can come while the next checkpoint is due, the
  // chief cutting it before the restarted task registers again; the task refuses it, as it
  // should, and the chief writes none until it has restored.)
  EXPECT_THAT(log.substr(at), Not(HasSubstr("could not be cut")));
  const int64_t restored_step = std::atoll(log.c_str() + at + restored_at.size());
  EXPECT_EQ(restored_step, 40);

  std::map<int64_t, v1::CheckpointManifest> by_step;
  std::map<int64_t, std::string> path_of;
  absl::StatusOr<std::vector<std::string>> committed = ListCheckpoints(dir);
  ASSERT_TRUE(committed.ok()) << committed.status();
  for (const std::string& path : *committed) {
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(path);
    ASSERT_TRUE(m.ok()) << m.status();
    if (by_step.count(m->step())) continue;  // the newest of a step
    by_step[m->step()] = *m;
    path_of[m->step()] = path;
  }
  // 40 is a delta on 0 and 20: its table parts hold only the rows changed since 20.
  ASSERT_TRUE(by_step.count(0) && by_step.count(20) && by_step.count(40)) << "0, 20 and 40";
  EXPECT_TRUE(by_step[0].chain().empty());
  EXPECT_THAT(by_step[40].chain(), ElementsAre(CheckpointDirName(0), CheckpointDirName(20)));
  int64_t delta_rows = 0;
  for (const v1::SavedShard& saved : by_step[40].shards()) {
    if (!saved.is_table()) continue;
    EXPECT_TRUE(saved.delta()) << saved.name() << " " << saved.file();
    delta_rows += saved.rows();
  }
  EXPECT_GT(delta_rows, 0);
  // The model at step 40 through the chain is the undisturbed run's checkpoint of step 40.
  std::string undisturbed_40;
  const absl::StatusOr<std::vector<std::string>> undisturbed_checkpoints =
      ListCheckpoints(undisturbed_dir);
  ASSERT_TRUE(undisturbed_checkpoints.ok()) << undisturbed_checkpoints.status();
  for (const std::string& path : *undisturbed_checkpoints) {
    absl::StatusOr<v1::CheckpointManifest> m = ReadManifest(path);
    if (m.ok() && m->step() == 40) undisturbed_40 = path;
  }
  ASSERT_FALSE(undisturbed_40.empty()) << "the undisturbed checkpoint of step 40 was pruned";
  const ModelSnapshot at40 = ReadModel(path_of[40]);
  ExpectSameModel(ReadModel(undisturbed_40), at40);
  // Rows that keep: those not pushed between 20 and 40 are not in the delta. (Managed tables
  // hold only rows pushed in the last 8 steps: all changed.)
  if (!evicting()) EXPECT_LT(delta_rows, static_cast<int64_t>(at40.rows.size()));
  // After the restore, the chain starts again with a full checkpoint.
  const int64_t after = restored_step + 20;
  ASSERT_TRUE(by_step.count(after)) << "a checkpoint of step " << after;
  EXPECT_TRUE(by_step[after].chain().empty()) << path_of[after];

  const ModelSnapshot disturbed = ReadModel(Newest(dir));
  ASSERT_EQ(disturbed.step, 120);
  ExpectSameModel(undisturbed, disturbed);
}

// The whole cluster restarted with 3 ps tasks, then with 1, from the final checkpoint of a run
// with 2: the chief restores it (rows sent to their new owners) and, training being over,
// checkpoints it again when asked. Every row and dense value survives both moves bit for bit.
TEST_P(TableRecoveryTest, TablesAreRestoredIntoMoreAndFewerPsTasks) {
  const std::string dir = Dir("wide-deep-reshard");
  ModelSnapshot original;
  v1::ShardStats counts;
  RunUndisturbed(dir, &original, &counts);
  if (HasFatalFailure()) return;
  for (int num_ps : {3, 1}) {
    TestClusterOptions options = WideDeep(dir, GetParam());
    options.num_ps = num_ps;
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    auto chief = ChiefStubOf(**cluster);
    v1::ClusterStatus s = AwaitFinished(*chief);
    ASSERT_TRUE(s.progress().finished()) << (*cluster)->Logs();
    EXPECT_THAT((*cluster)->chief().LogTail(400),
                HasSubstr(absl::StrCat("restored into ", num_ps)));
    // Training being over, the chief checkpoints only when asked.
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::CheckpointResponse saved;
    const grpc::Status status = chief->Checkpoint(&context, v1::CheckpointRequest(), &saved);
    ASSERT_TRUE(status.ok()) << status.error_message() << (*cluster)->Logs();
    const std::string newest = Newest(dir);
    EXPECT_EQ(newest, saved.path()) << [&] {
      std::string listing;
      for (const auto& e : std::filesystem::directory_iterator(dir)) {
        listing += e.path().filename().string() + " ";
      }
      return listing;
    }() << (*cluster)->chief().LogTail(60);
    absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(newest);
    ASSERT_TRUE(manifest.ok()) << manifest.status();
    EXPECT_EQ(manifest->num_ps(), num_ps) << newest;
    // Every ps task holds a part of each table.
    if (num_ps == 3) {
      for (const v1::SavedShard& saved : manifest->shards()) {
        if (saved.is_table()) {
          EXPECT_GT(saved.rows(), 0) << saved.name() << " " << saved.file();
        }
      }
    }
    const ModelSnapshot restored = ReadModel(newest);
    EXPECT_EQ(restored.step, original.step);
    ExpectSameModel(original, restored);
    EXPECT_GE(TableCounts(**cluster, num_ps).rows(), static_cast<int64_t>(original.rows.size()));
  }
}

}  // namespace
}  // namespace pscluster
