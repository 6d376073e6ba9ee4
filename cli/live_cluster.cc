#include "cli/live_cluster.h"

#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/grpc_ps_transport.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"

namespace pscluster {

std::string LiveCluster::PsName(int ps) const {
  if (ps >= 0 && ps < model.ps_addresses_size()) {
    return absl::StrCat("ps:", ps, " (", model.ps_addresses(ps), ")");
  }
  return absl::StrCat("ps:", ps);
}

absl::Status ChiefError(const grpc::Status& status, const std::string& chief_address) {
  absl::Status s = FromGrpcStatus(status);
  if (s.ok()) return s;
  // The chief's own UNAVAILABLE ("the model is not ready") comes with a message of its own;
  // a transport failure names the connection.
  if (s.code() == absl::StatusCode::kDeadlineExceeded ||
      (s.code() == absl::StatusCode::kUnavailable &&
       s.message().find("not ready") == absl::string_view::npos)) {
    return absl::Status(
        s.code(), absl::StrCat("cannot reach the chief at ", chief_address, ": ", s.message()));
  }
  return absl::Status(s.code(), absl::StrCat("chief at ", chief_address, ": ", s.message()));
}

absl::StatusOr<LiveCluster> LiveClusterOver(const std::string& chief_address,
                                            v1::GetModelResponse model,
                                            std::unique_ptr<PsTransport> transport,
                                            const LiveClusterOptions& options) {
  ParameterClientOptions client_options;
  client_options.max_attempts = options.max_attempts;
  client_options.max_backoff = absl::Milliseconds(500);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ParameterClient> client,
                      ParameterClient::Create(model.model(), model.placement(),
                                              std::move(transport), client_options));
  LiveCluster out;
  out.chief_address = chief_address;
  out.model = std::move(model);
  out.client = std::move(client);
  return out;
}

absl::StatusOr<LiveCluster> ConnectToCluster(v1::Coordinator::StubInterface& chief,
                                             const std::string& chief_address,
                                             const LiveClusterOptions& options) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   absl::ToChronoMilliseconds(options.rpc_timeout));
  v1::GetModelResponse model;
  grpc::Status s = chief.GetModel(&ctx, v1::GetModelRequest(), &model);
  if (!s.ok()) return ChiefError(s, chief_address);
  GrpcPsTransportOptions transport_options;
  transport_options.rpc_timeout = options.rpc_timeout;
  std::vector<std::string> addresses(model.ps_addresses().begin(), model.ps_addresses().end());
  return LiveClusterOver(chief_address, std::move(model),
                         std::make_unique<GrpcPsTransport>(addresses, transport_options), options);
}

}  // namespace pscluster
