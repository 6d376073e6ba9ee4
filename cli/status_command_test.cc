#include "cli/status_command.h"

#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(StatusCommandTest, TableShowsRatesOfMeasuredTasksAndWhoTheStepWaitsFor) {
  v1::ClusterStatus status;
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        tasks {
          task { job: "chief" index: 0 }
          address: "h:1"
          health: HEALTH_SERVING
          uptime_micros: 65000000
          step: 12
        }
        tasks {
          task { job: "ps" index: 0 }
          address: "h:2"
          health: HEALTH_SERVING
          pushes_per_second: 41.5
          pulls_per_second: 40
        }
        tasks {
          task { job: "worker" index: 1 }
          address: "h:3"
          health: HEALTH_MISSING
          detail: "unreachable"
        }
        global_step: 12
        sync { mode: SYNC replicas_to_aggregate: 2 }
        state: "waiting for worker:1 (no heartbeat); step 12 waits for worker:1"
        waiting_for { job: "worker" index: 1 }
      )pb",
      &status));
  const std::string text = FormatClusterStatus(status, {"ps:0"});
  EXPECT_THAT(text, HasSubstr("TASK      ADDRESS  HEALTH   UPTIME  STEP  PUSH/S  PULL/S  DETAIL\n"
                              "chief:0   h:1      SERVING  1m5s    12    -       -       \n"
                              "ps:0      h:2      SERVING  -       0     41.5    40.0    \n"
                              "worker:1  h:3      MISSING  -       0     -       -       "
                              "unreachable\n"));
  EXPECT_THAT(text, HasSubstr("global step: 12, mode: sync (2 replicas per step)\n"));
  EXPECT_THAT(text, HasSubstr("waiting for: worker:1\n"));
  EXPECT_THAT(text, HasSubstr("state: waiting for worker:1 (no heartbeat); step 12 waits for"));
  EXPECT_THAT(FormatClusterStatus(status), Not(HasSubstr("41.5")));
  // Local steps are named with the mode.
  status.mutable_sync()->set_mode(v1::ASYNC);
  status.mutable_sync()->set_local_steps(8);
  EXPECT_THAT(FormatClusterStatus(status),
              HasSubstr("mode: async (8 local steps per worker push)\n"));
  status.mutable_sync()->set_mode(v1::SSP);
  status.mutable_sync()->set_staleness(2);
  EXPECT_THAT(FormatClusterStatus(status),
              HasSubstr("mode: ssp (staleness 2, 8 local steps per worker push)\n"));
}

// Replication 2: each rebuild of backups onto a failed-over task that came back, in its state.
TEST(StatusCommandTest, ShowsEachRebuildOfBackups) {
  v1::ClusterStatus status;
  EXPECT_THAT(FormatClusterStatus(status), Not(HasSubstr("backups rebuilt")));
  ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(
      R"pb(
        rebuilds {
          ps_task: 1
          state: BACKUP_REBUILD_DONE
          primaries_done: 2
          primaries: 2
          shards_copied: 3
          bytes_copied: 3072
          since_unix_micros: 1000000
          done_unix_micros: 1250000
          elapsed_micros: 250000
        }
        rebuilds {
          ps_task: 2
          state: BACKUP_REBUILD_COPYING
          primaries_done: 1
          primaries: 3
          shards_copied: 1
          bytes_copied: 1024
          tries: 2
          last_error: "ps:0: UNAVAILABLE: connection refused"
          since_unix_micros: 1000000
          elapsed_micros: 3400000
        }
        rebuilds { ps_task: 0 state: BACKUP_REBUILD_DROPPING }
      )pb",
      &status));
  const std::string text = FormatClusterStatus(status);
  EXPECT_THAT(text, HasSubstr("backups rebuilt onto ps:1: done, 2 of 2 primaries, 3 dense "
                              "shards, 3.0 KiB copied in 250ms\n"));
  EXPECT_THAT(text, HasSubstr("backups rebuilt onto ps:2: copying, 1 of 3 primaries, 1 dense "
                              "shards, 1.0 KiB copied, for 3s, try 2 (last error: ps:0: "
                              "UNAVAILABLE: connection refused)\n"));
  EXPECT_THAT(text, HasSubstr("backups rebuilt onto ps:0: lost again, its primaries told to "
                              "stop forwarding to it\n"));
}

}  // namespace
}  // namespace pscluster
