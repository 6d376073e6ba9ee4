#include "chief/chief_metrics.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string Text(const std::vector<prometheus::MetricFamily>& families) {
  return prometheus::TextSerializer().Serialize(families);
}

// Each rebuild of backups the chief reports in ClusterStatus is a series of its task: its
// state, its primaries (all, and those done) and the bytes copied.
TEST(ChiefMetricsTest, EachRebuildOfBackupsIsASeriesOfItsTask) {
  v1::ClusterStatus status;
  EXPECT_TRUE(RebuildMetricFamilies(status).empty());  // no rebuild, no series
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        rebuilds {
          ps_task: 1
          state: BACKUP_REBUILD_DONE
          primaries_done: 2
          primaries: 2
          shards_copied: 3
          bytes_copied: 3072
          rows_copied: 40
        }
        rebuilds {
          ps_task: 2
          state: BACKUP_REBUILD_COPYING
          primaries_done: 1
          primaries: 3
          bytes_copied: 1024
        }
      )pb",
      &status));
  const std::string text = Text(RebuildMetricFamilies(status));
  EXPECT_THAT(text, HasSubstr("pscluster_backup_rebuild_state{ps=\"1\",state=\"done\"} 1"));
  EXPECT_THAT(text, HasSubstr("pscluster_backup_rebuild_state{ps=\"2\",state=\"copying\"} 1"));
  EXPECT_THAT(text, Not(HasSubstr("state=\"dropping\"")));
  EXPECT_THAT(text, HasSubstr("pscluster_backup_rebuild_primaries{ps=\"2\"} 3"));
  EXPECT_THAT(text, HasSubstr("pscluster_backup_rebuild_primaries_done{ps=\"2\"} 1"));
  EXPECT_THAT(text, HasSubstr("pscluster_backup_rebuild_bytes{ps=\"1\"} 3072"));
  EXPECT_THAT(text, HasSubstr("pscluster_backup_rebuild_bytes{ps=\"2\"} 1024"));
  EXPECT_THAT(text, HasSubstr("pscluster_backup_rebuild_rows{ps=\"1\"} 40"));
  EXPECT_THAT(text, HasSubstr("pscluster_backup_rebuild_rows{ps=\"2\"} 0"));
}

}  // namespace
}  // namespace pscluster
