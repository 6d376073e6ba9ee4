#ifndef PSCLUSTER_CLI_LIVE_CLUSTER_H_
#define PSCLUSTER_CLI_LIVE_CLUSTER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/chief_client.h"
#include "client/parameter_client.h"
#include "client/ps_transport.h"
#include "proto/coordinator_service.pb.h"
#include "security/tls.h"

namespace pscluster {

struct LiveClusterOptions {
  // Deadline of each call to a ps task (the chief's are the ChiefClient's).
  absl::Duration rpc_timeout = absl::Seconds(10);
  // Calls to a ps task that fail with UNAVAILABLE are tried this many times in all: an
  // operator's tool reports a dead task quickly rather than waiting for it.
  int max_attempts = 2;
  // Mutual TLS toward the ps tasks (security/tls.h); plaintext when not enabled.
  TlsConfig tls;
};

// A running cluster as psctl reads it: the chief's GetModel answer (the model, the placement
// the daemons use, the ps tasks' addresses) and a client of the ps tasks routed by that
// placement. psctl only reads through it: ListShards, InspectShard and PullDense, which
// change no value and create no row. Thread-compatible.
struct LiveCluster {
  // Where the chief was reached, for messages.
  std::string chief_address;
  v1::GetModelResponse model;
  std::unique_ptr<ParameterClient> client;

  int num_ps() const { return client->num_ps(); }
  // "ps:1 (host:port)".
  std::string PsName(int ps) const;
};

// Asks the chief for the model (without waiting for it to be ready) and opens a channel to
// every ps task. UNAVAILABLE "cannot reach the chief at ADDRESS: ..." when the chief does not
// answer; the chief's own UNAVAILABLE ("the model is not ready: ...") before the model exists.
absl::StatusOr<LiveCluster> ConnectToCluster(ChiefClient& chief, const LiveClusterOptions& options);

// A LiveCluster over a given transport (a fake, or gRPC stubs chosen by a test).
// INVALID_ARGUMENT when the placement does not fit the model or the transport.
absl::StatusOr<LiveCluster> LiveClusterOver(const std::string& chief_address,
                                            v1::GetModelResponse model,
                                            std::unique_ptr<PsTransport> transport,
                                            const LiveClusterOptions& options);

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_LIVE_CLUSTER_H_
