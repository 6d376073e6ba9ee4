#include "common/chief_epoch.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace pscluster {
namespace {

constexpr absl::string_view kMarker = "(a newer chief)";

}  // namespace

absl::Status SupersededChiefError(absl::string_view what, int64_t epoch, int64_t newer) {
  return absl::FailedPreconditionError(absl::StrCat(what, " from chief epoch ", epoch,
                                                    " refused: this task follows chief epoch ",
                                                    newer, " ", kMarker));
}

bool IsSupersededChief(const absl::Status& status) {
  return status.code() == absl::StatusCode::kFailedPrecondition &&
         absl::StrContains(status.message(), kMarker);
}

}  // namespace pscluster
