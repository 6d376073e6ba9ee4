#include "common/version.h"

#include "common/build_info.h"

namespace pscluster {

std::string VersionString() {
  return std::string(PSCLUSTER_VERSION) + " (commit " + PSCLUSTER_COMMIT + ")";
}

}  // namespace pscluster
