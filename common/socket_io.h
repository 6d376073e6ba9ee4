#ifndef PSCLUSTER_COMMON_SOCKET_IO_H_
#define PSCLUSTER_COMMON_SOCKET_IO_H_

#include <sys/uio.h>

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pscluster {

// Blocking I/O with a deadline on a non-blocking socket, for the tensor data plane
// (common/tensor_wire.h) and its sealed TLS framing (common/sealed_channel.h). A deadline
// that passes is DEADLINE_EXCEEDED; a peer that went away is UNAVAILABLE.

// absl::InfiniteFuture() for an infinite timeout, now + timeout otherwise.
absl::Time DeadlineAfter(absl::Duration timeout);

// Waits for `events` (poll(2)) on fd until the deadline. `what` names the operation in errors.
absl::Status AwaitSocket(int fd, short events, absl::Time deadline, const char* what);

// Work a caller can do while the socket is not ready: it does a piece and returns true, or
// returns false when it has none left (the call then waits in poll(2)).
using WhileBlocked = absl::FunctionRef<bool()>;

// Sends every byte of the buffers, in order. Advances iov as it goes (its contents are
// consumed). While the socket's buffer is full, calls `while_blocked` until it has nothing
// left to do, then waits.
absl::Status SendAll(int fd, struct iovec* iov, int count, absl::Time deadline);
absl::Status SendAll(int fd, struct iovec* iov, int count, absl::Time deadline,
                     WhileBlocked while_blocked);

// Sends what the socket takes now of the n bytes, without waiting: how many (0 when its buffer
// is full).
absl::StatusOr<size_t> SendWithoutWaiting(int fd, const char* data, size_t n);

// Receives exactly n bytes.
absl::Status ReceiveExact(int fd, char* out, int64_t n, absl::Time deadline);

// Receives at least `min` bytes and at most `max` (>= min), as many as have arrived once
// `min` have; returns how many. `while_blocked` as for SendAll, while nothing has arrived.
absl::StatusOr<int64_t> ReceiveAtLeast(int fd, char* out, int64_t min, int64_t max,
                                       absl::Time deadline, WhileBlocked while_blocked);

// An errno as a status: DEADLINE_EXCEEDED for a timeout, UNAVAILABLE otherwise.
absl::Status SocketError(const char* what, int err);

}  // namespace pscluster

#endif  // PSCLUSTER_COMMON_SOCKET_IO_H_
