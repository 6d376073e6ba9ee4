#ifndef PSCLUSTER_SECURITY_AUTHZ_H_
#define PSCLUSTER_SECURITY_AUTHZ_H_

#include <initializer_list>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "proto/cluster.pb.h"
#include "security/identity.h"
#include "security/tls.h"

namespace pscluster {

// Which role may call which method: one row per method of every service the daemons serve
// (docs/security.md prints this table). Methods are named "<Service>.<Method>", e.g.
// "ParameterServer.SaveShards".
struct MethodRule {
  absl::string_view method;
  std::vector<Role> roles;
  // The request names a task (RegisterTask, Heartbeat, ReportEvaluation: `task`; AcquireToken,
  // ReportStep, PushDense's header and PushSparse: `worker`), and a task may only act for
  // itself.
  bool own_task_only = false;
};
const std::vector<MethodRule>& MethodRules();

// The decision alone, for a known peer: OK, or PERMISSION_DENIED naming the peer, the method
// and the roles allowed. `acting_for` is the task the request names, for own_task_only methods.
// A method missing from the table is denied.
absl::Status Authorize(const PeerIdentity& peer, absl::string_view method,
                       const v1::TaskId* acting_for = nullptr);

// Checks each call of a daemon's services against MethodRules, with the peer's identity taken
// from its TLS certificate (PeerIdentity). Without TLS every call is allowed: a daemon serves
// plaintext only on loopback or when told --allow_insecure (ServiceHostOptions).
// Thread-safe (immutable).
class Authorizer {
 public:
  // Allows every call.
  static Authorizer AllowAll() { return Authorizer(""); }
  // Allows the calls MethodRules allows to peers whose certificate names `cluster`.
  static Authorizer ForCluster(std::string cluster) { return Authorizer(std::move(cluster)); }

  bool enforcing() const { return !cluster_.empty(); }

  // The calling peer's identity: UNAUTHENTICATED when the call carries no certificate URI of
  // this cluster. Not for AllowAll().
  absl::StatusOr<PeerIdentity> PeerOf(const grpc::ServerContext& context) const;

  // OK when the caller may call `method` (acting for `acting_for`, when the method names a
  // task); UNAUTHENTICATED or PERMISSION_DENIED otherwise, as a grpc::Status for the handler
  // to return.
  grpc::Status Check(const grpc::ServerContext& context, absl::string_view method,
                     const v1::TaskId* acting_for = nullptr) const;

 private:
  explicit Authorizer(std::string cluster) : cluster_(std::move(cluster)) {}
  std::string cluster_;  // Empty: allow all.
};

// The authorizer of a task's daemon: AllowAll() without TLS; with TLS, ForCluster() of the
// cluster its own certificate names, after checking that the certificate names this very task
// (INVALID_ARGUMENT naming both otherwise).
absl::StatusOr<Authorizer> AuthorizerForTask(const TlsConfig& tls, const v1::TaskId& task);

// The TaskId {job: "worker", index: worker}, for methods that name a worker by index.
v1::TaskId WorkerTask(int index);

}  // namespace pscluster

// In a gRPC handler: returns the refusal when `check` (an Authorizer::Check) refuses the call.
#define PS_RETURN_IF_DENIED(check)                       \
  do {                                                   \
    const ::grpc::Status ps_authz_status_ = (check);     \
    if (!ps_authz_status_.ok()) return ps_authz_status_; \
  } while (false)

#endif  // PSCLUSTER_SECURITY_AUTHZ_H_
