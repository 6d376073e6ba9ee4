#include "storage/rocksdb_status.h"

#include "absl/strings/str_cat.h"

namespace pscluster {

absl::Status FromRocksDb(const rocksdb::Status& status, absl::string_view context) {
  if (status.ok()) return absl::OkStatus();
  const std::string message = absl::StrCat(context, ": ", status.ToString());
  if (status.IsCorruption()) return absl::DataLossError(message);
  if (status.IsNotFound()) return absl::NotFoundError(message);
  if (status.IsInvalidArgument()) return absl::InvalidArgumentError(message);
  if (status.IsIOError() || status.IsBusy() || status.IsTryAgain() || status.IsTimedOut()) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

}  // namespace pscluster
