#include "client/chief_client.h"

namespace pscluster {

absl::StatusOr<v1::GetModelResponse> ChiefClient::AwaitModel(const std::function<bool()>& stopped) {
  v1::GetModelResponse model;
  while (!stopped()) {
    // Any error (the chief not up yet, not ready, restarting) is waited out.
    if (PollModel(options_.poll_slice, &model).ok()) return model;
  }
  return absl::CancelledError("stopped while waiting for the chief's model");
}

absl::Status ChiefClient::AwaitToken(const v1::AcquireTokenRequest& req,
                                     const std::function<bool()>& stopped,
                                     v1::AcquireTokenResponse* resp) {
  while (true) {
    absl::Status s = PollToken(req, options_.poll_slice, resp);
    if (s.code() != absl::StatusCode::kDeadlineExceeded) return s;
    if (stopped()) return absl::CancelledError("stopped while waiting for a token");
  }
}

}  // namespace pscluster
