#ifndef PSCLUSTER_COMMON_SOCKET_IO_H_
#define PSCLUSTER_COMMON_SOCKET_IO_H_

#include <sys/uio.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace pscluster {

// Blocking I/O with a deadline on a non-blocking socket, for the tensor data plane
// (common/tensor_wire.h) and its sealed TLS framing (common/sealed_channel.h). A deadline
// that passes is DEADLINE_EXCEEDED; a peer that went away is UNAVAILABLE.

// absl::InfiniteFuture() for an infinite timeout, now + timeout otherwise.
absl::Time DeadlineAfter(absl::Duration timeout);

// Waits for `events` (poll(2)) on fd until the deadline. `what` names the operation in errors.
absl::Status AwaitSocket(int fd, short events, absl::Time deadline, const char* what);

// Sends every byte of the buffers, in order. Advances iov as it goes (its contents are
// consumed).
absl::Status SendAll(int fd, struct iovec* iov, int count, absl::Time deadline);

// Receives exactly n bytes.
absl::Status ReceiveExact(int fd, char* out, int64_t n, absl::Time deadline);

// An errno as a status: DEADLINE_EXCEEDED for a timeout, UNAVAILABLE otherwise.
absl::Status SocketError(const char* what, int err);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_SOCKET_IO_H_
