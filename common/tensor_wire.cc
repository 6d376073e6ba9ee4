#include "common/tensor_wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/base/internal/endian.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sealed_channel.h"
#include "common/socket_io.h"

namespace pscluster {

void EncodeFrameHeader(const FrameHeader& h, char* out) {
  absl::little_endian::Store32(out, kFrameMagic);
  absl::little_endian::Store16(out + 4, h.op);
  absl::little_endian::Store16(out + 6, h.flags);
  absl::little_endian::Store32(out + 8, h.status);
  absl::little_endian::Store32(out + 12, h.meta_bytes);
  absl::little_endian::Store64(out + 16, h.payload_bytes);
  absl::little_endian::Store64(out + 24, h.tag);
}

absl::StatusOr<FrameHeader> DecodeFrameHeader(const char* in) {
  const uint32_t magic = absl::little_endian::Load32(in);
  if (magic != kFrameMagic) {
    return absl::InvalidArgumentError(absl::StrCat(
        "not a tensor wire frame: it starts with 0x", absl::Hex(magic, absl::kZeroPad8),
        ", expected the magic \"PSW1\" (is a gRPC client talking to the data port?)"));
  }
  FrameHeader h;
  h.op = absl::little_endian::Load16(in + 4);
  h.flags = absl::little_endian::Load16(in + 6);
  h.status = absl::little_endian::Load32(in + 8);
  h.meta_bytes = absl::little_endian::Load32(in + 12);
  h.payload_bytes = absl::little_endian::Load64(in + 16);
  h.tag = absl::little_endian::Load64(in + 24);
  return h;
}

std::string WireOpName(uint16_t op) {
  switch (static_cast<WireOp>(op & ~kResponseBit)) {
    case WireOp::kPullDense:
      return "PullDense";
    case WireOp::kPushDense:
      return "PushDense";
    case WireOp::kPullSparse:
      return "PullSparse";
    case WireOp::kPushSparse:
      return "PushSparse";
    case WireOp::kReplicate:
      return "Replicate";
    case WireOp::kReplicateStream:
      return "ReplicateStream";
    case WireOp::kReplicateCommit:
      return "ReplicateCommit";
    case WireOp::kReplicateSparse:
      return "ReplicateSparse";
  }
  return absl::StrCat("op ", op & ~kResponseBit);
}

absl::Status WireErrorStatus(uint32_t code, absl::string_view message) {
  if (code == 0) return absl::OkStatus();
  if (code > static_cast<uint32_t>(absl::StatusCode::kUnauthenticated)) {
    code = static_cast<uint32_t>(absl::StatusCode::kUnknown);
  }
  return absl::Status(static_cast<absl::StatusCode>(code), message);
}

void ConfigureWireSocket(int fd, int buffer_bytes) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes));
  }
}

WireSocket::~WireSocket() {
  sealed_.reset();
  if (ssl_ != nullptr) SSL_free(ssl_);
  if (fd_ >= 0) close(fd_);
}

absl::Status WireSocket::AttachTls(ssl_st* ssl, bool sealed) {
  sealed_.reset();
  if (ssl_ != nullptr) SSL_free(ssl_);
  ssl_ = ssl;
  fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL, 0) | O_NONBLOCK);
  if (!sealed) {
    // TLS records: reads take every record that has arrived at once.
    SSL_set_read_ahead(ssl_, 1);
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<SealedChannel>> channel = SealedChannel::Create(fd_, ssl_);
  if (!channel.ok()) return channel.status();
  sealed_ = *std::move(channel);
  return absl::OkStatus();
}

namespace {

// What an SSL_read / SSL_write that did not complete means: wait for the socket (true, with
// *events), or the error that ends the call.
bool TlsWants(ssl_st* ssl, int r, const char* what, short* events, absl::Status* error) {
  const int err = SSL_get_error(ssl, r);
  if (err == SSL_ERROR_WANT_READ) {
    *events = POLLIN;
    return true;
  }
  if (err == SSL_ERROR_WANT_WRITE) {
    *events = POLLOUT;
    return true;
  }
  if (err == SSL_ERROR_ZERO_RETURN) {
    *error = absl::UnavailableError("the peer closed the connection");
  } else if (err == SSL_ERROR_SYSCALL) {
    *error = errno == 0 || errno == ECONNRESET || errno == EPIPE
                 ? absl::UnavailableError("the peer closed the connection")
                 : SocketError(what, errno);
  } else {
    char buf[256];
    ERR_error_string_n(ERR_get_error(), buf, sizeof(buf));
    *error = absl::UnavailableError(absl::StrCat(what, ": TLS: ", buf));
  }
  ERR_clear_error();
  return false;
}

}  // namespace

absl::Status WireSocket::TlsWrite(const char* data, size_t n, absl::Time deadline) {
  while (n > 0) {
    size_t written = 0;
    ERR_clear_error();
    const int r = SSL_write_ex(ssl_, data, n, &written);
    if (r == 1) {
      data += written;
      n -= written;
      continue;
    }
    short events = 0;
    absl::Status error;
    if (!TlsWants(ssl_, r, "send", &events, &error)) return error;
    if (absl::Status s = AwaitSocket(fd_, events, deadline, "send"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status WireSocket::TlsRead(char* out, int64_t n, absl::Time deadline) {
  while (n > 0) {
    size_t got = 0;
    ERR_clear_error();
    const int r = SSL_read_ex(ssl_, out, static_cast<size_t>(std::min<int64_t>(n, 1 << 30)), &got);
    if (r == 1) {
      out += got;
      n -= static_cast<int64_t>(got);
      continue;
    }
    short events = 0;
    absl::Status error;
    if (!TlsWants(ssl_, r, "receive", &events, &error)) return error;
    if (absl::Status s = AwaitSocket(fd_, events, deadline, "receive"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<WireSocket>> WireSocket::Connect(const std::string& host, int port,
                                                                absl::Duration timeout,
                                                                int buffer_bytes) {
  const std::string where = absl::StrCat(host, ":", port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  // A bracketed IPv6 literal ("[::1]") is looked up without its brackets.
  std::string name = host;
  if (name.size() >= 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  if (const int err = getaddrinfo(name.c_str(), service.c_str(), &hints, &found); err != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve the data port ", where, ": ", gai_strerror(err)));
  }
  absl::Status last = absl::UnavailableError(absl::StrCat("no address for ", where));
  const absl::Time deadline = DeadlineAfter(timeout);
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      last = SocketError("socket", errno);
      continue;
    }
    auto sock = std::make_unique<WireSocket>(fd);
    // Buffers are set before connecting so the window scale is negotiated for them.
    ConfigureWireSocket(fd, buffer_bytes);
    const int flags = fcntl(fd, F_GETFL, 0);
    fcntl(fd, F_SETFL, flags | O_NONBLOCK);
    int r = connect(fd, a->ai_addr, a->ai_addrlen);
    if (r != 0 && errno == EINPROGRESS) {
      absl::Status waited = AwaitSocket(fd, POLLOUT, deadline, "connect");
      if (!waited.ok()) {
        last = absl::Status(waited.code(),
                            absl::StrCat("connecting to ", where, ": ", waited.message()));
        continue;
      }
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      r = err == 0 ? 0 : -1;
      errno = err;
    }
    if (r != 0) {
      last = absl::UnavailableError(
          absl::StrCat("connecting to the data port ", where, ": ", std::strerror(errno)));
      continue;
    }
    freeaddrinfo(found);
    return sock;
  }
  freeaddrinfo(found);
  return last;
}

absl::Status WireSocket::WriteAll(struct iovec* iov, int count, absl::Duration timeout) {
  const absl::Time deadline = DeadlineAfter(timeout);
  if (sealed_ != nullptr) return sealed_->Write(iov, count, deadline);
  if (ssl_ != nullptr) {
    // A record each time would cost a record's overhead (and a system call) for every small
    // buffer: consecutive small ones (a frame header, its meta) go out together.
    constexpr size_t kSmall = 16 << 10;
    for (int i = 0; i < count;) {
      if (iov[i].iov_len >= kSmall) {
        absl::Status s =
            TlsWrite(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len, deadline);
        if (!s.ok()) return s;
        ++i;
        continue;
      }
      coalesced_.clear();
      for (; i < count && iov[i].iov_len < kSmall && coalesced_.size() + iov[i].iov_len <= kSmall;
           ++i) {
        coalesced_.append(static_cast<const char*>(iov[i].iov_base), iov[i].iov_len);
      }
      absl::Status s = TlsWrite(coalesced_.data(), coalesced_.size(), deadline);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  return SendAll(fd_, iov, count, deadline);
}

size_t WireSocket::MaxStagedBytes() {
  static const size_t max_bytes = [] {
    const uint64_t fallback = kMaxStagedBytes;
    const char* env = std::getenv("PSCLUSTER_SEAL_STAGE_BYTES");
    uint64_t bytes = fallback;
    if (env != nullptr && !absl::SimpleAtoi(env, &bytes)) {
      std::fprintf(stderr, "PSCLUSTER_SEAL_STAGE_BYTES=\"%s\" is not a byte count; keeping %llu\n",
                   env, static_cast<unsigned long long>(fallback));
      bytes = fallback;
    }
    return static_cast<size_t>(bytes);
  }();
  return max_bytes;
}

absl::Status WireSocket::Stage(struct iovec* iov, int count, absl::Duration timeout) {
  const size_t max_staged = MaxStagedBytes();
  if (sealed_ == nullptr || max_staged == 0) return WriteAll(iov, count, timeout);
  if (absl::Status s = sealed_->Stage(iov, count); !s.ok()) return s;
  if (sealed_->staged_bytes() >= max_staged) return Flush(timeout);
  return absl::OkStatus();
}

absl::Status WireSocket::Flush(absl::Duration timeout) {
  if (sealed_ == nullptr) return absl::OkStatus();
  return sealed_->Flush(DeadlineAfter(timeout));
}

absl::Status WireSocket::Write(absl::string_view bytes, absl::Duration timeout) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  return WriteAll(&iov, 1, timeout);
}

absl::Status WireSocket::ReadExact(void* out, int64_t n, absl::Duration timeout) {
  char* p = static_cast<char*>(out);
  const absl::Time deadline = DeadlineAfter(timeout);
  if (sealed_ != nullptr) return sealed_->Read(p, n, deadline);
  if (ssl_ != nullptr) return TlsRead(p, n, deadline);
  return ReceiveExact(fd_, p, n, deadline);
}

absl::Status WireSocket::Discard(int64_t n, absl::Duration timeout) {
  std::vector<char> sink(static_cast<size_t>(std::min<int64_t>(n, 1 << 20)));
  while (n > 0) {
    const int64_t part = std::min<int64_t>(n, static_cast<int64_t>(sink.size()));
    if (absl::Status s = ReadExact(sink.data(), part, timeout); !s.ok()) return s;
    n -= part;
  }
  return absl::OkStatus();
}

absl::Status WireSocket::AwaitReadable(absl::Duration timeout) {
  // Bytes TLS has already read (read-ahead) or decrypted are not in the socket any more.
  if (sealed_ != nullptr && sealed_->HasBuffered()) return absl::OkStatus();
  if (sealed_ == nullptr && ssl_ != nullptr && SSL_has_pending(ssl_) == 1) {
    return absl::OkStatus();
  }
  return AwaitSocket(fd_, POLLIN, DeadlineAfter(timeout), "waiting for a request");
}

void WireSocket::Shutdown() { shutdown(fd_, SHUT_RDWR); }

}  // namespace pscluster
