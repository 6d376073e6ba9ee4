// Fuzzes the cluster spec parser (common/cluster_spec.h): TF_CONFIG JSON, the host-list flags
// and host:port addresses.
//
// Input: the first byte picks the form (% 3), the rest is its text:
//   0  TF_CONFIG JSON                      ParseTfConfig
//   1  flag values, one a line: chief_hosts, ps_hosts, worker_hosts, evaluator_hosts,
//      job_name, task_index, then the rest as TF_CONFIG      ResolveClusterConfig
//   2  one address                         ParseHostPort
// Invariants: errors are INVALID_ARGUMENT with a message; an accepted config validates, and
// survives ToTfConfigJson -> ParseTfConfig unchanged; an accepted address has a port in
// [0, 65535] and prints back to an address that parses to the same host and port.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/cluster_spec.h"
#include "fuzz/fuzz_check.h"
#include "google/protobuf/util/message_differencer.h"
#include "proto/cluster.pb.h"

namespace pscluster {
namespace {

void CheckRefused(const absl::Status& status, const std::string& input) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument && !status.message().empty(),
             "input ", input, " gave ", status.ToString());
}

void CheckAccepted(const v1::ClusterConfig& config) {
  const absl::Status valid = ValidateClusterConfig(config);
  FUZZ_CHECK(valid.ok(), valid.ToString(), " for ", config.ShortDebugString());
  const std::string json = ToTfConfigJson(config);
  absl::StatusOr<v1::ClusterConfig> again = ParseTfConfig(json);
  FUZZ_CHECK(again.ok(), "ToTfConfigJson gave ", json,
             ", which does not parse: ", again.status().ToString());
  FUZZ_CHECK(google::protobuf::util::MessageDifferencer::Equals(config, *again),
             "round trip through ", json, " changed ", config.ShortDebugString(), " into ",
             again->ShortDebugString());
  for (const v1::JobDef& job : config.cluster().jobs()) {
    for (int i = 0; i < job.tasks_size(); ++i) {
      absl::StatusOr<std::string> address = TaskAddress(config.cluster(), job.name(), i);
      FUZZ_CHECK(address.ok(), job.name(), ":", i, " of a valid config has no address");
      FUZZ_CHECK(ParseHostPort(*address).ok(), "valid config holds bad address ", *address);
    }
  }
}

void FuzzTfConfig(const std::string& json) {
  absl::StatusOr<v1::ClusterConfig> config = ParseTfConfig(json);
  if (!config.ok()) return CheckRefused(config.status(), json);
  CheckAccepted(*config);
}

void FuzzFlags(const std::string& text) {
  std::vector<std::string> lines = absl::StrSplit(text, absl::MaxSplits('\n', 6));
  lines.resize(7);
  ClusterConfigSources sources;
  sources.chief_hosts = lines[0];
  sources.ps_hosts = lines[1];
  sources.worker_hosts = lines[2];
  sources.evaluator_hosts = lines[3];
  sources.job_name = lines[4];
  if (!absl::SimpleAtoi(lines[5], &sources.task_index)) sources.task_index = -1;
  sources.tf_config = lines[6];
  // cluster_spec_file stays empty: the fuzzer reads no files.
  absl::StatusOr<v1::ClusterConfig> config = ResolveClusterConfig(sources);
  if (!config.ok()) return CheckRefused(config.status(), text);
  CheckAccepted(*config);
}

void FuzzAddress(const std::string& address) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(address);
  if (!parsed.ok()) return CheckRefused(parsed.status(), address);
  FUZZ_CHECK(parsed->port >= 0 && parsed->port <= 65535, "port ", parsed->port, " of ", address);
  const bool v6 = parsed->host.find(':') != std::string::npos;
  const std::string printed = v6 ? absl::StrCat("[", parsed->host, "]:", parsed->port)
                                 : absl::StrCat(parsed->host, ":", parsed->port);
  absl::StatusOr<HostPort> again = ParseHostPort(printed);
  FUZZ_CHECK(again.ok(), address, " parsed, but its canonical form ", printed,
             " does not: ", again.status().ToString());
  FUZZ_CHECK(again->host == parsed->host && again->port == parsed->port, address, " -> ", printed,
             " -> ", again->host, " ", again->port);
}

}  // namespace
}  // namespace pscluster

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0:
      pscluster::FuzzTfConfig(text);
      break;
    case 1:
      pscluster::FuzzFlags(text);
      break;
    default:
      pscluster::FuzzAddress(text);
      break;
  }
  return 0;
}
