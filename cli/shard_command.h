#ifndef PSCLUSTER_CLI_SHARD_COMMAND_H_
#define PSCLUSTER_CLI_SHARD_COMMAND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cli/command_output.h"
#include "cli/live_cluster.h"
#include "cli/psctl_report.pb.h"
#include "proto/model.pb.h"

namespace pscluster {

// A dense shard named on the command line.
struct ShardName {
  std::string variable;
  // -1: every partition of the variable.
  int32_t partition = -1;
};

// Resolves "VAR" or "VAR/PART" against `model`. Variable names may themselves contain '/'
// ("dense/kernel"), so a name that is a variable is taken whole, and otherwise a numeric last
// component is the partition. NOT_FOUND naming the variable when the model has no such
// variable; INVALID_ARGUMENT when it names a table (pointing to `psctl table`).
absl::StatusOr<ShardName> ParseShardName(const v1::ModelSpec& model, absl::string_view arg);

struct ShardOptions {
  // With values_count > 0, values [values_offset, values_offset + values_count) of each
  // listed shard come back too (clipped to the shard).
  int64_t values_offset = 0;
  int64_t values_count = 0;
  OutputFormat format = OutputFormat::kTable;
};

// `psctl shard VAR[/PART]`: the statistics (count, min, max, mean, std, L2 norm, NaN and Inf
// counts) of one partition, or of every partition of VAR and of the whole variable, as
// computed by the ps tasks (InspectShard, which reads without changing anything), with a
// slice of the values when asked. NOT_FOUND / INVALID_ARGUMENT from ParseShardName, or for a
// partition the variable does not have; a ps task that does not answer leaves its shards'
// `error` set and makes the status UNAVAILABLE naming it.
CommandOutput RunShardCommand(LiveCluster& cluster, absl::string_view shard,
                              const ShardOptions& options);
psctl::ShardReport BuildShardReport(LiveCluster& cluster, absl::string_view shard,
                                    const ShardOptions& options, absl::Status* status);
std::string FormatShardReport(const psctl::ShardReport& report);

struct TableOptions {
  // Rows to print (--key). Looked up without creating rows.
  std::vector<int64_t> keys;
  // Hottest keys shown, over all ps tasks.
  int hot_keys = 10;
  OutputFormat format = OutputFormat::kTable;
};

// `psctl table NAME`: the table's rows, memory, traffic and value statistics per ps task, its
// hottest keys, and with `keys` those rows (each from the ps task that owns the key, through
// InspectShard: a key without a row is reported missing and no row is created). NOT_FOUND
// naming the table when the model has none; NOT_FOUND naming the keys that have no row; a ps
// task that does not answer makes the status UNAVAILABLE naming it. The report holds
// whatever could be read.
CommandOutput RunTableCommand(LiveCluster& cluster, absl::string_view table,
                              const TableOptions& options);
psctl::TableReport BuildTableReport(LiveCluster& cluster, absl::string_view table,
                                    const TableOptions& options, absl::Status* status);
std::string FormatTableReport(const psctl::TableReport& report);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_SHARD_COMMAND_H_
