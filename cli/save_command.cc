#include "cli/save_command.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "cli/live_cluster.h"

namespace pscluster {

CommandOutput RunSaveCommand(v1::Coordinator::StubInterface& chief,
                             const std::string& chief_address, absl::Duration timeout,
                             OutputFormat format) {
  CommandOutput out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout));
  v1::CheckpointResponse response;
  grpc::Status s = chief.Checkpoint(&ctx, v1::CheckpointRequest(), &response);
  if (s.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
    out.status = absl::UnimplementedError(absl::StrCat(
        "the chief at ", chief_address, " does not take checkpoints: ", s.error_message()));
    return out;
  }
  if (s.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    out.status = absl::DeadlineExceededError(
        absl::StrCat("the chief at ", chief_address, " committed no checkpoint within ",
                     absl::FormatDuration(timeout), ": ", s.error_message()));
    return out;
  }
  if (!s.ok()) {
    out.status = ChiefError(s, chief_address);
    return out;
  }
  out.text = format == OutputFormat::kJson
                 ? ReportToJson(response)
                 : absl::StrCat("checkpoint committed: ", response.path(), " (step ",
                                response.step(), ", ", HumanBytes(response.bytes()), ", ",
                                absl::FormatDuration(absl::Microseconds(response.micros())), ")\n");
  return out;
}

}  // namespace pscluster
