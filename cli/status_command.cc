#include "cli/status_command.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cli/table.h"
#include "common/cluster_spec.h"
#include "common/grpc_status.h"
#include "google/protobuf/util/json_util.h"

namespace pscluster {
namespace {

std::string HealthName(v1::TaskHealth h) {
  switch (h) {
    case v1::HEALTH_SERVING:
      return "SERVING";
    case v1::HEALTH_MISSING:
      return "MISSING";
    case v1::HEALTH_STOPPED:
      return "STOPPED";
    default:
      return "UNKNOWN";
  }
}

std::string Uptime(int64_t micros) {
  if (micros <= 0) return "-";
  return absl::FormatDuration(absl::Seconds(absl::ToInt64Seconds(absl::Microseconds(micros))));
}

}  // namespace

std::string FormatClusterStatus(const v1::ClusterStatus& status) {
  TextTable table({"TASK", "ADDRESS", "HEALTH", "UPTIME", "STEP", "DETAIL"});
  for (const v1::TaskStatus& t : status.tasks()) {
    table.AddRow({TaskName(t.task()), t.address(), HealthName(t.health()),
                  Uptime(t.uptime_micros()), absl::StrCat(t.step()), t.detail()});
  }
  return absl::StrCat(table.ToString(), "\nstate: ", status.state(), "\n");
}

absl::StatusOr<std::string> RunStatusCommand(v1::Coordinator::StubInterface& chief,
                                             const std::string& chief_address, bool json) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ClusterStatus status;
  grpc::Status s = chief.GetClusterStatus(&ctx, v1::GetClusterStatusRequest(), &status);
  if (!s.ok()) {
    absl::Status err = FromGrpcStatus(s);
    return absl::Status(err.code(), absl::StrCat("cannot reach the chief at ", chief_address,
                                                 ": ", err.message()));
  }
  if (!json) return FormatClusterStatus(status);
  std::string out;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  google::protobuf::util::MessageToJsonString(status, &out, options);
  return out;
}

}  // namespace pscluster
