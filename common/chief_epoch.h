#ifndef PSCLUSTER_COMMON_CHIEF_EPOCH_H_
#define PSCLUSTER_COMMON_CHIEF_EPOCH_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pscluster {

// Fencing of chiefs. Every chief has an epoch higher than any chief of the cluster before it
// (storage/checkpoint.h: NextChiefEpoch). A ps task refuses control requests (create, save,
// restore) that carry a lower epoch than one it has seen, and a chief does not write the
// checkpoint directory once a newer epoch is recorded there: a chief that was replaced while
// it was stopped, hung or cut off cannot mix its half-done work with its successor's.

// The refusal of `what` from a chief of `epoch` by one that follows `newer`:
// FAILED_PRECONDITION, recognized by IsSupersededChief even with context added to the message.
absl::Status SupersededChiefError(absl::string_view what, int64_t epoch, int64_t newer);

// Whether `status` is (or wraps the message of) a SupersededChiefError.
bool IsSupersededChief(const absl::Status& status);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_CHIEF_EPOCH_H_
