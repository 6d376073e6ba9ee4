#include "common/socket_io.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace pscluster {
namespace {

// Milliseconds until `deadline` for poll(): -1 for no deadline, 0 once it passed.
int PollMillis(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

}  // namespace

absl::Status SocketError(const char* what, int err) {
  if (err == EAGAIN || err == EWOULDBLOCK || err == ETIMEDOUT) {
    return absl::DeadlineExceededError(absl::StrCat(what, " timed out"));
  }
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(err)));
}

absl::Time DeadlineAfter(absl::Duration timeout) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

absl::Status AwaitSocket(int fd, short events, absl::Time deadline, const char* what) {
  while (true) {
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, PollMillis(deadline));
    if (r > 0) {
      if ((p.revents & POLLNVAL) != 0) {
        return absl::UnavailableError(absl::StrCat(what, ": closed"));
      }
      return absl::OkStatus();  // readable, writable, or an error the next call reports
    }
    if (r == 0) return absl::DeadlineExceededError(absl::StrCat(what, " timed out"));
    if (errno != EINTR) return SocketError(what, errno);
  }
}

absl::Status SendAll(int fd, struct iovec* iov, int count, absl::Time deadline) {
  return SendAll(fd, iov, count, deadline, [] { return false; });
}

absl::Status SendAll(int fd, struct iovec* iov, int count, absl::Time deadline,
                     WhileBlocked while_blocked) {
  while (count > 0) {
    if (iov->iov_len == 0) {
      ++iov;
      --count;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(std::min(count, 64));
    const ssize_t sent = sendmsg(fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        if (while_blocked()) continue;
        if (absl::Status s = AwaitSocket(fd, POLLOUT, deadline, "send"); !s.ok()) return s;
        continue;
      }
      return SocketError("send", errno);
    }
    size_t left = static_cast<size_t>(sent);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (count > 0 && left > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<size_t> SendWithoutWaiting(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t sent = send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent >= 0) return static_cast<size_t>(sent);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return SocketError("send", errno);
  }
  return 0;
}

absl::Status ReceiveExact(int fd, char* out, int64_t n, absl::Time deadline) {
  return ReceiveAtLeast(fd, out, n, n, deadline, [] { return false; }).status();
}

absl::StatusOr<int64_t> ReceiveAtLeast(int fd, char* out, int64_t min, int64_t max,
                                       absl::Time deadline, WhileBlocked while_blocked) {
  int64_t total = 0;
  while (total < min) {
    const ssize_t got =
        recv(fd, out + total, static_cast<size_t>(std::min<int64_t>(max - total, 1 << 30)),
             MSG_DONTWAIT);
    if (got > 0) {
      total += got;
      continue;
    }
    if (got == 0) return absl::UnavailableError("the peer closed the connection");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (while_blocked()) continue;
      if (absl::Status s = AwaitSocket(fd, POLLIN, deadline, "receive"); !s.ok()) return s;
      continue;
    }
    return SocketError("receive", errno);
  }
  return total;
}

}  // namespace pscluster
