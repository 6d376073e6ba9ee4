#include "security/identity.h"

#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(ParsePeerUriTest, ReadsTasksAndOperators) {
  absl::StatusOr<PeerIdentity> worker = ParsePeerUri("spiffe://mnist-1/worker/12");
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ(worker->cluster, "mnist-1");
  EXPECT_EQ(worker->role, Role::kWorker);
  EXPECT_EQ(worker->index, 12);
  EXPECT_EQ(worker->ToString(), "worker:12");
  EXPECT_EQ(worker->Uri(), "spiffe://mnist-1/worker/12");

  absl::StatusOr<PeerIdentity> admin = ParsePeerUri("spiffe://c/psctl/admin");
  ASSERT_TRUE(admin.ok()) << admin.status();
  EXPECT_EQ(admin->role, Role::kAdmin);
  EXPECT_EQ(admin->ToString(), "psctl admin");
  EXPECT_EQ(admin->Uri(), "spiffe://c/psctl/admin");
}

TEST(ParsePeerUriTest, RefusesMalformedUrisNamingTheUri) {
  for (const char* uri :
       {"https://c/worker/0", "spiffe://c/worker", "spiffe://c/worker/0/x", "spiffe://C/worker/0",
        "spiffe:///worker/0", "spiffe://c/boss/0", "spiffe://c/worker/-1", "spiffe://c/worker/+1",
        "spiffe://c/worker/x", "spiffe://c/worker/", "spiffe://c/psctl/root",
        "spiffe://c/worker/99999999999"}) {
    absl::StatusOr<PeerIdentity> id = ParsePeerUri(uri);
    ASSERT_FALSE(id.ok()) << uri;
    EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument) << uri;
    EXPECT_NE(id.status().message().find(uri), std::string::npos) << id.status();
    EXPECT_NE(id.status().message().find("expected spiffe://<cluster>/"), std::string::npos);
  }
}

TEST(TaskIdentityTest, NamesJobsOnly) {
  absl::StatusOr<PeerIdentity> ps = TaskIdentity("c", "ps", 3);
  ASSERT_TRUE(ps.ok());
  EXPECT_EQ(ps->Uri(), "spiffe://c/ps/3");
  EXPECT_FALSE(TaskIdentity("c", "viewer", 0).ok());
}

}  // namespace
}  // namespace pscluster
