#include "storage/checkpoint_path.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "gtest/gtest.h"
#include "proto/coordinator_service.pb.h"
#include "storage/checkpoint.h"

namespace pscluster {
namespace {

class ResolveCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = std::string(tmp != nullptr ? tmp : "/tmp") + "/resolve-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = root_ + "/checkpoints";
    ASSERT_EQ(system(("rm -rf '" + root_ + "' && mkdir -p '" + dir_ + "'").c_str()), 0);
  }

  std::string root_;
  std::string dir_;
};

TEST_F(ResolveCheckpointTest, ANameResolvesUnderTheDirectory) {
  absl::StatusOr<std::string> path = ResolveCheckpoint(dir_, "ckpt-0000000120");
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(*path, dir_ + "/ckpt-0000000120");
  ASSERT_EQ(mkdir(path->c_str(), 0755), 0);
  EXPECT_TRUE(ResolveCheckpoint(dir_, "ckpt-0000000120").ok());
}

TEST_F(ResolveCheckpointTest, RefusesPathsAndEscapesNamingTheName) {
  for (const std::string name : {"", ".", "..", "/etc/evil", "../../tmp/x", "a/b", "ckpt\n1"}) {
    absl::StatusOr<std::string> path = ResolveCheckpoint(dir_, name);
    ASSERT_FALSE(path.ok()) << name;
    EXPECT_EQ(path.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(path.status().message().find("checkpoint \"" + name + "\""), std::string::npos)
        << path.status();
    EXPECT_NE(path.status().message().find("--checkpoint_dir"), std::string::npos);
  }
}

TEST_F(ResolveCheckpointTest, RefusesALinkThatLeadsOutside) {
  ASSERT_EQ(mkdir((root_ + "/elsewhere").c_str(), 0755), 0);
  ASSERT_EQ(symlink((root_ + "/elsewhere").c_str(), (dir_ + "/ckpt-evil").c_str()), 0);
  absl::StatusOr<std::string> path = ResolveCheckpoint(dir_, "ckpt-evil");
  ASSERT_FALSE(path.ok());
  EXPECT_EQ(path.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(path.status().message().find("leads outside the checkpoint directory"),
            std::string::npos)
      << path.status();
  // A dangling link is refused too (it could be pointed anywhere before the write).
  ASSERT_EQ(symlink("/nonexistent/x", (dir_ + "/ckpt-dangling").c_str()), 0);
  EXPECT_EQ(ResolveCheckpoint(dir_, "ckpt-dangling").status().code(),
            absl::StatusCode::kInvalidArgument);
  // A link that stays inside is fine.
  ASSERT_EQ(mkdir((dir_ + "/real").c_str(), 0755), 0);
  ASSERT_EQ(symlink((dir_ + "/real").c_str(), (dir_ + "/ckpt-inside").c_str()), 0);
  EXPECT_TRUE(ResolveCheckpoint(dir_, "ckpt-inside").ok());
}

TEST_F(ResolveCheckpointTest, ACommittedCheckpointIsNeverWrittenAgain) {
  const std::string path = dir_ + "/ckpt-0000000007";
  ASSERT_EQ(mkdir(path.c_str(), 0755), 0);
  EXPECT_TRUE(CheckNotCommitted(path).ok());
  ASSERT_TRUE(CommitManifest(path, v1::CheckpointManifest()).ok());
  absl::Status s = CheckNotCommitted(path);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("never written into again"), std::string::npos) << s;
}

TEST(CheckShardFileNameTest, OnlyPsIndexNames) {
  EXPECT_TRUE(CheckShardFileName("ps-0").ok());
  EXPECT_TRUE(CheckShardFileName("ps-12").ok());
  for (const char* file : {"", "ps-", "ps-x", "../ps-0", "ps-0/../../etc", "/etc/passwd"}) {
    EXPECT_EQ(CheckShardFileName(file).code(), absl::StatusCode::kInvalidArgument) << file;
  }
}

}  // namespace
}  // namespace pscluster
