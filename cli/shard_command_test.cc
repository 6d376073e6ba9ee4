// psctl's vars, shard and table commands over the in-process fake of the ps tasks. The same
// commands run against the real daemons in tests/psctl_test.cc.
#include "cli/shard_command.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "cli/live_cluster.h"
#include "cli/variable_source.h"
#include "cli/vars_command.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "ps_server/in_process_ps_transport.h"
#include "sharding/placement.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

constexpr char kModel[] = R"pb(
  variables {
    name: "layer/kernel"
    shape { dims: 64 dims: 16 }
    initializer { kind: NORMAL stddev: 0.1 seed: 3 }
    optimizer { adam { learning_rate: 0.01 } }
  }
  variables {
    name: "layer"
    shape { dims: 3 }
    initializer { kind: CONSTANT value: 0.5 }
    optimizer { sgd { learning_rate: 0.5 } }
  }
  tables {
    name: "emb"
    dim: 4
    initializer { kind: UNIFORM min: -0.5 max: 0.5 seed: 9 }
    optimizer { adagrad { learning_rate: 0.1 } }
  }
)pb";

class ShardCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::GetModelResponse m;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(kModel, m.mutable_model()));
    v1::PlacementOptions options;
    options.set_max_partition_bytes(1024);  // layer/kernel: 4 partitions of 16 rows
    auto placement = ComputePlacement(m.model(), 2, options);
    ASSERT_TRUE(placement.ok()) << placement.status();
    *m.mutable_placement() = *placement;
    m.add_ps_addresses("fake:0");
    m.add_ps_addresses("fake:1");
    auto transport = std::make_unique<InProcessPsTransport>(2, ParameterStoreOptions());
    fake_ = transport.get();
    auto cluster = LiveClusterOver("fake-chief", m, std::move(transport), LiveClusterOptions());
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    cluster_ = *std::move(cluster);
    ASSERT_TRUE(cluster_.client->CreateAll(v1::SyncOptions()).ok());
    std::vector<float> g(64 * 16);
    for (size_t i = 0; i < g.size(); ++i) g[i] = std::sin(i * 0.1f);
    ASSERT_TRUE(cluster_.client->Push({"layer/kernel"}, {g.data()}, 0).ok());
    const std::vector<int64_t> keys = {7, 11, -3};
    std::vector<float> rows(keys.size() * 4, 0.25f);
    ASSERT_TRUE(cluster_.client->PushRows("emb", keys.data(), keys.size(), rows.data(), 0).ok());
  }

  InProcessPsTransport* fake_ = nullptr;  // Owned by cluster_.
  LiveCluster cluster_;
};

TEST_F(ShardCommandTest, ShardNamesResolveWithSlashesInVariableNames) {
  const v1::ModelSpec& model = cluster_.model.model();
  auto whole = ParseShardName(model, "layer/kernel");
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(whole->variable, "layer/kernel");
  EXPECT_EQ(whole->partition, -1);
  auto part = ParseShardName(model, "layer/kernel/2");
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(part->variable, "layer/kernel");
  EXPECT_EQ(part->partition, 2);
  auto layer0 = ParseShardName(model, "layer/0");
  ASSERT_TRUE(layer0.ok());
  EXPECT_EQ(layer0->variable, "layer");
  EXPECT_EQ(layer0->partition, 0);

  auto unknown = ParseShardName(model, "nope/1");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("unknown variable \"nope/1\""));
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("layer/kernel"));
  auto table = ParseShardName(model, "emb");
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(table.status().message()), HasSubstr("psctl table emb"));
}

TEST_F(ShardCommandTest, StatisticsAreThoseOfThePulledValues) {
  std::vector<std::vector<float>> pulled;
  ASSERT_TRUE(cluster_.client->Pull({"layer/kernel"}, &pulled).ok());
  absl::Status status;
  ShardOptions options;
  options.values_offset = 3;
  options.values_count = 5;
  psctl::ShardReport report = BuildShardReport(cluster_, "layer/kernel/1", options, &status);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(report.shards_size(), 1);
  const psctl::ShardInfo& s = report.shards(0);
  EXPECT_EQ(s.row_begin(), 16);
  EXPECT_EQ(s.row_end(), 32);
  double sum = 0, sq = 0, lo = 1e30, hi = -1e30;
  for (int i = 16 * 16; i < 32 * 16; ++i) {
    sum += pulled[0][i];
    sq += static_cast<double>(pulled[0][i]) * pulled[0][i];
    lo = std::min<double>(lo, pulled[0][i]);
    hi = std::max<double>(hi, pulled[0][i]);
  }
  EXPECT_EQ(s.stats().count(), 256);
  EXPECT_DOUBLE_EQ(s.stats().min(), lo);
  EXPECT_DOUBLE_EQ(s.stats().max(), hi);
  EXPECT_NEAR(s.stats().mean(), sum / 256, 1e-12);
  EXPECT_NEAR(s.stats().l2_norm(), std::sqrt(sq), 1e-9);
  ASSERT_EQ(s.values_size(), 5);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(s.values(i), pulled[0][16 * 16 + 3 + i]);
  EXPECT_THAT(FormatShardReport(report), HasSubstr("values of layer/kernel/1 [3, 8):"));

  // Every partition, and the whole variable from their combination.
  report = BuildShardReport(cluster_, "layer/kernel", ShardOptions(), &status);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(report.shards_size(), 4);
  EXPECT_EQ(report.total().count(), 64 * 16);
  double all = 0;
  for (float v : pulled[0]) all += v;
  EXPECT_NEAR(report.total().mean(), all / (64 * 16), 1e-9);

  report = BuildShardReport(cluster_, "layer/kernel/4", ShardOptions(), &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("has partitions 0..3, not 4"));
}

TEST_F(ShardCommandTest, KeyLookupPrintsExistingRowsAndCreatesNone) {
  TableOptions options;
  options.keys = {11, 999};
  absl::Status status;
  psctl::TableReport report = BuildTableReport(cluster_, "emb", options, &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("no row for key 999"));
  ASSERT_EQ(report.rows_size(), 1);
  EXPECT_EQ(report.rows(0).key(), 11);
  EXPECT_EQ(report.rows(0).values_size(), 4);
  std::vector<float> row(4);
  const int64_t key = 11;
  ASSERT_TRUE(cluster_.client->PullRows("emb", &key, 1, row.data()).ok());
  for (int j = 0; j < 4; ++j) EXPECT_EQ(report.rows(0).values(j), row[j]);
  EXPECT_THAT(report.missing_keys(), ::testing::ElementsAre(999));
  EXPECT_EQ(report.table().rows(), 3);

  // Asking again finds 999 still missing: the lookup created nothing.
  report = BuildTableReport(cluster_, "emb", options, &status);
  EXPECT_THAT(report.missing_keys(), ::testing::ElementsAre(999));
  EXPECT_EQ(report.table().rows(), 3);
  EXPECT_THAT(FormatTableReport(report), HasSubstr("key 999: no row"));

  report = BuildTableReport(cluster_, "layer", TableOptions(), &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  report = BuildTableReport(cluster_, "nope", TableOptions(), &status);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("unknown table \"nope\""));
}

TEST_F(ShardCommandTest, VarsShowThePlacementAndAnUnreachableTaskKeepsTheRest) {
  absl::Status status;
  psctl::VarsReport report = BuildVarsReport(cluster_, &status);
  ASSERT_TRUE(status.ok()) << status;
  ASSERT_EQ(report.variables_size(), 2);
  const psctl::VariableInfo& kernel = report.variables(0);
  ASSERT_EQ(kernel.partitions_size(), 4);
  for (const psctl::PartitionInfo& p : kernel.partitions()) {
    const v1::DensePartition& want =
        *(*PartitionsOf(cluster_.model.placement(), "layer/kernel"))[p.partition()];
    EXPECT_EQ(p.ps_task(), want.ps_task());
    EXPECT_EQ(p.row_begin(), want.row_begin());
    EXPECT_EQ(p.row_end(), want.row_end());
    EXPECT_TRUE(p.held());
    EXPECT_EQ(p.bytes(), 16 * 16 * 4 * 3);  // values, Adam's m and v
  }
  EXPECT_EQ(kernel.optimizer(), "adam(learning_rate=0.01)");
  EXPECT_EQ(report.tables(0).rows(), 3);

  // ps:1 stops answering (the client's retries included).
  fake_->FailNextCalls(1, 100);
  CommandOutput out = RunVarsCommand(cluster_, OutputFormat::kTable);
  EXPECT_EQ(out.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(out.text, HasSubstr("layer/kernel/0"));
  EXPECT_THAT(out.text, HasSubstr("unreachable"));
  out = RunShardCommand(cluster_, "layer/kernel", ShardOptions());
  EXPECT_EQ(out.status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(out.text, HasSubstr("?"));
}

TEST_F(ShardCommandTest, LiveSourceReadsWholeVariablesAndNamesUnknownOnes) {
  LiveVariableSource source(&cluster_);
  auto values = source.Read("layer");
  ASSERT_TRUE(values.ok());
  EXPECT_THAT(*values, ::testing::ElementsAre(0.5f, 0.5f, 0.5f));
  EXPECT_EQ(source.Read("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(source.Read("emb").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pscluster
