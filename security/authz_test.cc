#include "security/authz.h"

#include <set>
#include <string>

#include "google/protobuf/descriptor.h"
#include "gtest/gtest.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "proto/ps_service.grpc.pb.h"
#include "proto/worker_service.grpc.pb.h"

namespace pscluster {
namespace {

PeerIdentity Peer(Role role, int index = 0) {
  PeerIdentity id;
  id.cluster = "c";
  id.role = role;
  id.index = index;
  return id;
}

v1::TaskId Task(const std::string& job, int index) {
  v1::TaskId task;
  task.set_job(job);
  task.set_index(index);
  return task;
}

// Every method of every service the daemons serve has a row, and every row names a method that
// exists: a new RPC cannot slip in unguarded (Authorize denies unknown methods, so the daemons
// would refuse it under TLS, but the table is what docs/security.md shows).
TEST(MethodRulesTest, CoverExactlyTheServicesMethods) {
  std::set<std::string> methods;
  for (const char* service :
       {v1::ParameterServer::service_full_name(), v1::Coordinator::service_full_name(),
        v1::Worker::service_full_name()}) {
    const google::protobuf::ServiceDescriptor* descriptor =
        google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
    ASSERT_NE(descriptor, nullptr) << service;
    for (int i = 0; i < descriptor->method_count(); ++i) {
      methods.insert(descriptor->name() + "." + descriptor->method(i)->name());
    }
  }
  std::set<std::string> ruled;
  for (const MethodRule& rule : MethodRules()) {
    EXPECT_TRUE(ruled.insert(std::string(rule.method)).second) << "twice: " << rule.method;
    EXPECT_FALSE(rule.roles.empty()) << rule.method;
  }
  EXPECT_EQ(ruled, methods);
}

TEST(AuthorizeTest, OnlyTheChiefChangesShardsWholesale) {
  for (const char* method : {"ParameterServer.CreateShards", "ParameterServer.SaveShards",
                             "ParameterServer.RestoreShards"}) {
    EXPECT_TRUE(Authorize(Peer(Role::kChief), method).ok()) << method;
    for (Role role : {Role::kPs, Role::kWorker, Role::kEvaluator, Role::kViewer, Role::kAdmin}) {
      absl::Status s = Authorize(Peer(role, 1), method);
      EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << method;
      EXPECT_NE(s.message().find(method), std::string::npos) << s;
      EXPECT_NE(s.message().find(std::string("role ") + std::string(RoleName(role))),
                std::string::npos)
          << s;
      EXPECT_NE(s.message().find("allowed: chief"), std::string::npos) << s;
    }
  }
}

TEST(AuthorizeTest, WorkersPushAndOperatorsOnlyRead) {
  const v1::TaskId worker3 = WorkerTask(3);
  EXPECT_TRUE(Authorize(Peer(Role::kWorker, 3), "ParameterServer.PushDense", &worker3).ok());
  EXPECT_TRUE(Authorize(Peer(Role::kWorker, 3), "ParameterServer.PushSparse", &worker3).ok());
  EXPECT_TRUE(Authorize(Peer(Role::kViewer), "ParameterServer.InspectShard").ok());
  EXPECT_TRUE(Authorize(Peer(Role::kViewer), "ParameterServer.PullDense").ok());
  EXPECT_EQ(Authorize(Peer(Role::kViewer), "ParameterServer.PushDense").code(),
            absl::StatusCode::kPermissionDenied);
  // A sparse pull creates rows: not read-only.
  EXPECT_EQ(Authorize(Peer(Role::kViewer), "ParameterServer.PullSparse").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Authorize(Peer(Role::kEvaluator), "ParameterServer.PushDense").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Authorize(Peer(Role::kViewer), "Coordinator.Checkpoint").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(Authorize(Peer(Role::kAdmin), "Coordinator.Checkpoint").ok());
  EXPECT_EQ(Authorize(Peer(Role::kWorker), "Coordinator.Checkpoint").code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(AuthorizeTest, TasksActOnlyForThemselves) {
  const v1::TaskId worker1 = WorkerTask(1);
  EXPECT_TRUE(Authorize(Peer(Role::kWorker, 1), "Coordinator.ReportStep", &worker1).ok());
  EXPECT_TRUE(Authorize(Peer(Role::kWorker, 1), "Coordinator.AcquireToken", &worker1).ok());
  absl::Status s = Authorize(Peer(Role::kWorker, 0), "Coordinator.ReportStep", &worker1);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("worker:0 may not call Coordinator.ReportStep for worker:1"),
            std::string::npos)
      << s;
  // A worker's key pushing another worker's share of a sync step (issue 32).
  s = Authorize(Peer(Role::kWorker, 0), "ParameterServer.PushDense", &worker1);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("worker:0 may not call ParameterServer.PushDense for worker:1"),
            std::string::npos)
      << s;
  EXPECT_EQ(Authorize(Peer(Role::kWorker, 0), "ParameterServer.PushSparse", &worker1).code(),
            absl::StatusCode::kPermissionDenied);
  // The spoofed re-registration of issue 14: a worker posing as ps:0.
  const v1::TaskId ps0 = Task("ps", 0);
  EXPECT_TRUE(Authorize(Peer(Role::kPs, 0), "Coordinator.RegisterTask", &ps0).ok());
  EXPECT_EQ(Authorize(Peer(Role::kWorker, 0), "Coordinator.RegisterTask", &ps0).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(Authorize(Peer(Role::kPs, 1), "Coordinator.Heartbeat", &ps0).code(),
            absl::StatusCode::kPermissionDenied);
  // A task-scoped method without a task is refused, never waved through.
  EXPECT_EQ(Authorize(Peer(Role::kPs, 0), "Coordinator.Heartbeat", nullptr).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(AuthorizeTest, UnknownMethodsAreDenied) {
  absl::Status s = Authorize(Peer(Role::kChief), "ParameterServer.DropEverything");
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(s.message().find("no role may"), std::string::npos) << s;
}

}  // namespace
}  // namespace pscluster
