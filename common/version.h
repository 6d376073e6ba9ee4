#ifndef PSCLUSTER_COMMON_VERSION_H_
#define PSCLUSTER_COMMON_VERSION_H_

#include <string>

namespace pscluster {

// The release (the VERSION file) and the commit the binary was built from, as
// "0.1.0 (commit 0123456789ab)"; the commit is "unknown" outside a git checkout.
std::string VersionString();

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_VERSION_H_
