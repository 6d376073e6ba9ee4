#include "chief/task_registry.h"

#include "common/cluster_spec.h"
#include "glog/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

v1::ClusterSpec Spec() {
  auto config = ParseTfConfig(R"({"cluster": {"chief": ["127.0.0.1:5000"],
      "ps": ["127.0.0.1:0", "127.0.0.1:0"], "worker": ["127.0.0.1:7001"]},
      "task": {"type": "chief", "index": 0}})");
  CHECK(config.ok()) << config.status();
  return config->cluster();
}

v1::TaskHealth HealthOf(const TaskRegistry& r, const std::string& name) {
  for (const v1::TaskStatus& t : r.Snapshot()) {
    if (TaskName(t.task()) == name) return t.health();
  }
  return v1::HEALTH_UNKNOWN;
}

TEST(TaskRegistryTest, TasksTurnServingThenMissingWithoutHeartbeats) {
  FakeClock clock;
  TaskRegistry registry(Spec(), absl::Seconds(5), &clock);
  EXPECT_EQ(HealthOf(registry, "ps:0"), v1::HEALTH_UNKNOWN);
  ASSERT_TRUE(registry.Register(MakeTaskId("ps", 0), "127.0.0.1:40001", 7).ok());
  EXPECT_EQ(HealthOf(registry, "ps:0"), v1::HEALTH_SERVING);
  EXPECT_EQ(*registry.AddressOf(MakeTaskId("ps", 0)), "127.0.0.1:40001");

  clock.Advance(absl::Seconds(4));
  ASSERT_TRUE(*registry.Heartbeat(MakeTaskId("ps", 0), 7, 12, "idle"));
  clock.Advance(absl::Seconds(4));
  EXPECT_EQ(HealthOf(registry, "ps:0"), v1::HEALTH_SERVING);
  clock.Advance(absl::Seconds(2));
  EXPECT_EQ(HealthOf(registry, "ps:0"), v1::HEALTH_MISSING);
  std::vector<v1::TaskId> missing = registry.NotServing("ps");
  ASSERT_EQ(missing.size(), 2u);  // ps:0 missing, ps:1 never came
}

TEST(TaskRegistryTest, UnknownIncarnationMustRegisterAgain) {
  FakeClock clock;
  TaskRegistry registry(Spec(), absl::Seconds(5), &clock);
  EXPECT_FALSE(*registry.Heartbeat(MakeTaskId("worker", 0), 1, 0, ""));
  ASSERT_TRUE(registry.Register(MakeTaskId("worker", 0), "127.0.0.1:7001", 1).ok());
  EXPECT_TRUE(*registry.Heartbeat(MakeTaskId("worker", 0), 1, 0, ""));
  // The worker restarted: the old incarnation is no longer accepted.
  ASSERT_TRUE(registry.Register(MakeTaskId("worker", 0), "127.0.0.1:7001", 2).ok());
  EXPECT_FALSE(*registry.Heartbeat(MakeTaskId("worker", 0), 1, 0, ""));
}

TEST(TaskRegistryTest, RefusesTasksOutsideTheSpecAndWrongPorts) {
  FakeClock clock;
  TaskRegistry registry(Spec(), absl::Seconds(5), &clock);
  absl::Status s = registry.Register(MakeTaskId("ps", 2), "127.0.0.1:1", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("ps:2 is not in the cluster spec"));
  s = registry.Register(MakeTaskId("worker", 0), "127.0.0.1:7002", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("the cluster spec says 127.0.0.1:7001"));
  s = registry.Register(MakeTaskId("ps", 0), "nonsense", 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(HealthOf(registry, "ps:0"), v1::HEALTH_UNKNOWN);
}

TEST(TaskRegistryTest, AwaitServingUsesTheFakeDeadline) {
  FakeClock clock;
  TaskRegistry registry(Spec(), absl::Seconds(5), &clock);
  EXPECT_FALSE(registry.AwaitServing({"ps"}, clock.Now()));
  ASSERT_TRUE(registry.Register(MakeTaskId("ps", 0), "127.0.0.1:1", 1).ok());
  ASSERT_TRUE(registry.Register(MakeTaskId("ps", 1), "127.0.0.1:2", 1).ok());
  EXPECT_TRUE(registry.AwaitServing({"ps"}, clock.Now()));
  EXPECT_FALSE(registry.AwaitServing({"ps", "worker"}, clock.Now()));
}

}  // namespace
}  // namespace pscluster
