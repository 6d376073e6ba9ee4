#ifndef PSCLUSTER_COMMON_CLUSTER_SPEC_H_
#define PSCLUSTER_COMMON_CLUSTER_SPEC_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/cluster.pb.h"

namespace pscluster {

// Job names, as TensorFlow spells them.
inline constexpr absl::string_view kChiefJob = "chief";
inline constexpr absl::string_view kPsJob = "ps";
inline constexpr absl::string_view kWorkerJob = "worker";
inline constexpr absl::string_view kEvaluatorJob = "evaluator";

// Where a process learns its cluster. The first source that is set wins, in this order:
// the host-list flags (TF1 style: --ps_hosts=a:1,b:2 --job_name=ps --task_index=0), a file in
// TF_CONFIG format, the TF_CONFIG environment variable.
struct ClusterConfigSources {
  // Comma-separated host:port lists; any of them set selects the flag source.
  std::string chief_hosts;
  std::string ps_hosts;
  std::string worker_hosts;
  std::string evaluator_hosts;
  // This task. With the flag source both are required; with a file or TF_CONFIG they
  // override its "task" when set.
  std::string job_name;
  int task_index = -1;
  // Path of a JSON file in TF_CONFIG format.
  std::string cluster_spec_file;
  // The value of the TF_CONFIG environment variable ("" when unset).
  std::string tf_config;
};

// Parses TF_CONFIG JSON as TensorFlow does:
//   {"cluster": {"chief": ["h:p"], "ps": ["h:p", ...], "worker": [...]},
//    "task": {"type": "worker", "index": 0}, "environment": "...", "rpc_layer": "..."}
// A job may also be an object of index -> address ({"1": "h:p"}). "task.index" defaults to 0
// and may be a number or a numeric string. Unknown top-level keys are ignored, as in TF.
// The result is validated (ValidateClusterConfig).
absl::StatusOr<v1::ClusterConfig> ParseTfConfig(absl::string_view json);

// Resolves the config from the first source that is set (see ClusterConfigSources) and
// validates it. Reads `cluster_spec_file` when that is the source.
absl::StatusOr<v1::ClusterConfig> ResolveClusterConfig(const ClusterConfigSources& sources);

// Checks a config: known job names (chief, ps, worker, evaluator); exactly one chief; at least
// one ps; at most one evaluator; dense task indices; every address a valid host:port and no
// address used twice (port 0, "pick any port", may repeat); the task present, with its index
// in range (an evaluator may be outside the cluster, as TF allows, with index 0).
// Every error is INVALID_ARGUMENT naming the problem and the offending value.
absl::Status ValidateClusterConfig(const v1::ClusterConfig& config);

struct HostPort {
  std::string host;  // without brackets for IPv6
  int port = 0;
};

// Parses "host:port", "[v6addr]:port". Port 0..65535.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// Number of tasks of `job` (0 when the job is absent).
int NumTasks(const v1::ClusterSpec& spec, absl::string_view job);

// The address of job:index, NOT_FOUND when absent.
absl::StatusOr<std::string> TaskAddress(const v1::ClusterSpec& spec, absl::string_view job,
                                        int index);

// "ps:1".
std::string TaskName(const v1::TaskId& task);
v1::TaskId MakeTaskId(absl::string_view job, int index);

// The TF_CONFIG JSON for `config` (what a launcher hands to a child process).
std::string ToTfConfigJson(const v1::ClusterConfig& config);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_CLUSTER_SPEC_H_
