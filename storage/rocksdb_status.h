#ifndef PSCLUSTER_STORAGE_ROCKSDB_STATUS_H_
#define PSCLUSTER_STORAGE_ROCKSDB_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "rocksdb/status.h"

namespace pscluster {

// The one place where RocksDB's status becomes an absl::Status. `context` names what was being
// done ("opening checkpoint shard /ckpt/ckpt-120/ps-0"), and leads the message.
// Corruption becomes DATA_LOSS; NotFound NOT_FOUND; IOError UNAVAILABLE (a disk may come back);
// InvalidArgument INVALID_ARGUMENT; Busy/TryAgain/TimedOut UNAVAILABLE; the rest INTERNAL.
absl::Status FromRocksDb(const rocksdb::Status& status, absl::string_view context);

}  // namespace pscluster

#endif  // PSCLUSTER_STORAGE_ROCKSDB_STATUS_H_
