#ifndef PSCLUSTER_SECURITY_IDENTITY_H_
#define PSCLUSTER_SECURITY_IDENTITY_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pscluster {

// Who a peer is, as its certificate says: a SPIFFE-style URI in the certificate's subject
// alternative names,
//
//   spiffe://<cluster>/<job>/<index>     a task: job chief, ps, worker or evaluator
//   spiffe://<cluster>/psctl/<level>     an operator's psctl: level viewer or admin
//
// <cluster> is the cluster's name (lower-case letters, digits, '.', '-', '_'); a certificate
// of another cluster signed by the same CA is refused by name. deploy/tls/make_certs.sh
// writes these URIs.
enum class Role {
  kChief,
  kPs,
  kWorker,
  kEvaluator,
  kViewer,  // psctl, read-only
  kAdmin,   // psctl, may also take checkpoints
};

struct PeerIdentity {
  std::string cluster;
  Role role = Role::kViewer;
  // The task index for chief, ps, worker and evaluator; 0 for psctl roles.
  int index = 0;

  // "worker:1", "chief:0", "psctl viewer".
  std::string ToString() const;
  // "spiffe://<cluster>/worker/1".
  std::string Uri() const;
};

// "chief", "ps", "worker", "evaluator", "viewer", "admin".
absl::string_view RoleName(Role role);

// Parses a URI of the form above. Errors name the URI and the expected form.
absl::StatusOr<PeerIdentity> ParsePeerUri(absl::string_view uri);

// A task's identity: job is "chief", "ps", "worker" or "evaluator".
absl::StatusOr<PeerIdentity> TaskIdentity(const std::string& cluster, const std::string& job,
                                          int index);

}  // namespace pscluster

#endif  // PSCLUSTER_SECURITY_IDENTITY_H_
