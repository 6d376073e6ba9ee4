#include "common/cluster_spec.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/util/message_differencer.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

constexpr char kGood[] = R"({
  "cluster": {
    "chief": ["host0:2222"],
    "worker": ["host1:2222", "host2:2222"],
    "ps": ["host3:2222", "host4:2222"]
  },
  "task": {"type": "worker", "index": 1},
  "environment": "cloud"
})";

void ExpectInvalid(const absl::StatusOr<v1::ClusterConfig>& r, const std::string& substr) {
  ASSERT_FALSE(r.ok()) << "expected an error containing: " << substr;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(substr));
}

TEST(ParseTfConfigTest, ParsesTensorFlowFormat) {
  auto config = ParseTfConfig(kGood);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->task().job(), "worker");
  EXPECT_EQ(config->task().index(), 1);
  EXPECT_EQ(config->environment(), "cloud");
  EXPECT_EQ(NumTasks(config->cluster(), "ps"), 2);
  EXPECT_EQ(NumTasks(config->cluster(), "worker"), 2);
  EXPECT_EQ(NumTasks(config->cluster(), "chief"), 1);
  EXPECT_EQ(*TaskAddress(config->cluster(), "ps", 1), "host4:2222");
  // Jobs come out sorted by name, whatever the JSON order.
  ASSERT_EQ(config->cluster().jobs_size(), 3);
  EXPECT_EQ(config->cluster().jobs(0).name(), "chief");
  EXPECT_EQ(config->cluster().jobs(1).name(), "ps");
  EXPECT_EQ(config->cluster().jobs(2).name(), "worker");
}

TEST(ParseTfConfigTest, AcceptsSparseJobsStringIndexAndEvaluator) {
  auto config = ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": {"1": "p1:1", "0": "p0:1"}},
                                  "task": {"type": "ps", "index": "1"}})");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*TaskAddress(config->cluster(), "ps", 0), "p0:1");
  EXPECT_EQ(config->task().index(), 1);

  // TensorFlow runs the evaluator outside the cluster; it is accepted as a task type.
  auto eval = ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]},
                                "task": {"type": "evaluator", "index": 0}})");
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->task().job(), "evaluator");
  auto eval_in_cluster = ParseTfConfig(
      R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"], "evaluator": ["e:1"]},
          "task": {"type": "evaluator"}})");
  ASSERT_TRUE(eval_in_cluster.ok()) << eval_in_cluster.status();
  EXPECT_EQ(eval_in_cluster->task().index(), 0);  // "index" defaults to 0, as in TF
}

TEST(ParseTfConfigTest, PortZeroMayRepeat) {
  auto config = ParseTfConfig(R"({"cluster": {"chief": ["127.0.0.1:5000"],
      "ps": ["127.0.0.1:0", "127.0.0.1:0"]}, "task": {"type": "ps", "index": 0}})");
  ASSERT_TRUE(config.ok()) << config.status();
}

TEST(ParseTfConfigTest, RoundTripsThroughJson) {
  auto config = ParseTfConfig(kGood);
  ASSERT_TRUE(config.ok());
  auto again = ParseTfConfig(ToTfConfigJson(*config));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(google::protobuf::util::MessageDifferencer::Equals(*again, *config))
      << again->DebugString() << " vs " << config->DebugString();
}

TEST(ParseTfConfigTest, RefusesMalformedJson) {
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"ps": ["a:1"],)"), "not a valid JSON");
  ExpectInvalid(ParseTfConfig("[1, 2]"), "not a valid JSON");
  ExpectInvalid(ParseTfConfig(R"({"task": {"type": "ps"}})"), "no \"cluster\"");
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"ps": "a:1"}, "task": {"type": "ps"}})"),
                "job \"ps\" must be a list");
}

TEST(ParseTfConfigTest, RefusesUnknownJob) {
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"], "master": ["m:1"]},
                                  "task": {"type": "ps", "index": 0}})"),
                "unknown job \"master\"");
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]},
                                  "task": {"type": "trainer", "index": 0}})"),
                "unknown task type \"trainer\"");
}

TEST(ParseTfConfigTest, RefusesIndexOutOfRange) {
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"],
      "worker": ["w:1", "w:2"]}, "task": {"type": "worker", "index": 2}})"),
                "task index 2 out of range for job \"worker\" with 2 tasks");
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]},
      "task": {"type": "ps", "index": -1}})"),
                "non-negative integer, got -1");
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]},
      "task": {"type": "worker", "index": 0}})"),
                "task type \"worker\" has no job");
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": {"1": "p:1"}},
      "task": {"type": "chief", "index": 0}})"),
                "job \"ps\" has no task 0");
}

TEST(ParseTfConfigTest, RefusesMissingTask) {
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]}})"), "no task");
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"]},
                                  "task": {"index": 0}})"),
                "no string \"type\"");
}

TEST(ParseTfConfigTest, RefusesMalformedAddress) {
  for (const char* bad :
       {"host", "host:", ":80", "host:99999", "host:8o", "ho st:1", "::1:80", "[::1:80"}) {
    std::string json = std::string(R"({"cluster": {"chief": ["c:1"], "ps": [")") + bad +
                       R"("]}, "task": {"type": "chief", "index": 0}})";
    SCOPED_TRACE(bad);
    ExpectInvalid(ParseTfConfig(json), std::string("malformed address \"") + bad + "\"");
  }
  auto v6 = ParseHostPort("[::1]:8080");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 8080);
}

TEST(ParseTfConfigTest, RefusesDuplicateAddress) {
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": ["h:7", "h:8"],
      "worker": ["h:7"]}, "task": {"type": "chief", "index": 0}})"),
                "duplicate address \"h:7\" used by ps:0 and worker:0");
}

TEST(ParseTfConfigTest, RefusesNoPs) {
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"]},
                                  "task": {"type": "chief", "index": 0}})"),
                "no \"ps\" task");
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1"], "ps": []},
                                  "task": {"type": "chief", "index": 0}})"),
                "no \"ps\" task");
}

TEST(ParseTfConfigTest, RefusesMoreThanOneChief) {
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"chief": ["c:1", "c:2"], "ps": ["p:1"]},
                                  "task": {"type": "ps", "index": 0}})"),
                "job \"chief\" has 2 tasks; exactly one is allowed");
  ExpectInvalid(ParseTfConfig(R"({"cluster": {"ps": ["p:1"]}, "task": {"type": "ps"}})"),
                "no \"chief\" task");
}

TEST(ResolveClusterConfigTest, FlagsWinAndNeedTheTask) {
  ClusterConfigSources s;
  s.chief_hosts = "c:1";
  s.ps_hosts = "p:1, p:2";
  s.worker_hosts = "w:1";
  s.tf_config = "this is ignored: flags come first";
  ExpectInvalid(ResolveClusterConfig(s), "--job_name and --task_index are required");
  s.job_name = "ps";
  s.task_index = 1;
  auto config = ResolveClusterConfig(s);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(*TaskAddress(config->cluster(), "ps", 1), "p:2");
  s.task_index = 2;
  ExpectInvalid(ResolveClusterConfig(s), "task index 2 out of range for job \"ps\"");
}

TEST(ResolveClusterConfigTest, FileThenEnvironment) {
  const std::string path = std::string(getenv("TEST_TMPDIR")) + "/cluster.json";
  std::ofstream(path) << R"({"cluster": {"chief": ["c:1"], "ps": ["p:1"], "worker": ["w:1"]}})";
  ClusterConfigSources s;
  s.cluster_spec_file = path;
  s.tf_config = kGood;
  // The file has no task: the flags may supply it.
  ExpectInvalid(ResolveClusterConfig(s), "no task");
  s.job_name = "worker";
  s.task_index = 0;
  auto config = ResolveClusterConfig(s);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(NumTasks(config->cluster(), "worker"), 1);  // from the file, not TF_CONFIG

  s.cluster_spec_file = path + ".missing";
  ExpectInvalid(ResolveClusterConfig(s), "cannot read cluster spec file");

  ClusterConfigSources env_only;
  env_only.tf_config = kGood;
  auto from_env = ResolveClusterConfig(env_only);
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(from_env->task().index(), 1);

  ExpectInvalid(ResolveClusterConfig(ClusterConfigSources()), "no cluster spec");
}

}  // namespace
}  // namespace pscluster
