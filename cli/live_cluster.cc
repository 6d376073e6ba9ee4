#include "cli/live_cluster.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/grpc_ps_transport.h"
#include "common/status_macros.h"

namespace pscluster {

std::string LiveCluster::PsName(int ps) const {
  if (ps >= 0 && ps < model.ps_addresses_size()) {
    return absl::StrCat("ps:", ps, " (", model.ps_addresses(ps), ")");
  }
  return absl::StrCat("ps:", ps);
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

absl::StatusOr<LiveCluster> ConnectToCluster(ChiefClient& chief,
                                             const LiveClusterOptions& options) {
  v1::GetModelResponse model;
  PS_RETURN_IF_ERROR(chief.GetModel(&model));
  GrpcPsTransportOptions transport_options;
  transport_options.rpc_timeout = options.rpc_timeout;
  transport_options.tls = options.tls;
  std::vector<std::string> addresses(model.ps_addresses().begin(), model.ps_addresses().end());
  return LiveClusterOver(chief.address(), std::move(model),
                         std::make_unique<GrpcPsTransport>(addresses, transport_options), options);
}

}  // namespace pscluster
