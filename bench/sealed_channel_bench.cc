// The sealed data plane's cost on its own (common/sealed_channel.h): one loopback TCP
// connection, a reader that asks for N bytes (one byte up) and a writer that answers them,
// plaintext (send/recv of the caller's buffer) and sealed (TLS 1.3 keys, AES-128-GCM chunks),
// one after the other in the same run; the answers come from a second process, with its own
// helper threads, as a ps's pulls do. Prints per size the median round trip and the bytes
// per second of each, sealed / plaintext, and which threads sealed and opened the chunks.
// What the ps's pull costs, without the ps:
//
//   bazel run -c opt //bench:sealed_channel_bench -- --sizes 1048576,16777216 --seconds 2
//   PSCLUSTER_SEAL_CIPHER=openssl PSCLUSTER_SEAL_THREADS=4 bazel-bin/bench/sealed_channel_bench
//   bazel-bin/bench/sealed_channel_bench --cipher 1 --sizes 262144,67108864   (the cipher alone)
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
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

// CPU time of the calling thread and of the whole process, in microseconds.
struct Cpu {
  double thread = 0, process = 0;
  static Cpu Now() {
    const auto us = [](clockid_t clock) {
      timespec t{};
      clock_gettime(clock, &t);
      return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
    };
    return {us(CLOCK_THREAD_CPUTIME_ID), us(CLOCK_PROCESS_CPUTIME_ID)};
  }
};

// Per round trip: the wall time, the calling thread's CPU (the socket calls, and the cipher
// where it seals or opens) and the other threads' (the helpers).
struct Usage {
  double wall = 0, cpu = 0, helpers = 0;
  int64_t trips = 0;
  void Add(absl::Time t0, const Cpu& c0) {
    const Cpu c1 = Cpu::Now();
    wall += absl::ToDoubleMicroseconds(absl::Now() - t0);
    cpu += c1.thread - c0.thread;
    helpers += (c1.process - c0.process) - (c1.thread - c0.thread);
    ++trips;
  }
  std::string Line() const {
    const double n = trips > 0 ? static_cast<double>(trips) : 1;
    char line[160];
    std::snprintf(line, sizeof(line), "%8.1f wall %8.1f cpu %8.1f helpers' cpu (us per trip)",
                  wall / n, cpu / n, helpers / n);
    return line;
  }
};

// A request to the answering process: answer `size` bytes, sealed or not ('q': quit).
struct Request {
  char mode;  // 'p' plaintext, 's' sealed, 'q' quit
  uint64_t size;
};

// The answering process (a ps serving pulls): its own sealed channel, and so its own pool of
// helper threads, as a ps and a worker each have. Prints how its chunks were sealed at the end.
int Answer(int fd, ssl_st* ssl) {
  auto writer = SealedChannel::Create(fd, ssl);
  if (!writer.ok()) return 1;
  std::vector<char> source;
  std::vector<std::pair<std::string, Usage>> usage;  // per mode and size, in order
  Request r;
  while (ReceiveExact(fd, reinterpret_cast<char*>(&r), sizeof(r), Later()).ok() && r.mode != 'q') {
    const std::string key = absl::StrCat(r.mode == 's' ? "sealed " : "plain  ", r.size);
    if (usage.empty() || usage.back().first != key) usage.push_back({key, Usage()});
    const absl::Time t0 = absl::Now();
    const Cpu c0 = Cpu::Now();
    if (source.size() != r.size) {
      source.resize(r.size);
      for (size_t i = 0; i < r.size; ++i) source[i] = static_cast<char>(i * 131);
    }
    iovec iov{source.data(), source.size()};
    const absl::Status sent =
        r.mode == 's' ? (*writer)->Write(&iov, 1, Later()) : SendAll(fd, &iov, 1, Later());
    if (!sent.ok()) return 1;
    usage.back().second.Add(t0, c0);
  }
  for (const auto& [key, u] : usage) {
    std::printf("writer %-16s %s\n", key.c_str(), u.Line().c_str());
  }
  const SealedChannel::WorkSplit split = SealedChannel::Split();
  std::printf("writer: %lld chunks sealed by the writing thread, %lld by helpers\n",
              static_cast<long long>(split.sealed_by_caller),
              static_cast<long long>(split.sealed_by_pool));
  std::fflush(stdout);
  return 0;
}

// Round trips of `size` bytes for about `seconds`, answered by the other process. `reader`
// null: plaintext.
Result Measure(int fd, SealedChannel* reader, size_t size, double seconds, Usage* usage) {
  std::vector<char> expected(size), sink(size);
  for (size_t i = 0; i < size; ++i) expected[i] = static_cast<char>(i * 131);
  std::vector<double> us;
  const absl::Time start = absl::Now();
  while (absl::Now() - start < absl::Seconds(seconds) || us.size() < 5) {
    const absl::Time t0 = absl::Now();
    const Cpu c0 = Cpu::Now();
    Request r{reader != nullptr ? 's' : 'p', size};
    iovec iov{&r, sizeof(r)};
    if (!SendAll(fd, &iov, 1, Later()).ok()) std::abort();
    const absl::Status got = reader != nullptr ? reader->Read(sink.data(), size, Later())
                                               : ReceiveExact(fd, sink.data(), size, Later());
    if (!got.ok()) std::abort();
    usage->Add(t0, c0);
    us.push_back(absl::ToDoubleMicroseconds(absl::Now() - t0));
  }
  if (sink != expected) std::abort();
  std::sort(us.begin(), us.end());
  double total = 0;
  for (double u : us) total += u;
  return {us[us.size() / 2], size * us.size() / (total * 1e-6)};
}

// One thread's cipher alone, each engine this CPU runs, against memcpy over the same bytes:
// chunks of the writer's size sealed from one buffer of `size` bytes into another and opened
// back, GB/s of plaintext. A buffer larger than the caches shows what a pull of that size pays
// in memory traffic besides the cipher.
void MeasureCipher(size_t size, double seconds) {
  const size_t chunk = SealedChannel::WriteChunkBytes();
  std::vector<unsigned char> plain(size, 7), sealed(size), opened(size);
  std::vector<unsigned char> tags((size + chunk - 1) / chunk * aes_gcm::kTagBytes);
  const unsigned char key[aes_gcm::kKeyBytes] = {1};
  const unsigned char nonce[aes_gcm::kNonceBytes] = {2};
  const unsigned char aad[4] = {3};
  const auto rate = [&](const std::function<void()>& pass) {
    pass();  // (pages touched, caches warm)
    int passes = 0;
    const absl::Time start = absl::Now();
    absl::Duration took;
    do {
      pass();
      ++passes;
      took = absl::Now() - start;
    } while (took < absl::Seconds(seconds));
    return static_cast<double>(size) * passes / absl::ToDoubleSeconds(took) / 1e9;
  };
  const double copy = rate([&] { std::memcpy(opened.data(), plain.data(), size); });
  std::printf("cipher alone, %zu bytes in chunks of %zu: memcpy %.2f GB/s\n", size, chunk, copy);
  for (aes_gcm::Engine engine : {aes_gcm::Engine::kIpsecMb, aes_gcm::Engine::kOpenSsl}) {
    if (!aes_gcm::Available(engine)) continue;
    bool ok = true;
    const double seal = rate([&] {
      for (size_t at = 0, i = 0; at < size; at += chunk, ++i) {
        aes_gcm::Piece piece{plain.data() + at, std::min(chunk, size - at)};
        ok &= aes_gcm::Seal(engine, key, nonce, aad, sizeof(aad), &piece, 1, sealed.data() + at,
                            tags.data() + i * aes_gcm::kTagBytes);
      }
    });
    const double open = rate([&] {
      for (size_t at = 0, i = 0; at < size; at += chunk, ++i) {
        ok &= aes_gcm::Open(engine, key, nonce, aad, sizeof(aad), sealed.data() + at,
                            std::min(chunk, size - at), tags.data() + i * aes_gcm::kTagBytes,
                            opened.data() + at);
      }
    });
    if (!ok || opened != plain) std::abort();
    std::printf("  %-20s seal %.2f GB/s, open %.2f GB/s (x memcpy %.2f, %.2f)\n",
                std::string(aes_gcm::EngineName(engine)).c_str(), seal, open, seal / copy,
                open / copy);
  }
  std::fflush(stdout);
}

int Main(int argc, char** argv) {
  std::vector<size_t> sizes = {4096, 1 << 20, 16 << 20};
  double seconds = 2;
  std::string only;  // "plain" or "sealed": that one alone (for a profile of one)
  bool cipher = false;
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
    } else if (flag == "--cipher") {
      cipher = std::string(argv[i + 1]) == "1";
    } else if (flag == "--only") {
      only = argv[i + 1];
    } else if (flag == "--seconds") {
      if (!absl::SimpleAtod(argv[i + 1], &seconds)) return 2;
    } else {
      std::fprintf(stderr,
                   "unknown flag %s (--sizes N,N --seconds S --only plain|sealed --cipher 1)\n",
                   flag.c_str());
      return 2;
    }
  }
  if (cipher) {
    for (size_t size : sizes) MeasureCipher(size, seconds);
    return 0;
  }
  TlsPair tls;
  int fd[2];
  if (!tls.ok() || !TcpPair(fd)) return 1;
  std::fflush(stdout);
  const pid_t answerer = fork();
  if (answerer < 0) return 1;
  if (answerer == 0) {
    close(fd[1]);
    std::fflush(stdout);
    _exit(Answer(fd[0], tls.server()));
  }
  close(fd[0]);
  auto reader = SealedChannel::Create(fd[1], tls.client());
  if (!reader.ok()) return 1;
  std::printf("cipher %s, %d helper threads\n",
              std::string(aes_gcm::EngineName(aes_gcm::DefaultEngine())).c_str(),
              SealedChannel::ParallelThreads());
  std::printf("%10s %12s %12s %12s %12s %8s\n", "bytes", "plain p50us", "sealed p50us",
              "plain GB/s", "sealed GB/s", "ratio");
  for (size_t size : sizes) {
    Result plain, sealed;
    Usage plain_usage, sealed_usage;
    if (only != "sealed") plain = Measure(fd[1], nullptr, size, seconds, &plain_usage);
    const SealedChannel::WorkSplit before = SealedChannel::Split();
    if (only != "plain") sealed = Measure(fd[1], reader->get(), size, seconds, &sealed_usage);
    const SealedChannel::WorkSplit after = SealedChannel::Split();
    std::printf("%10zu %12.1f %12.1f %12.3f %12.3f %8.2f\n", size, plain.p50_us, sealed.p50_us,
                plain.bytes_per_second / 1e9, sealed.bytes_per_second / 1e9,
                sealed.bytes_per_second / plain.bytes_per_second);
    std::printf("BENCH sealed_roundtrip_%zuB %.3f GB/s ratio=%.2f\n", size,
                sealed.bytes_per_second / 1e9, sealed.bytes_per_second / plain.bytes_per_second);
    std::printf("%10s reader: %lld chunks opened by the reading thread, %lld by helpers\n", "",
                static_cast<long long>(after.opened_by_caller - before.opened_by_caller),
                static_cast<long long>(after.opened_by_pool - before.opened_by_pool));
    std::printf("reader plain  %-9zu %s\nreader sealed %-9zu %s\n", size,
                plain_usage.Line().c_str(), size, sealed_usage.Line().c_str());
    std::fflush(stdout);
  }
  Request quit{'q', 0};
  iovec iov{&quit, sizeof(quit)};
  if (!SendAll(fd[1], &iov, 1, Later()).ok()) return 1;
  int status = 0;
  waitpid(answerer, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) { return pscluster::Main(argc, argv); }
