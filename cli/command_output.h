#ifndef PSCLUSTER_CLI_COMMAND_OUTPUT_H_
#define PSCLUSTER_CLI_COMMAND_OUTPUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "proto/model.pb.h"
#include "proto/ps_service.pb.h"
#include "sharding/partitioner.h"  // ShapeString, for the commands

namespace pscluster {

// What a psctl command prints, and whether it fully succeeded. `text` holds everything that
// could be read even when `status` is not OK: an unreachable ps task or a corrupt shard leaves
// the other rows in place, and psctl prints `text`, then the status's message, and exits
// non-zero.
struct CommandOutput {
  std::string text;
  absl::Status status;
};

// How a command renders its report.
enum class OutputFormat {
  kTable,  // aligned columns for people
  kJson,   // protobuf's JSON mapping of the report, proto field names, defaults included
};

// `message` as indented JSON (one trailing newline).
std::string ReportToJson(const google::protobuf::Message& message);

// 1536 -> "1.5 KiB"; below 1 KiB the exact count ("512 B").
std::string HumanBytes(int64_t bytes);

// DT_FLOAT32 (and DT_INVALID, which variables treat as float32) -> "float32".
std::string DtypeName(v1::DataType dtype);

// "adam(learning_rate=0.001, beta1=0.9)": the optimizer's kind and the hyperparameters that
// are set, plus its decay schedule; "none" when no kind is set.
std::string OptimizerDescription(const v1::OptimizerSpec& optimizer);

// A statistic for a table cell: 6 significant digits ("0.0123457", "-3.5e+07").
std::string FormatStat(double value);

// Combines statistics of disjoint value sets (exact for count, min, max, NaN/Inf counts;
// mean, std and norm recomputed from sums).
v1::ValueStats CombineValueStats(const v1::ValueStats& a, const v1::ValueStats& b);

// A status with `context: ` put before its message, keeping its code.
absl::Status WithContext(const absl::Status& status, const std::string& context);

// OK when `errors` holds only OK statuses; otherwise the code of the first error and every
// error's message, joined by "; ".
absl::Status MergeErrors(const std::vector<absl::Status>& errors);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_COMMAND_OUTPUT_H_
