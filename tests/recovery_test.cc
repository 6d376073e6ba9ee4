// Recovery from killed processes through the real daemons, with checkpoints in RocksDB.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "storage/checkpoint.h"
#include "testing/test_cluster.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

v1::ClusterStatus AwaitFinished(v1::Coordinator::Stub& chief, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  v1::ClusterStatus s;
  do {
    s = ClusterStatusOf(chief);
    if (s.progress().finished()) break;
    absl::SleepFor(absl::Milliseconds(100));
  } while (absl::Now() < deadline);
  return s;
}

std::vector<std::string> ChiefFlags(const std::string& checkpoint_dir,
                                    const std::string& mode = "async") {
  return {"--model_config=" + RunfilePath("configs/softmax_regression.pbtxt"),
          "--mode=" + mode,
          "--max_train_examples=12000",
          "--max_test_examples=2000",
          "--epochs=4",
          "--batch_size=50",
          "--eval_every_secs=60",
          "--heartbeat_interval_ms=200",
          "--heartbeat_timeout_ms=1500",
          "--checkpoint_dir=" + checkpoint_dir,
          "--checkpoint_every_steps=50"};
}

// A ps task killed with SIGKILL during training and restarted at the same address: the chief
// notices, re-creates its shards, restores every ps task to the latest checkpoint, and training
// finishes by itself with the accuracy of an undisturbed run. Sync mode, so that the undisturbed
// run is deterministic and the comparison measures the recovery, not async noise.
TEST(RecoveryTest, KilledPsIsRestoredFromTheLatestCheckpoint) {
  const std::string base = absl::StrCat(getenv("TEST_TMPDIR"), "/ps-kill");
  std::filesystem::remove_all(base);
  double undisturbed = 0;
  {
    TestClusterOptions options;
    options.num_ps = 2;
    options.num_workers = 2;
    options.flags["chief"] = ChiefFlags(base + "/undisturbed", "sync");
    options.flags["worker"] = {"--step_delay_ms=5"};
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    auto chief = v1::Coordinator::NewStub(grpc::CreateChannel(
        (*cluster)->chief_address(), grpc::InsecureChannelCredentials()));
    v1::ClusterStatus s = AwaitFinished(*chief, absl::Seconds(120));
    ASSERT_TRUE(s.progress().finished()) << (*cluster)->Logs();
    undisturbed = s.progress().test_accuracy();
  }
  TestClusterOptions options;
  options.num_ps = 2;
  options.num_workers = 2;
  const std::string dir = base + "/disturbed";
  options.flags["chief"] = ChiefFlags(dir, "sync");
  options.flags["worker"] = {"--step_delay_ms=5"};
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  TestCluster& c = **cluster;
  auto chief = v1::Coordinator::NewStub(
      grpc::CreateChannel(c.chief_address(), grpc::InsecureChannelCredentials()));
  // Wait for a committed checkpoint, then kill ps:1.
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while ((*ListCheckpoints(dir)).empty() && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_FALSE((*ListCheckpoints(dir)).empty()) << c.Logs();
  ASSERT_TRUE(c.ps(1).Signal(SIGKILL).ok());
  ASSERT_TRUE(c.ps(1).WaitForExit(absl::Seconds(5)).ok());
  absl::SleepFor(absl::Milliseconds(500));
  ASSERT_TRUE(c.StartTask("ps", 1).ok()) << c.Logs();
  v1::ClusterStatus s = AwaitFinished(*chief, absl::Seconds(180));
  ASSERT_TRUE(s.progress().finished()) << c.Logs();
  EXPECT_THAT(c.chief().LogTail(400), HasSubstr("ps:1 restarted and lost its shards"));
  EXPECT_THAT(c.chief().LogTail(400), HasSubstr("restored every ps task to the checkpoint of step"));
  // The updates since the last checkpoint (at most 50 steps here) are lost and not redone, and
  // this short run (480 steps) is far from converged, so they show in the accuracy: within 2
  // points. (The issue asks for 0.5 points on a converged run; not there yet.)
  EXPECT_NEAR(s.progress().test_accuracy(), undisturbed, 0.02)
      << "undisturbed " << undisturbed << ", after a ps was killed "
      << s.progress().test_accuracy();
  // Every committed checkpoint still loads and verifies.
  auto committed = ListCheckpoints(dir);
  ASSERT_TRUE(committed.ok());
  ASSERT_FALSE(committed->empty());
  for (const std::string& path : *committed) {
    EXPECT_TRUE(VerifyCheckpoint(path).ok()) << path;
  }
}

// The whole cluster stopped and started again resumes from the latest checkpoint, which may be
// restored into a different number of ps tasks.
TEST(RecoveryTest, ARestartedClusterResumesFromItsCheckpointWithAnotherPsCount) {
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/whole-cluster");
  std::filesystem::remove_all(dir);
  int64_t saved_step = 0;
  {
    TestClusterOptions options;
    options.num_ps = 2;
    options.num_workers = 2;
    options.flags["chief"] = ChiefFlags(dir);
    auto cluster = TestCluster::Start(options);
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    auto chief = v1::Coordinator::NewStub(grpc::CreateChannel(
        (*cluster)->chief_address(), grpc::InsecureChannelCredentials()));
    v1::ClusterStatus s = AwaitFinished(*chief, absl::Seconds(120));
    ASSERT_TRUE(s.progress().finished()) << (*cluster)->Logs();
    ASSERT_FALSE(s.last_checkpoint().empty());
    auto manifest = ReadManifest(s.last_checkpoint());
    ASSERT_TRUE(manifest.ok());
    saved_step = manifest->step();
    EXPECT_EQ(manifest->num_ps(), 2);
    for (ChildProcess* p : (*cluster)->processes()) ASSERT_TRUE(p->Signal(SIGTERM).ok());
  }
  TestClusterOptions options;
  options.num_ps = 3;
  options.num_workers = 1;
  std::vector<std::string> flags = ChiefFlags(dir);
  flags.push_back("--epochs=1");
  flags.push_back("--max_steps=1");
  options.flags["chief"] = flags;
  auto cluster = TestCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto chief = v1::Coordinator::NewStub(grpc::CreateChannel(
      (*cluster)->chief_address(), grpc::InsecureChannelCredentials()));
  v1::ClusterStatus s = AwaitFinished(*chief, absl::Seconds(120));
  ASSERT_TRUE(s.progress().finished()) << (*cluster)->Logs();
  EXPECT_THAT((*cluster)->chief().LogTail(400),
              HasSubstr(absl::StrCat("(step ", saved_step, ", written by 2 ps tasks, restored into 3)")));
  // One more step from the restored model is as good as the trained one, far above the 0.10
  // of fresh weights.
  EXPECT_GE(s.progress().test_accuracy(), 0.75);
}

}  // namespace
}  // namespace pscluster
