#include "cli/save_command.h"

#include "absl/strings/str_cat.h"

namespace pscluster {

CommandOutput RunSaveCommand(ChiefClient& chief, OutputFormat format) {
  CommandOutput out;
  v1::CheckpointResponse response;
  absl::Status s = chief.Checkpoint(&response);
  if (s.code() == absl::StatusCode::kUnimplemented) {
    out.status = absl::UnimplementedError(absl::StrCat(
        "the chief at ", chief.address(), " does not take checkpoints: ", s.message()));
    return out;
  }
  if (s.code() == absl::StatusCode::kDeadlineExceeded) {
    out.status = absl::DeadlineExceededError(
        absl::StrCat("the chief at ", chief.address(), " committed no checkpoint within ",
                     absl::FormatDuration(chief.options().checkpoint_timeout), ": ", s.message()));
    return out;
  }
  if (!s.ok()) {
    out.status = s;
    return out;
  }
  out.text =
      format == OutputFormat::kJson
          ? ReportToJson(response)
          : absl::StrCat(
                "checkpoint committed: ", response.path(), " (step ", response.step(), ", ",
                HumanBytes(response.bytes()), ", ",
                absl::FormatDuration(absl::Microseconds(response.micros())),
                response.held_micros() > 0
                    ? absl::StrCat(", training held for ",
                                   absl::FormatDuration(absl::Microseconds(response.held_micros())))
                    : "",
                ")\n");
  return out;
}

}  // namespace pscluster
