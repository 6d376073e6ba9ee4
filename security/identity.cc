#include "security/identity.h"

#include <cstdlib>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pscluster {
namespace {

constexpr absl::string_view kScheme = "spiffe://";
constexpr absl::string_view kExpected =
    "expected spiffe://<cluster>/<chief|ps|worker|evaluator>/<index> or "
    "spiffe://<cluster>/psctl/<viewer|admin>";

bool ValidClusterName(absl::string_view name) {
  if (name.empty() || name.size() > 63) return false;
  for (char c : name) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '.' && c != '-' && c != '_') {
      return false;
    }
  }
  return true;
}

bool JobRole(absl::string_view job, Role* role) {
  if (job == "chief") {
    *role = Role::kChief;
  } else if (job == "ps") {
    *role = Role::kPs;
  } else if (job == "worker") {
    *role = Role::kWorker;
  } else if (job == "evaluator") {
    *role = Role::kEvaluator;
  } else {
    return false;
  }
  return true;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kChief:
      return "chief";
    case Role::kPs:
      return "ps";
    case Role::kWorker:
      return "worker";
    case Role::kEvaluator:
      return "evaluator";
    case Role::kViewer:
      return "viewer";
    case Role::kAdmin:
      return "admin";
  }
  return "unknown";
}

std::string PeerIdentity::ToString() const {
  if (role == Role::kViewer || role == Role::kAdmin) return absl::StrCat("psctl ", RoleName(role));
  return absl::StrCat(RoleName(role), ":", index);
}

std::string PeerIdentity::Uri() const {
  if (role == Role::kViewer || role == Role::kAdmin) {
    return absl::StrCat(kScheme, cluster, "/psctl/", RoleName(role));
  }
  return absl::StrCat(kScheme, cluster, "/", RoleName(role), "/", index);
}

absl::StatusOr<PeerIdentity> ParsePeerUri(absl::string_view uri) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("peer URI \"", uri, "\": ", why, "; ", kExpected));
  };
  if (!absl::StartsWith(uri, kScheme)) return bad("not a spiffe:// URI");
  const std::vector<absl::string_view> parts = absl::StrSplit(uri.substr(kScheme.size()), '/');
  if (parts.size() != 3) return bad("wrong number of path parts");
  PeerIdentity id;
  if (!ValidClusterName(parts[0])) {
    return bad("the cluster name must be 1-63 of [a-z0-9._-]");
  }
  id.cluster = std::string(parts[0]);
  if (parts[1] == "psctl") {
    if (parts[2] == "viewer") {
      id.role = Role::kViewer;
    } else if (parts[2] == "admin") {
      id.role = Role::kAdmin;
    } else {
      return bad("unknown psctl level");
    }
    return id;
  }
  if (!JobRole(parts[1], &id.role)) return bad("unknown job");
  if (parts[2].empty() || parts[2].size() > 6 || !absl::SimpleAtoi(parts[2], &id.index) ||
      id.index < 0 || !absl::ascii_isdigit(parts[2][0])) {
    return bad("the task index must be a number >= 0");
  }
  return id;
}

absl::StatusOr<PeerIdentity> TaskIdentity(const std::string& cluster, const std::string& job,
                                          int index) {
  PeerIdentity id;
  if (!JobRole(job, &id.role)) {
    return absl::InvalidArgumentError(absl::StrCat("no identity for job \"", job, "\""));
  }
  id.cluster = cluster;
  id.index = index;
  return id;
}

}  // namespace pscluster
