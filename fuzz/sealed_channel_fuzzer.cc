// Fuzzes the sealed data plane (common/sealed_channel.h) as a peer's bytes reach a reader: a
// real writer seals what the input asks for with keys from a real TLS 1.3 handshake, the input
// tampers with the sealed bytes, and a reader takes them back in reads of the input's sizes.
//
// Input: byte 0 sets new keys every 2^(b % 4) chunks; byte 1 the number of writes (1 + b % 8);
// each write is a flag byte (bit 0: Stage then Flush instead of Write; bits 1-2: 1 to 3
// buffers; bit 3: every buffer 128 KiB longer) and a uint16 size per buffer (the bytes are a
// pattern of their position). At most 1 MiB in all. Then the tampering: a kind byte (% 6:
// none, flip a bit, cut the stream short, overwrite 4 bytes (a chunk's length, say), repeat a
// range, insert bytes), a uint32 position and a uint32 value. Then uint16 read sizes (+128 KiB
// when the top bit is set), until the written bytes are covered.
// Invariants:
//   - untouched, every read returns the bytes written at its position, nothing is left
//     buffered, and no byte is left in the socket (a read never takes the next read's bytes);
//   - tampered, each read returns the bytes written at its position or fails with DATA_LOSS or
//     UNAVAILABLE (the stream ended), and after a failure every later read fails with the same
//     code: never other bytes, never a crash, never a wait (the bytes all arrived, the stream
//     was then closed).
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/sealed_channel.h"
#include "common/socket_io.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "testing/tls_pair.h"

namespace pscluster {
namespace {

constexpr size_t kMaxTotal = 1 << 20;

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// The plaintext of byte `i` of the stream.
char Pattern(size_t i) { return static_cast<char>((i * 131 + (i >> 9)) & 0xff); }

// Everything written to pair.fd[0] by `write`, which must succeed.
std::string Capture(SocketPair& pair, const std::function<absl::Status()>& write) {
  absl::Status written;
  std::string out = CaptureWrites(pair, write, &written);
  FUZZ_CHECK(written.ok(), "the writer failed: ", written.ToString());
  return out;
}

}  // namespace
}  // namespace pscluster

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pscluster;  // NOLINT: the entry point is outside the namespace
  static TlsPair* const tls = new TlsPair();
  FUZZ_CHECK(tls->ok(), "no TLS handshake");
  FuzzInput in(data, size);
  const int epoch_log2 = in.Int<uint8_t>() % 4;

  // The writes, and the plaintext they make.
  struct Write {
    bool staged;
    std::vector<std::string> buffers;
  };
  std::vector<Write> writes(1 + in.Int<uint8_t>() % 8);
  std::string plain;
  for (Write& w : writes) {
    const uint8_t flags = in.Int<uint8_t>();
    w.staged = (flags & 1) != 0;
    const int buffers = 1 + ((flags >> 1) & 3) % 3;
    for (int b = 0; b < buffers; ++b) {
      size_t n = in.Int<uint16_t>() + ((flags & 8) != 0 ? size_t{128} << 10 : 0);
      n = std::min(n, kMaxTotal - plain.size());
      std::string bytes(n, '\0');
      for (size_t i = 0; i < n; ++i) bytes[i] = Pattern(plain.size() + i);
      plain += bytes;
      w.buffers.push_back(std::move(bytes));
    }
  }

  // Sealed by a real writer.
  SocketPair out;
  auto writer = SealedChannel::Create(out.fd[0], tls->client(), epoch_log2);
  FUZZ_CHECK(writer.ok(), writer.status().ToString());
  std::string sealed = Capture(out, [&]() -> absl::Status {
    for (Write& w : writes) {
      std::vector<iovec> iov;
      for (std::string& b : w.buffers) iov.push_back({b.data(), b.size()});
      const int count = static_cast<int>(iov.size());
      absl::Status s = w.staged ? (*writer)->Stage(iov.data(), count)
                                : (*writer)->Write(iov.data(), count, Soon());
      if (s.ok() && w.staged) s = (*writer)->Flush(Soon());
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  });

  // Tampered with.
  const int kind = in.Int<uint8_t>() % 6;
  const uint32_t where = in.Int<uint32_t>();
  const uint32_t value = in.Int<uint32_t>();
  const std::string original = sealed;
  if (!sealed.empty()) {
    const size_t at = where % sealed.size();
    switch (kind) {
      case 1:
        sealed[at] = static_cast<char>(sealed[at] ^ (1 << (value % 8)));
        break;
      case 2:
        sealed.resize(at);
        break;
      case 3:
        for (size_t i = 0; i < 4 && at + i < sealed.size(); ++i) {
          sealed[at + i] = static_cast<char>(value >> (8 * i));
        }
        break;
      case 4:
        sealed.insert(at, sealed.substr(at, 1 + value % 70000));
        break;
      case 5:
        sealed.insert(at, std::string(1 + value % 64, static_cast<char>(value >> 8)));
        break;
      default:
        break;
    }
  }
  const bool untouched = sealed == original;

  // Read back.
  SocketPair in_pair;
  auto reader = SealedChannel::Create(in_pair.fd[1], tls->server(), epoch_log2);
  FUZZ_CHECK(reader.ok(), reader.status().ToString());
  std::thread deliver([&] {
    iovec iov{sealed.data(), sealed.size()};
    SendAll(in_pair.fd[0], &iov, 1, Soon()).IgnoreError();  // a reader that gave up stops it
    shutdown(in_pair.fd[0], SHUT_WR);
  });
  absl::StatusCode failed = absl::StatusCode::kOk;
  size_t at = 0;
  std::string got;
  while (at < plain.size()) {
    size_t n = in.Int<uint16_t>();
    n = (n & 0x7fff) + ((n & 0x8000) != 0 ? size_t{128} << 10 : 0);
    n = std::max<size_t>(1, std::min(n, plain.size() - at));
    got.assign(n, '\0');
    const absl::Status s = (*reader)->Read(got.data(), static_cast<int64_t>(n), Soon());
    if (failed != absl::StatusCode::kOk) {
      FUZZ_CHECK(s.code() == failed, "a read after a failure gave ", s.ToString());
    } else if (s.ok()) {
      FUZZ_CHECK(got == plain.substr(at, n), "a read returned other bytes at ", at, " (", n,
                 " bytes; tampering ", kind, ")");
    } else {
      FUZZ_CHECK(!untouched, "an untouched stream failed at ", at, ": ", s.ToString());
      FUZZ_CHECK(
          s.code() == absl::StatusCode::kDataLoss || s.code() == absl::StatusCode::kUnavailable,
          "a tampered stream failed with ", s.ToString());
      failed = s.code();
    }
    at += n;
  }
  if (untouched) {
    FUZZ_CHECK(!(*reader)->HasBuffered(), "bytes left buffered");
    char extra;
    FUZZ_CHECK(recv(in_pair.fd[1], &extra, 1, MSG_DONTWAIT) <= 0, "bytes left in the socket");
  }
  shutdown(in_pair.fd[1], SHUT_RDWR);  // the delivery stops waiting for a reader that gave up
  deliver.join();
  return 0;
}
