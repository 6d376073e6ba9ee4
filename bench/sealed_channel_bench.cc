// The sealed data plane's cost on its own (common/sealed_channel.h): one loopback TCP
// connection, a reader that asks for N bytes (one byte up) and a writer that answers them,
// plaintext (send/recv of the caller's buffer) and sealed (TLS 1.3 keys, AES-128-GCM chunks),
// one after the other in the same run. Prints per size the median round trip and the bytes
// per second of each, and sealed / plaintext. What the ps's pull costs, without the ps:
//
//   bazel run -c opt //bench:sealed_channel_bench -- --sizes 1048576,16777216 --seconds 2
//   PSCLUSTER_SEAL_CIPHER=openssl PSCLUSTER_SEAL_THREADS=4 bazel-bin/bench/sealed_channel_bench
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/aes_gcm.h"
#include "common/sealed_channel.h"
#include "common/socket_io.h"
#include "testing/tls_pair.h"

namespace pscluster {
namespace {

absl::Time Later() { return absl::Now() + absl::Seconds(30); }

// A connected loopback TCP pair (TCP_NODELAY, as the data plane's sockets).
bool TcpPair(int fd[2]) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return false;
  }
  fd[0] = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(fd[0], reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) return false;
  fd[1] = accept(listener, nullptr, nullptr);
  close(listener);
  const int one = 1;
  for (int i = 0; i < 2; ++i) {
    setsockopt(fd[i], IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  return fd[1] >= 0;
}

struct Result {
  double p50_us = 0;
  double bytes_per_second = 0;
};

// Round trips of `size` bytes for about `seconds`: the writer thread answers each one-byte
// request with the bytes. `writer`/`reader` null: plaintext.
Result Measure(int fd[2], SealedChannel* writer, SealedChannel* reader, size_t size,
               double seconds) {
  std::vector<char> source(size), sink(size);
  for (size_t i = 0; i < size; ++i) source[i] = static_cast<char>(i * 131);
  std::thread answer([&] {
    char request;
    while (ReceiveExact(fd[0], &request, 1, Later()).ok() && request == 'r') {
      iovec iov{source.data(), size};
      const absl::Status sent =
          writer != nullptr ? writer->Write(&iov, 1, Later()) : SendAll(fd[0], &iov, 1, Later());
      if (!sent.ok()) std::abort();
    }
  });
  std::vector<double> us;
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(seconds) || us.size() < 5) {
    const absl::Time t0 = absl::Now();
    char request = 'r';
    iovec iov{&request, 1};
    if (!SendAll(fd[1], &iov, 1, Later()).ok()) std::abort();
    const absl::Status got = reader != nullptr ? reader->Read(sink.data(), size, Later())
                                               : ReceiveExact(fd[1], sink.data(), size, Later());
    if (!got.ok()) std::abort();
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  char stop = 's';
  iovec iov{&stop, 1};
  if (!SendAll(fd[1], &iov, 1, Later()).ok()) std::abort();
  answer.join();
  if (sink != source) std::abort();
  std::sort(us.begin(), us.end());
  double total = 0;
  for (double u : us) total += u;
  return {us[us.size() / 2], size * us.size() / (total * 1e-6)};
}

int Main(int argc, char** argv) {
  std::vector<size_t> sizes = {4096, 1 << 20, 16 << 20};
  double seconds = 2;
  std::string only;  // "plain" or "sealed": that one alone (for a profile of one)
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--sizes") {
      sizes.clear();
      for (absl::string_view s : absl::StrSplit(argv[i + 1], ',')) {
        size_t n;
        if (!absl::SimpleAtoi(s, &n) || n == 0) {
          std::fprintf(stderr, "--sizes: \"%s\" is not a byte count\n", std::string(s).c_str());
          return 2;
        }
        sizes.push_back(n);
      }
    } else if (flag == "--only") {
      only = argv[i + 1];
    } else if (flag == "--seconds") {
      if (!absl::SimpleAtod(argv[i + 1], &seconds)) return 2;
    } else {
      std::fprintf(stderr, "unknown flag %s (--sizes N,N --seconds S --only plain|sealed)\n",
                   flag.c_str());
      return 2;
    }
  }
  TlsPair tls;
  int fd[2];
  if (!tls.ok() || !TcpPair(fd)) return 1;
  auto writer = SealedChannel::Create(fd[0], tls.server());
  auto reader = SealedChannel::Create(fd[1], tls.client());
  if (!writer.ok() || !reader.ok()) return 1;
  std::printf("cipher %s, %d helper threads\n",
              std::string(aes_gcm::EngineName(aes_gcm::DefaultEngine())).c_str(),
              SealedChannel::ParallelThreads());
  std::printf("%10s %12s %12s %12s %12s %8s\n", "bytes", "plain p50us", "sealed p50us",
              "plain GB/s", "sealed GB/s", "ratio");
  for (size_t size : sizes) {
    Result plain, sealed;
    if (only != "sealed") plain = Measure(fd, nullptr, nullptr, size, seconds);
    if (only != "plain") sealed = Measure(fd, writer->get(), reader->get(), size, seconds);
    std::printf("%10zu %12.1f %12.1f %12.3f %12.3f %8.2f\n", size, plain.p50_us, sealed.p50_us,
                plain.bytes_per_second / 1e9, sealed.bytes_per_second / 1e9,
                sealed.bytes_per_second / plain.bytes_per_second);
    std::printf("BENCH sealed_roundtrip_%zuB %.3f GB/s ratio=%.2f\n", size,
                sealed.bytes_per_second / 1e9, sealed.bytes_per_second / plain.bytes_per_second);
  }
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) { return pscluster::Main(argc, argv); }
