#include "security/authz.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "grpc/grpc_security_constants.h"
#include "grpcpp/security/auth_context.h"

namespace pscluster {
namespace {

constexpr Role kChief = Role::kChief;
constexpr Role kPs = Role::kPs;
constexpr Role kWorker = Role::kWorker;
constexpr Role kEvaluator = Role::kEvaluator;
constexpr Role kViewer = Role::kViewer;
constexpr Role kAdmin = Role::kAdmin;

const MethodRule* FindRule(absl::string_view method) {
  for (const MethodRule& rule : MethodRules()) {
    if (rule.method == method) return &rule;
  }
  return nullptr;
}

std::string RoleList(const std::vector<Role>& roles) {
  return absl::StrJoin(roles, ", ",
                       [](std::string* out, Role role) { absl::StrAppend(out, RoleName(role)); });
}

}  // namespace

const std::vector<MethodRule>& MethodRules() {
  static const auto* const rules = new std::vector<MethodRule>{
      // The ps: only the chief changes what variables exist or what they hold wholesale.
      {"ParameterServer.CreateShards", {kChief}},
      {"ParameterServer.SaveShards", {kChief}},
      {"ParameterServer.RestoreShards", {kChief}},
      // A push counts for the worker it names (a sync step's share, the per-worker drops):
      // a worker pushes only as itself.
      {"ParameterServer.PushDense", {kWorker}, /*own_task_only=*/true},
      {"ParameterServer.PushSparse", {kWorker}, /*own_task_only=*/true},
      // A sparse pull creates the rows it misses, so it is not for read-only operators.
      {"ParameterServer.PullSparse", {kChief, kWorker, kEvaluator}},
      {"ParameterServer.PullDense", {kChief, kWorker, kEvaluator, kViewer, kAdmin}},
      {"ParameterServer.ListShards", {kChief, kWorker, kEvaluator, kViewer, kAdmin}},
      {"ParameterServer.InspectShard", {kChief, kViewer, kAdmin}},
      {"ParameterServer.GetStatus", {kChief, kPs, kWorker, kEvaluator, kViewer, kAdmin}},
      // A primary forwards its own updates to its backups.
      {"ParameterServer.Replicate", {kPs}, /*own_task_only=*/true},
      {"ParameterServer.ReplicateSparse", {kPs}, /*own_task_only=*/true},
      {"ParameterServer.FailOverPs", {kChief}},
      {"ParameterServer.RebuildBackup", {kChief}},
      // A primary sends its own shards' copies to their new backups.
      {"ParameterServer.InstallReplica", {kPs}, /*own_task_only=*/true},
      // The chief: tasks speak only for themselves; operators read, and admins checkpoint.
      {"Coordinator.RegisterTask", {kPs, kWorker, kEvaluator}, /*own_task_only=*/true},
      {"Coordinator.Heartbeat", {kPs, kWorker, kEvaluator}, /*own_task_only=*/true},
      {"Coordinator.AcquireToken", {kWorker}, /*own_task_only=*/true},
      {"Coordinator.ReportStep", {kWorker}, /*own_task_only=*/true},
      {"Coordinator.ReportEvaluation", {kEvaluator}, /*own_task_only=*/true},
      {"Coordinator.Checkpoint", {kAdmin}},
      {"Coordinator.GetModel", {kChief, kPs, kWorker, kEvaluator, kViewer, kAdmin}},
      {"Coordinator.GetClusterStatus", {kChief, kPs, kWorker, kEvaluator, kViewer, kAdmin}},
      // A worker or evaluator task's own small service.
      {"Worker.GetStatus", {kChief, kPs, kWorker, kEvaluator, kViewer, kAdmin}},
  };
  return *rules;
}

absl::Status Authorize(const PeerIdentity& peer, absl::string_view method,
                       const v1::TaskId* acting_for) {
  const MethodRule* rule = FindRule(method);
  if (rule == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(peer.ToString(), " may not call ", method, ": no role may"));
  }
  if (std::find(rule->roles.begin(), rule->roles.end(), peer.role) == rule->roles.end()) {
    return absl::PermissionDeniedError(absl::StrCat("role ", RoleName(peer.role), " (",
                                                    peer.ToString(), ") may not call ", method,
                                                    "; allowed: ", RoleList(rule->roles)));
  }
  if (rule->own_task_only) {
    const bool own = acting_for != nullptr && acting_for->job() == RoleName(peer.role) &&
                     acting_for->index() == peer.index;
    if (!own) {
      return absl::PermissionDeniedError(absl::StrCat(
          peer.ToString(), " may not call ", method, " for ",
          acting_for == nullptr ? std::string("another task")
                                : absl::StrCat(acting_for->job(), ":", acting_for->index()),
          "; a task acts only for itself"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PeerIdentity> Authorizer::PeerOf(const grpc::ServerContext& context) const {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  std::vector<std::string> seen;
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    for (const grpc::string_ref& value : auth->FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME)) {
      const std::string uri(value.data(), value.size());
      absl::StatusOr<PeerIdentity> id = ParsePeerUri(uri);
      if (id.ok() && id->cluster == cluster_) return id;
      seen.push_back(uri);
    }
  }
  if (seen.empty()) {
    return absl::UnauthenticatedError(absl::StrCat("the caller has no certificate with a spiffe://",
                                                   cluster_, "/... URI (cluster \"", cluster_,
                                                   "\")"));
  }
  return absl::UnauthenticatedError(absl::StrCat("the caller's certificate names ",
                                                 absl::StrJoin(seen, ", "),
                                                 ", not a member of cluster \"", cluster_, "\""));
}

grpc::Status Authorizer::Check(const grpc::ServerContext& context, absl::string_view method,
                               const v1::TaskId* acting_for) const {
  if (!enforcing()) return grpc::Status::OK;
  absl::StatusOr<PeerIdentity> peer = PeerOf(context);
  if (!peer.ok()) {
    return ToGrpcStatus(absl::Status(peer.status().code(),
                                     absl::StrCat(method, " refused: ", peer.status().message())));
  }
  return ToGrpcStatus(Authorize(*peer, method, acting_for));
}

absl::StatusOr<Authorizer> AuthorizerForTask(const TlsConfig& tls, const v1::TaskId& task) {
  if (!tls.enabled()) return Authorizer::AllowAll();
  absl::StatusOr<PeerIdentity> own = OwnIdentity(tls);
  if (!own.ok()) return own.status();
  if (RoleName(own->role) != task.job() || own->index != task.index()) {
    return absl::InvalidArgumentError(
        absl::StrCat("certificate ", tls.cert_file, " names ", own->ToString(), " (", own->Uri(),
                     ") but this task is ", task.job(), ":", task.index()));
  }
  return Authorizer::ForCluster(own->cluster);
}

v1::TaskId WorkerTask(int index) {
  v1::TaskId task;
  task.set_job("worker");
  task.set_index(index);
  return task;
}

}  // namespace pscluster
