// ps_bench: push and pull throughput and latency of a live cluster's ps tasks, as seen by
// --workers concurrent clients. Each client is a thread with its own ParameterClient and its
// own GrpcPsTransport, whose channels open their own TCP connections (as separate worker
// processes would), so N clients are N connections to every ps task.
//
// It asks the chief for the model (Coordinator.GetModel, wait_until_ready) and measures, for
// every dense variable of the model, whole-variable pushes and pulls, and for every sparse
// table, pushes and pulls of --sparse_keys distinct random keys drawn from a key space of
// --sparse_key_space keys (rows created during the warm-up, so the timed ops update rows and
// do not insert them). Each figure gets a warm-up, then every client repeats the operation
// until --min_seconds have passed and it has done --iterations of them.
//
// Throughput is aggregate payload bytes over the wall time of the measurement, GB/s = 1e9 B/s
// (dense: the variable's float32 bytes; sparse: keys * dim * 4 bytes of rows, keys not
// counted). Latency is per operation, over every operation of every client.
//
// Output: an aligned table, then one line per figure:
//   BENCH <name> <value> <unit> ratio=<value / baseline>
// Baselines: throughput against --loopback_gbps (iperf3 on 127.0.0.1; sparse rates are
// compared as MB/s of rows), latency against the p50 round trip of 4 bytes over a loopback
// TCP connection whose ends run on two different cores (--loopback_rtt_us, measured here when
// 0). `--loopback_rtt_only` measures that baseline (and the one-core and unpinned round
// trips, for reference), prints it and exits.
//
//   ps_bench --chief=127.0.0.1:PORT --workers=2 --tag=2ps2w --loopback_gbps=2.59
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/grpc_ps_transport.h"
#include "client/parameter_client.h"
#include "client/tcp_ps_transport.h"
#include "common/grpc_status.h"
#include "common/hash.h"
#include "common/mutex_checks.h"
#include "common/status_macros.h"
#include "gflags/gflags.h"
#include "glog/logging.h"
#include "grpc/grpc.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/channel_arguments.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "proto/ps_service.grpc.pb.h"
#include "security/tls.h"
#include "security/wire_tls.h"
#include "sharding/placement.h"

DEFINE_string(chief, "", "host:port of the chief, which gives the model and the ps addresses.");
DEFINE_int32(workers, 1, "Concurrent clients (threads), each with its own connections.");
DEFINE_string(tag, "", "Suffix of every figure's name, e.g. 1ps1w. Empty: <num_ps>ps<workers>w.");
DEFINE_double(loopback_gbps, 0,
              "Loopback TCP bandwidth in GB/s (iperf3), the baseline of throughput ratios. "
              "0: no throughput ratios.");
DEFINE_double(loopback_rtt_us, 0,
              "p50 round trip of 4 bytes over loopback TCP between two cores, in microseconds: "
              "the baseline of latency ratios. 0: measured here.");
DEFINE_bool(loopback_rtt_only, false,
            "Measure the loopback round trip (ends on two cores: the baseline; on one core; "
            "unpinned), print it and exit.");
DEFINE_int32(loopback_rtt_round_trips, 10000,
             "Round trips timed in each trial of the loopback baseline.");
DEFINE_int32(loopback_rtt_trials, 3,
             "Trials of the loopback baseline, each on a fresh connection and threads; the "
             "baseline is the median of their p50s.");
DEFINE_double(min_seconds, 1.5, "Each trial of a figure lasts at least this long, in seconds.");
DEFINE_int32(iterations, 5, "Each client does at least this many operations per trial.");
DEFINE_int32(repeats, 3,
             "Trials of each figure, each at least --min_seconds long: throughput is the "
             "median trial's, latency percentiles are over the operations of every trial.");
DEFINE_double(max_seconds, 30,
              "A trial stops after this long even below --iterations, in seconds.");
DEFINE_double(warmup_seconds, 0.3,
              "Untimed operations before each figure, in seconds (at least one; later trials "
              "of the figure warm up with one operation).");
DEFINE_int64(chunk_bytes, 1 << 20,
             "Chunk size of streamed dense pushes and pulls (GrpcPsTransportOptions), bytes.");
DEFINE_int64(sparse_keys, 100000, "Distinct keys per sparse push or pull.");
DEFINE_int64(sparse_key_space, 1000000,
             "Sparse keys are drawn from this many keys, all created during the warm-up.");
DEFINE_bool(separate_connections, true,
            "Give each client its own TCP connections (a local subchannel pool). false: the "
            "clients' channels share one connection per ps task, as gRPC does by default.");
DEFINE_string(channel_args, "",
              "Extra integer gRPC channel arguments of the clients' channels, e.g. "
              "grpc.http2.lookahead_bytes=4194304,grpc.http2.write_buffer_size=1048576 "
              "(with --separate_connections).");
DEFINE_string(transport, "tensor_wire",
              "How the clients pull and push: tensor_wire (the ps tasks' TCP data plane) or "
              "grpc.");
DEFINE_string(ps_pids, "",
              "Comma-separated process ids of the ps tasks (bench/ps.sh passes them), for the "
              "server CPU seconds per GB moved; empty: client CPU only.");
DEFINE_string(only, "",
              "Comma-separated variables and tables to measure (e.g. d_64MiB,emb). Empty: all.");
DEFINE_double(model_timeout_seconds, 120, "How long to wait for the chief's model, in seconds.");
DEFINE_int32(replication, 1,
             "2: before measuring, give every dense partition a backup on another ps task "
             "(issue 37: the chief's placement with replication 2, created as a chief that runs "
             "it would) so that each push is forwarded to its backup before it is answered. "
             "With --tls_dir, the backups are created with chief-0's certificate there.");
DEFINE_string(tls_dir, "",
              "Mutual TLS on both planes, as a deployed cluster runs: a deploy/tls/make_certs.sh "
              "folder; client w uses worker-w's certificate (ca.pem, worker-<w>.pem and .key), "
              "the model is fetched with worker-0's. Empty: plaintext.");
DEFINE_bool(kernel_tls, false,
            "With --tls_dir: ask for kernel TLS (kTLS) on the data plane's connections.");

namespace {

// Task `holder`'s TLS files in --tls_dir ("worker-0", "chief-0"; plaintext without it).
pscluster::TlsConfig TlsOf(const std::string& holder) {
  pscluster::TlsConfig tls;
  if (FLAGS_tls_dir.empty()) return tls;
  tls.ca_file = FLAGS_tls_dir + "/ca.pem";
  tls.cert_file = absl::StrCat(FLAGS_tls_dir, "/", holder, ".pem");
  tls.key_file = absl::StrCat(FLAGS_tls_dir, "/", holder, ".key");
  return tls;
}

// Worker `w`'s TLS files in --tls_dir (plaintext without it).
pscluster::TlsConfig WorkerTls(int w) { return TlsOf(absl::StrCat("worker-", w)); }

}  // namespace

namespace pscluster {
namespace {

using SteadyClock = std::chrono::steady_clock;

double SecondsSince(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// CPU seconds (user + system) this process has used, every thread.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// CPU seconds of other processes, from /proc/PID/stat (utime + stime); 0 for one that is gone.
double PidsCpuSeconds(const std::vector<int>& pids) {
  double total = 0;
  for (int pid : pids) {
    std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
    std::string stat((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    // Fields after the command's closing parenthesis; utime and stime are the 12th and 13th.
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::vector<std::string> fields = absl::StrSplit(stat.substr(close + 2), ' ');
    double utime = 0, stime = 0;
    if (fields.size() > 12 && absl::SimpleAtod(fields[11], &utime) &&
        absl::SimpleAtod(fields[12], &stime)) {
      total += (utime + stime) / sysconf(_SC_CLK_TCK);
    }
  }
  return total;
}

// When a measurement stops.
struct RunLimits {
  double warmup_seconds = 0.3;
  double min_seconds = 1.5;
  double max_seconds = 30;
  int64_t min_ops = 5;  // per client
  int repeats = 3;
};

// One operation measured over every client.
struct Measurement {
  // Operations of every client, and the time from the common start to the end of the last
  // client's last operation (for repeated trials: those of the median trial).
  int64_t ops = 0;
  double seconds = 0;
  // Every trial's operations per second, sorted.
  std::vector<double> trial_rates;
  // Every operation of every client, in microseconds, sorted.
  std::vector<double> latencies_us;

  // Nearest-rank percentile, p in (0, 100].
  double PercentileUs(double p) const {
    if (latencies_us.empty()) return 0;
    const size_t rank = static_cast<size_t>(std::ceil(p / 100 * latencies_us.size()));
    return latencies_us[std::clamp<size_t>(rank, 1, latencies_us.size()) - 1];
  }
};

// One operation of client `worker`.
using Operation = std::function<absl::Status(int worker)>;

// Runs `op` on `workers` threads at once: each warms up on its own, then all start together
// and repeat `op` until `limits` say stop. Returns the first error of any client.
absl::StatusOr<Measurement> MeasureConcurrently(int workers, const RunLimits& limits,
                                                const Operation& op) {
  std::vector<absl::Status> results(workers);
  std::vector<std::vector<double>> latencies(workers);
  std::vector<SteadyClock::time_point> ends(workers);
  absl::BlockingCounter warmed_up(workers);
  absl::Notification go;
  SteadyClock::time_point start;  // written before go.Notify(), read after it
  std::vector<std::thread> threads;
  for (int w = 0; w < workers; ++w) {
    threads.emplace_back([&, w] {
      const SteadyClock::time_point warmup_start = SteadyClock::now();
      absl::Status s;
      do {
        s = op(w);
      } while (s.ok() && SecondsSince(warmup_start) < limits.warmup_seconds);
      warmed_up.DecrementCount();
      go.WaitForNotification();
      for (int64_t n = 0; s.ok(); ++n) {
        const double elapsed = SecondsSince(start);
        if ((n >= limits.min_ops && elapsed >= limits.min_seconds) ||
            (n > 0 && elapsed >= limits.max_seconds)) {
          break;
        }
        const SteadyClock::time_point t0 = SteadyClock::now();
        s = op(w);
        latencies[w].push_back(
            std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
      }
      results[w] = s;
      ends[w] = SteadyClock::now();
    });
  }
  warmed_up.Wait();
  start = SteadyClock::now();
  go.Notify();
  for (std::thread& t : threads) t.join();
  for (int w = 0; w < workers; ++w) {
    if (!results[w].ok()) {
      return absl::Status(results[w].code(),
                          absl::StrCat("client ", w, ": ", results[w].message()));
    }
  }
  Measurement m;
  for (int w = 0; w < workers; ++w) {
    m.seconds = std::max(m.seconds, std::chrono::duration<double>(ends[w] - start).count());
    m.latencies_us.insert(m.latencies_us.end(), latencies[w].begin(), latencies[w].end());
  }
  m.ops = static_cast<int64_t>(m.latencies_us.size());
  std::sort(m.latencies_us.begin(), m.latencies_us.end());
  return m;
}

// MeasureConcurrently, limits.repeats times (only the first with the full warm-up). The
// result's ops and seconds are those of the trial with the median rate; its latencies are
// those of every trial.
absl::StatusOr<Measurement> MeasureRepeated(int workers, const RunLimits& limits,
                                            const Operation& op) {
  std::vector<Measurement> trials;
  RunLimits trial_limits = limits;
  for (int t = 0; t < std::max(1, limits.repeats); ++t) {
    PS_ASSIGN_OR_RETURN(Measurement m, MeasureConcurrently(workers, trial_limits, op));
    trials.push_back(std::move(m));
    trial_limits.warmup_seconds = 0;
  }
  auto rate = [](const Measurement& m) { return m.ops / m.seconds; };
  std::vector<const Measurement*> by_rate;
  for (const Measurement& m : trials) by_rate.push_back(&m);
  std::sort(by_rate.begin(), by_rate.end(),
            [&](const Measurement* a, const Measurement* b) { return rate(*a) < rate(*b); });
  Measurement out;
  out.ops = by_rate[(by_rate.size() - 1) / 2]->ops;
  out.seconds = by_rate[(by_rate.size() - 1) / 2]->seconds;
  for (const Measurement* m : by_rate) {
    out.trial_rates.push_back(rate(*m));
    out.latencies_us.insert(out.latencies_us.end(), m->latencies_us.begin(), m->latencies_us.end());
  }
  std::sort(out.latencies_us.begin(), out.latencies_us.end());
  return out;
}

absl::Status ErrnoError(const std::string& what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

bool ReadFull(int fd, char* buf, size_t n) {
  while (n > 0) {
    const ssize_t got = read(fd, buf, n);
    if (got <= 0) {
      if (got < 0 && errno == EINTR) continue;
      return false;
    }
    buf += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

bool WriteFull(int fd, const char* buf, size_t n) {
  while (n > 0) {
    const ssize_t put = write(fd, buf, n);
    if (put <= 0) {
      if (put < 0 && errno == EINTR) continue;
      return false;
    }
    buf += put;
    n -= static_cast<size_t>(put);
  }
  return true;
}

// Closes a file descriptor when it goes out of scope.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  int get() const { return fd_; }

 private:
  const int fd_;
};

// Pins the calling thread to `cpu`; no-op when cpu < 0.
void PinToCpu(int cpu) {
  if (cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Round trips of 4 bytes over a TCP connection on 127.0.0.1 (TCP_NODELAY, an echo thread on
// the other end), in microseconds, sorted: the floor under any RPC's latency on this machine.
// The sending end runs on `client_cpu`, the echo on `echo_cpu` (-1: wherever the scheduler
// puts them).
absl::StatusOr<Measurement> MeasureLoopbackRoundTrips(int round_trips, int client_cpu,
                                                      int echo_cpu) {
  ScopedFd listener(socket(AF_INET, SOCK_STREAM, 0));
  if (listener.get() < 0) return ErrnoError("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return ErrnoError("bind 127.0.0.1:0");
  }
  if (listen(listener.get(), 1) != 0) return ErrnoError("listen");
  if (getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return ErrnoError("getsockname");
  }
  const int one = 1;
  std::thread echo([&listener, one, echo_cpu] {
    PinToCpu(echo_cpu);
    ScopedFd conn(accept(listener.get(), nullptr, nullptr));
    if (conn.get() < 0) return;
    setsockopt(conn.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    char buf[4];
    while (ReadFull(conn.get(), buf, sizeof(buf)) && WriteFull(conn.get(), buf, sizeof(buf))) {
    }
  });
  Measurement m;
  absl::Status status;
  // The measuring thread, so that pinning it leaves the caller's affinity alone.
  std::thread client([&] {
    PinToCpu(client_cpu);
    ScopedFd conn(socket(AF_INET, SOCK_STREAM, 0));
    if (conn.get() < 0 ||
        connect(conn.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      status = ErrnoError(absl::StrCat("connect 127.0.0.1:", ntohs(addr.sin_port)));
      // Unblocks the echo thread's accept.
      shutdown(listener.get(), SHUT_RDWR);
    } else {
      setsockopt(conn.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      char buf[4] = {1, 2, 3, 4};
      const int warmup = std::max(100, round_trips / 10);
      for (int i = 0; i < warmup + round_trips && status.ok(); ++i) {
        const SteadyClock::time_point t0 = SteadyClock::now();
        if (!WriteFull(conn.get(), buf, sizeof(buf)) || !ReadFull(conn.get(), buf, sizeof(buf))) {
          status = ErrnoError("loopback echo");
          break;
        }
        if (i >= warmup) {
          m.latencies_us.push_back(
              std::chrono::duration<double, std::micro>(SteadyClock::now() - t0).count());
        }
      }
    }
  });  // closing the connection ends the echo thread
  client.join();
  echo.join();
  PS_RETURN_IF_ERROR(status);
  m.ops = static_cast<int64_t>(m.latencies_us.size());
  m.seconds = std::accumulate(m.latencies_us.begin(), m.latencies_us.end(), 0.0) / 1e6;
  std::sort(m.latencies_us.begin(), m.latencies_us.end());
  return m;
}

absl::StatusOr<v1::GetModelResponse> FetchModel(const std::string& chief, absl::Duration timeout) {
  std::unique_ptr<v1::Coordinator::Stub> stub =
      v1::Coordinator::NewStub(grpc::CreateChannel(chief, ChannelCredentialsFor(WorkerTls(0))));
  v1::GetModelRequest req;
  req.set_wait_until_ready(true);
  v1::GetModelResponse resp;
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(true);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  absl::Status s = FromGrpcStatus(stub->GetModel(&ctx, req, &resp));
  if (!s.ok()) {
    return absl::Status(s.code(),
                        absl::StrCat("GetModel from the chief at ", chief, ": ", s.message()));
  }
  if (resp.ps_addresses_size() != resp.placement().num_ps()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the chief at ", chief, " gave ", resp.ps_addresses_size(),
                     " ps addresses for a placement on ", resp.placement().num_ps(), " ps tasks"));
  }
  return resp;
}

// A client of its own, as one worker process would have.
// "a=1,b=2" -> {{"a", 1}, {"b", 2}}; INVALID_ARGUMENT naming the bad entry.
absl::StatusOr<std::vector<std::pair<std::string, int>>> ParseChannelArgs(const std::string& text) {
  std::vector<std::pair<std::string, int>> args;
  for (absl::string_view entry : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(entry, absl::MaxSplits('=', 1));
    int value = 0;
    if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--channel_args entry \"", entry, "\" is not NAME=INTEGER"));
    }
    args.emplace_back(kv.first, value);
  }
  return args;
}

absl::StatusOr<std::unique_ptr<ParameterClient>> ConnectClient(
    const v1::GetModelResponse& model, int worker, const GrpcPsTransportOptions& options,
    bool separate_connections, const std::vector<std::pair<std::string, int>>& channel_args) {
  std::vector<std::string> addresses(model.ps_addresses().begin(), model.ps_addresses().end());
  std::unique_ptr<GrpcPsTransport> transport;
  if (separate_connections) {
    // gRPC shares one connection among channels with the same target and arguments; a local
    // subchannel pool gives this client connections of its own.
    std::vector<std::unique_ptr<v1::ParameterServer::StubInterface>> stubs;
    for (const std::string& address : addresses) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(options.max_message_bytes);
      args.SetMaxSendMessageSize(options.max_message_bytes);
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      for (const auto& [name, value] : channel_args) args.SetInt(name, value);
      stubs.push_back(v1::ParameterServer::NewStub(
          grpc::CreateCustomChannel(address, ChannelCredentialsFor(WorkerTls(worker)), args)));
    }
    transport = std::make_unique<GrpcPsTransport>(std::move(stubs), options);
  } else {
    GrpcPsTransportOptions with_tls = options;
    with_tls.tls = WorkerTls(worker);
    transport = std::make_unique<GrpcPsTransport>(addresses, with_tls);
  }
  ParameterClientOptions client_options;
  client_options.worker = worker;
  // A retried call would hide a failure inside a latency figure.
  client_options.max_attempts = 1;
  if (FLAGS_transport == "tensor_wire") {
    TcpPsTransportOptions tcp;
    if (!FLAGS_tls_dir.empty()) {
      PS_ASSIGN_OR_RETURN(tcp.tls,
                          WireTlsContext::Create(WorkerTls(worker), WireTlsContext::Side::kClient,
                                                 FLAGS_kernel_tls));
    }
    auto tcp_transport = std::make_unique<TcpPsTransport>(std::move(transport), addresses, tcp);
    if (worker == 0) {
      LOG(INFO) << "dense pulls in up to " << tcp_transport->pull_stripes()
                << " stripes (PSCLUSTER_PULL_STRIPES) of at least "
                << tcp_transport->pull_stripe_bytes()
                << " bytes (PSCLUSTER_PULL_STRIPE_BYTES; docs/wire.md)";
    }
    return ParameterClient::Create(model.model(), model.placement(), std::move(tcp_transport),
                                   client_options);
  }
  return ParameterClient::Create(model.model(), model.placement(), std::move(transport),
                                 client_options);
}

// A figure as printed on a BENCH line. ratio = value / baseline; no ratio when baseline <= 0.
struct Figure {
  std::string name;
  double value = 0;
  std::string unit;
  double baseline = 0;
};

// Three significant digits, without exponents for the usual magnitudes.
std::string FormatValue(double v) {
  const double a = std::fabs(v);
  if (a >= 100) return absl::StrFormat("%.0f", v);
  if (a >= 10) return absl::StrFormat("%.1f", v);
  if (a >= 1) return absl::StrFormat("%.2f", v);
  if (a >= 0.01 || a == 0) return absl::StrFormat("%.3f", v);
  return absl::StrFormat("%.3g", v);
}

std::string FormatRatio(const Figure& f) {
  return f.baseline > 0 ? FormatValue(f.value / f.baseline) : "n/a";
}

// One row of the table: an operation on one variable or table.
struct Row {
  std::string kind;  // dense or sparse
  std::string op;    // push or pull
  std::string size;  // 64MiB, 100kx8
  int64_t ops = 0;   // timed, over every trial
  Figure throughput;
  // The slowest and fastest trial's throughput, in throughput.unit.
  double slowest = 0;
  double fastest = 0;
  Figure payload;  // sparse only: Mkeys/s
  Figure p50;
  Figure p99;
  // CPU seconds per GB of payload moved, over every operation measured (warm-ups included):
  // the clients' (this process) and the ps tasks' (-1: not measured).
  double client_cpu_s_per_gb = 0;
  double ps_cpu_s_per_gb = -1;
};

std::string Name(const std::string& kind, const std::string& op, const std::string& size,
                 const std::string& metric, const std::string& tag) {
  std::string name = absl::StrCat(kind, "_", op, "_", size);
  if (!metric.empty()) absl::StrAppend(&name, "_", metric);
  if (!tag.empty()) absl::StrAppend(&name, "_", tag);
  return name;
}

// What the benchmark compares against.
struct Baselines {
  double loopback_gbps = 0;
  double loopback_rtt_us = 0;
};

// Latency figures of a row.
void FillLatency(const Measurement& m, const std::string& kind, const std::string& op,
                 const std::string& size, const std::string& tag, const Baselines& base, Row* row) {
  row->ops = static_cast<int64_t>(m.latencies_us.size());
  row->p50 = {Name(kind, op, size, "p50", tag), m.PercentileUs(50), "us", base.loopback_rtt_us};
  row->p99 = {Name(kind, op, size, "p99", tag), m.PercentileUs(99), "us", base.loopback_rtt_us};
}

// "d_64MiB" -> "64MiB"; other names stay as they are.
std::string SizeLabel(const std::string& variable) {
  return variable.rfind("d_", 0) == 0 ? variable.substr(2) : variable;
}

// 100000 -> "100k", 1000000 -> "1M", 1234 -> "1234".
std::string CountLabel(int64_t n) {
  if (n >= 1000000 && n % 1000000 == 0) return absl::StrCat(n / 1000000, "M");
  if (n >= 1000 && n % 1000 == 0) return absl::StrCat(n / 1000, "k");
  return absl::StrCat(n);
}

// The measurements of one run: the clients and the figures gathered so far. Each Dense or
// Sparse call runs the clients concurrently and returns when its figures are in rows().
// Not thread-safe: one call at a time.
class PsBench {
 public:
  PsBench(std::vector<std::unique_ptr<ParameterClient>> clients, const RunLimits& limits,
          const Baselines& base, std::string tag, std::vector<int> ps_pids)
      : clients_(std::move(clients)),
        limits_(limits),
        base_(base),
        tag_(std::move(tag)),
        ps_pids_(std::move(ps_pids)) {}

  const std::vector<Row>& rows() const { return rows_; }
  int workers() const { return static_cast<int>(clients_.size()); }

  // Whole-variable pushes, then pulls, of a dense variable.
  absl::Status Dense(const std::string& variable) {
    PS_ASSIGN_OR_RETURN(const int64_t elements, clients_[0]->NumElements(variable));
    const std::vector<std::string> vars = {variable};
    const std::string size = SizeLabel(variable);
    const double bytes = static_cast<double>(elements) * sizeof(float);
    // Small gradients, so that values stay finite however long the run.
    std::vector<std::vector<float>> grads(workers(), std::vector<float>(elements, 1e-6f));
    std::vector<std::vector<std::vector<float>>> pulled(workers());

    std::fprintf(stderr, "ps_bench %s: dense push %s\n", tag_.c_str(), variable.c_str());
    Row push_row;
    PS_ASSIGN_OR_RETURN(
        Measurement push,
        Measure([&](int w) { return clients_[w]->Push(vars, {grads[w].data()}, /*step=*/0); },
                bytes, &push_row));
    AddDenseRow("push", size, bytes, push, push_row);
    std::fprintf(stderr, "ps_bench %s: dense pull %s\n", tag_.c_str(), variable.c_str());
    Row pull_row;
    PS_ASSIGN_OR_RETURN(
        Measurement pull,
        Measure([&](int w) { return clients_[w]->Pull(vars, &pulled[w]); }, bytes, &pull_row));
    AddDenseRow("pull", size, bytes, pull, pull_row);
    return absl::OkStatus();
  }

  // Pushes, then pulls, of `keys` distinct random keys of a table, out of `key_space` keys
  // that all exist before the clock starts.
  // A vocabulary table's keys are its ids 0 .. key_space - 1; a hashed table's are random.
  absl::Status Sparse(const std::string& table, int64_t dim, int64_t vocabulary_size, int64_t keys,
                      int64_t key_space, bool name_table) {
    if (keys > key_space) {
      return absl::InvalidArgumentError(
          absl::StrCat("--sparse_keys (", keys, ") exceeds --sparse_key_space (", key_space, ")"));
    }
    if (vocabulary_size > 0 && key_space > vocabulary_size) {
      return absl::InvalidArgumentError(absl::StrCat("--sparse_key_space (", key_space,
                                                     ") exceeds the table's vocabulary_size (",
                                                     vocabulary_size, ")"));
    }
    const std::string size =
        absl::StrCat(name_table ? table + "_" : "", CountLabel(keys), "x", dim);
    std::vector<int64_t> universe(key_space);
    for (int64_t i = 0; i < key_space; ++i) {
      universe[i] = vocabulary_size > 0 ? i : static_cast<int64_t>(SplitMix64(i) >> 1);
    }
    std::fprintf(stderr, "ps_bench %s: creating %lld rows of %s\n", tag_.c_str(),
                 static_cast<long long>(key_space), table.c_str());
    {
      // Zero gradients, pushed twice: rows are created by pushes in tables with admission or
      // eviction (and admitted at a second push at most, as bench/ps.sh configures them).
      std::vector<float> zeros(keys * dim, 0.0f);
      for (int round = 0; round < 2; ++round) {
        for (int64_t begin = 0; begin < key_space; begin += keys) {
          const int64_t n = std::min(keys, key_space - begin);
          PS_RETURN_IF_ERROR(
              clients_[0]->PushRows(table, universe.data() + begin, n, zeros.data(), /*step=*/0));
        }
      }
    }
    // A few key sets per client, drawn up front so that the timed loop only sends them.
    constexpr int kKeySets = 4;
    std::vector<std::vector<std::vector<int64_t>>> key_sets(workers());
    for (int w = 0; w < workers(); ++w) {
      std::mt19937_64 rng(1234 + w);
      std::vector<int64_t> pool = universe;
      for (int k = 0; k < kKeySets; ++k) {
        // A partial Fisher-Yates shuffle: the first `keys` entries are a uniform sample.
        for (int64_t i = 0; i < keys; ++i) {
          std::uniform_int_distribution<int64_t> pick(i, key_space - 1);
          std::swap(pool[i], pool[pick(rng)]);
        }
        key_sets[w].emplace_back(pool.begin(), pool.begin() + keys);
      }
    }
    std::vector<std::vector<float>> buffers(workers(), std::vector<float>(keys * dim, 1e-3f));
    std::vector<int64_t> next(workers(), 0);
    const double row_bytes = static_cast<double>(dim) * sizeof(float);

    std::fprintf(stderr, "ps_bench %s: sparse push %s\n", tag_.c_str(), size.c_str());
    const double op_bytes = row_bytes * static_cast<double>(keys);
    Row push_row;
    PS_ASSIGN_OR_RETURN(Measurement push,
                        Measure(
                            [&](int w) {
                              const std::vector<int64_t>& k = key_sets[w][next[w]++ % kKeySets];
                              return clients_[w]->PushRows(table, k.data(), keys, buffers[w].data(),
                                                           /*step=*/0);
                            },
                            op_bytes, &push_row));
    AddSparseRow("push", size, keys, row_bytes, push, push_row);
    std::fprintf(stderr, "ps_bench %s: sparse pull %s\n", tag_.c_str(), size.c_str());
    Row pull_row;
    PS_ASSIGN_OR_RETURN(Measurement pull, Measure(
                                              [&](int w) {
                                                const std::vector<int64_t>& k =
                                                    key_sets[w][next[w]++ % kKeySets];
                                                return clients_[w]->PullRows(table, k.data(), keys,
                                                                             buffers[w].data());
                                              },
                                              op_bytes, &pull_row));
    AddSparseRow("pull", size, keys, row_bytes, pull, pull_row);
    return absl::OkStatus();
  }

 private:
  void AddDenseRow(const std::string& op, const std::string& size, double bytes,
                   const Measurement& m, Row row) {
    row.kind = "dense";
    row.op = op;
    row.size = size;
    row.throughput = {Name("dense", op, size, "", tag_), bytes * m.ops / m.seconds / 1e9, "GB/s",
                      base_.loopback_gbps};
    row.slowest = bytes * m.trial_rates.front() / 1e9;
    row.fastest = bytes * m.trial_rates.back() / 1e9;
    FillLatency(m, "dense", op, size, tag_, base_, &row);
    rows_.push_back(row);
  }

  void AddSparseRow(const std::string& op, const std::string& size, int64_t keys, double row_bytes,
                    const Measurement& m, Row row) {
    row.kind = "sparse";
    row.op = op;
    row.size = size;
    const double keys_per_second = static_cast<double>(keys) * m.ops / m.seconds;
    const double loopback_mbps = base_.loopback_gbps * 1000;
    // The main sparse figure is MB/s of rows against loopback MB/s; keys/s beside it.
    row.throughput = {Name("sparse", op, size, "", tag_), keys_per_second * row_bytes / 1e6, "MB/s",
                      loopback_mbps};
    row.payload = {Name("sparse", op, size, "keys", tag_), keys_per_second / 1e6, "Mkeys/s", 0};
    row.slowest = static_cast<double>(keys) * row_bytes * m.trial_rates.front() / 1e6;
    row.fastest = static_cast<double>(keys) * row_bytes * m.trial_rates.back() / 1e6;
    FillLatency(m, "sparse", op, size, tag_, base_, &row);
    rows_.push_back(row);
  }

  // MeasureRepeated, counting every operation and the CPU the clients and the ps tasks used
  // meanwhile; `bytes` is one operation's payload.
  absl::StatusOr<Measurement> Measure(const Operation& op, double bytes, Row* row) {
    std::atomic<int64_t> done{0};
    const double client0 = ProcessCpuSeconds(), ps0 = PidsCpuSeconds(ps_pids_);
    PS_ASSIGN_OR_RETURN(Measurement m, MeasureRepeated(workers(), limits_, [&](int w) {
                          absl::Status s = op(w);
                          done.fetch_add(1, std::memory_order_relaxed);
                          return s;
                        }));
    const double gb = bytes * static_cast<double>(done.load()) / 1e9;
    if (gb > 0) {
      row->client_cpu_s_per_gb = (ProcessCpuSeconds() - client0) / gb;
      if (!ps_pids_.empty()) row->ps_cpu_s_per_gb = (PidsCpuSeconds(ps_pids_) - ps0) / gb;
    }
    return m;
  }

  const std::vector<std::unique_ptr<ParameterClient>> clients_;
  const RunLimits limits_;
  const Baselines base_;
  const std::string tag_;
  const std::vector<int> ps_pids_;
  std::vector<Row> rows_;
};

// Columns padded to their widest cell; the first three left-aligned, the rest right-aligned.
std::string AlignedTable(const std::vector<std::vector<std::string>>& cells) {
  std::vector<size_t> widths;
  for (const auto& row : cells) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : cells) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(widths[c] - row[c].size(), ' ');
      absl::StrAppend(&line, c == 0 ? "" : "  ", c < 3 ? row[c] + pad : pad + row[c]);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

void PrintResults(const std::vector<Row>& rows, const Baselines& base, const std::string& tag) {
  std::vector<std::vector<std::string>> cells = {
      {"op", "kind", "size", "ops", "throughput", "trials min-max", "x loopback", "p50 us",
       "p99 us", "p50 x rtt", "client CPU s/GB", "ps CPU s/GB"}};
  for (const Row& r : rows) {
    std::string throughput = absl::StrCat(FormatValue(r.throughput.value), " ", r.throughput.unit);
    if (!r.payload.name.empty()) {
      absl::StrAppend(&throughput, " (", FormatValue(r.payload.value), " ", r.payload.unit, ")");
    }
    cells.push_back({r.op, r.kind, r.size, absl::StrCat(r.ops), throughput,
                     absl::StrCat(FormatValue(r.slowest), "..", FormatValue(r.fastest)),
                     FormatRatio(r.throughput), FormatValue(r.p50.value), FormatValue(r.p99.value),
                     FormatRatio(r.p50), FormatValue(r.client_cpu_s_per_gb),
                     r.ps_cpu_s_per_gb < 0 ? "-" : FormatValue(r.ps_cpu_s_per_gb)});
  }
  std::printf("\n%s: loopback %s GB/s (iperf3), loopback TCP round trip p50 %s us\n", tag.c_str(),
              base.loopback_gbps > 0 ? FormatValue(base.loopback_gbps).c_str() : "?",
              FormatValue(base.loopback_rtt_us).c_str());
  std::printf("%s\n", AlignedTable(cells).c_str());
  for (const Row& r : rows) {
    for (const Figure* f : {&r.throughput, &r.payload, &r.p50, &r.p99}) {
      if (f->name.empty()) continue;
      std::printf("BENCH %s %s %s ratio=%s\n", f->name.c_str(), FormatValue(f->value).c_str(),
                  f->unit.c_str(), FormatRatio(*f).c_str());
    }
    // CPU per GB moved has no baseline of its own.
    const std::string cpu = Name(r.kind, r.op, r.size, "cpu", tag);
    std::printf("BENCH %s_client %s s/GB ratio=n/a\n", cpu.c_str(),
                FormatValue(r.client_cpu_s_per_gb).c_str());
    if (r.ps_cpu_s_per_gb >= 0) {
      std::printf("BENCH %s_ps %s s/GB ratio=n/a\n", cpu.c_str(),
                  FormatValue(r.ps_cpu_s_per_gb).c_str());
    }
  }
  std::fflush(stdout);
}

// Which ps tasks hold each dense variable, e.g. "d_64MiB: 8 partitions on ps 0,1".
void PrintPlacement(const v1::GetModelResponse& model) {
  std::map<std::string, std::pair<int, std::set<int>>> parts;
  for (const v1::DensePartition& p : model.placement().partitions()) {
    parts[p.variable()].first++;
    parts[p.variable()].second.insert(p.ps_task());
  }
  for (const v1::VariableSpec& v : model.model().variables()) {
    const auto& [count, tasks] = parts[v.name()];
    std::printf("placement: %s: %d partition%s on ps %s\n", v.name().c_str(), count,
                count == 1 ? "" : "s", absl::StrJoin(tasks, ",").c_str());
  }
}

int Fail(const std::string& message, int code) {
  std::fprintf(stderr, "ps_bench: %s\n", message.c_str());
  return code;
}

// The loopback round trip, p50 and p99 in microseconds, each the median over `trials` trials.
absl::StatusOr<std::pair<double, double>> LoopbackRoundTrip(int trials, int round_trips,
                                                            int client_cpu, int echo_cpu) {
  std::vector<double> p50s;
  std::vector<double> p99s;
  for (int t = 0; t < trials; ++t) {
    PS_ASSIGN_OR_RETURN(Measurement m,
                        MeasureLoopbackRoundTrips(round_trips, client_cpu, echo_cpu));
    p50s.push_back(m.PercentileUs(50));
    p99s.push_back(m.PercentileUs(99));
  }
  std::sort(p50s.begin(), p50s.end());
  std::sort(p99s.begin(), p99s.end());
  return std::make_pair(p50s[(trials - 1) / 2], p99s[(trials - 1) / 2]);
}

// The latency baseline: the two ends of the connection pinned to two different cores, as a
// client and a ps task that run at the same time are (unpinned, the scheduler sometimes puts
// both on one core, and on a VM whose idle cores halt the two placements differ by an order of
// magnitude). With `print`, also prints the one-core and the unpinned figures as BENCH lines.
absl::StatusOr<double> LoopbackRoundTripBaseline(int trials, int round_trips, bool print) {
  const bool two_cores = std::thread::hardware_concurrency() >= 2;
  PS_ASSIGN_OR_RETURN(
      auto cross, LoopbackRoundTrip(trials, round_trips, two_cores ? 0 : -1, two_cores ? 1 : -1));
  if (!print) return cross.first;
  const double base = cross.first;
  auto line = [base](const std::string& name, double us) {
    std::printf("BENCH %s %s us ratio=%s\n", name.c_str(), FormatValue(us).c_str(),
                FormatValue(us / base).c_str());
  };
  line("loopback_rtt_4B_p50", cross.first);
  line("loopback_rtt_4B_p99", cross.second);
  PS_ASSIGN_OR_RETURN(auto same, LoopbackRoundTrip(trials, round_trips, 0, 0));
  line("loopback_rtt_4B_onecore_p50", same.first);
  line("loopback_rtt_4B_onecore_p99", same.second);
  PS_ASSIGN_OR_RETURN(auto free, LoopbackRoundTrip(trials, round_trips, -1, -1));
  line("loopback_rtt_4B_unpinned_p50", free.first);
  line("loopback_rtt_4B_unpinned_p99", free.second);
  return base;
}

int Main() {
  if (FLAGS_loopback_rtt_round_trips < 1 || FLAGS_loopback_rtt_trials < 1) {
    return Fail("--loopback_rtt_round_trips and --loopback_rtt_trials must be at least 1", 2);
  }
  Baselines base;
  base.loopback_gbps = FLAGS_loopback_gbps;
  base.loopback_rtt_us = FLAGS_loopback_rtt_us;
  if (FLAGS_loopback_rtt_only || base.loopback_rtt_us <= 0) {
    absl::StatusOr<double> rtt = LoopbackRoundTripBaseline(
        FLAGS_loopback_rtt_trials, FLAGS_loopback_rtt_round_trips, FLAGS_loopback_rtt_only);
    if (!rtt.ok()) return Fail(absl::StrCat("loopback round trip: ", rtt.status().message()), 1);
    if (FLAGS_loopback_rtt_only) return 0;
    base.loopback_rtt_us = *rtt;
  }
  if (FLAGS_chief.empty()) return Fail("--chief=HOST:PORT is required", 2);
  if (FLAGS_workers < 1)
    return Fail(absl::StrCat("--workers must be >= 1, got ", FLAGS_workers), 2);
  if (FLAGS_transport != "tensor_wire" && FLAGS_transport != "grpc") {
    return Fail(absl::StrCat("--transport must be tensor_wire or grpc, not ", FLAGS_transport), 2);
  }
  if (FLAGS_chunk_bytes < 4) {
    return Fail(absl::StrCat("--chunk_bytes must be >= 4, got ", FLAGS_chunk_bytes), 2);
  }
  if (FLAGS_sparse_keys < 1 || FLAGS_sparse_key_space < FLAGS_sparse_keys) {
    return Fail("need 1 <= --sparse_keys <= --sparse_key_space", 2);
  }
  RunLimits limits;
  limits.warmup_seconds = FLAGS_warmup_seconds;
  limits.min_seconds = FLAGS_min_seconds;
  limits.max_seconds = FLAGS_max_seconds;
  limits.min_ops = FLAGS_iterations;
  limits.repeats = FLAGS_repeats;
  if (limits.repeats < 1)
    return Fail(absl::StrCat("--repeats must be >= 1, got ", FLAGS_repeats), 2);

  absl::StatusOr<v1::GetModelResponse> model =
      FetchModel(FLAGS_chief, absl::Seconds(FLAGS_model_timeout_seconds));
  if (!model.ok()) return Fail(std::string(model.status().message()), 1);
  if (FLAGS_replication >= 2) {
    v1::PlacementOptions options = model->placement().options();
    options.set_replication(FLAGS_replication);
    absl::StatusOr<v1::Placement> replicated =
        ComputePlacement(model->model(), model->placement().num_ps(), options);
    if (!replicated.ok()) return Fail(std::string(replicated.status().message()), 2);
    *model->mutable_placement() = *std::move(replicated);
    GrpcPsTransportOptions as_chief;  // with TLS, the chief's certificate: creating is its role
    as_chief.tls = TlsOf("chief-0");
    absl::StatusOr<std::unique_ptr<ParameterClient>> creator = ParameterClient::Create(
        model->model(), model->placement(),
        std::make_unique<GrpcPsTransport>(
            std::vector<std::string>(model->ps_addresses().begin(), model->ps_addresses().end()),
            as_chief),
        ParameterClientOptions());
    if (!creator.ok()) return Fail(std::string(creator.status().message()), 1);
    CreateShardsOptions create;
    create.ps_addresses.assign(model->ps_addresses().begin(), model->ps_addresses().end());
    absl::Status created = (*creator)->CreateAll(model->sync(), nullptr, create);
    if (!created.ok()) {
      return Fail(absl::StrCat("creating the backups: ", created.message()), 1);
    }
    std::printf("replication 2: every dense partition forwarded to its backup before answering\n");
  }
  const std::string tag = FLAGS_tag.empty()
                              ? absl::StrCat(model->placement().num_ps(), "ps", FLAGS_workers, "w")
                              : FLAGS_tag;
  std::printf(
      "ps_bench %s: %d ps (%s), %d client(s) over %s, %s connections, gRPC chunk %lld bytes\n",
      tag.c_str(), model->placement().num_ps(), absl::StrJoin(model->ps_addresses(), " ").c_str(),
      FLAGS_workers, FLAGS_transport.c_str(), FLAGS_separate_connections ? "separate" : "shared",
      static_cast<long long>(FLAGS_chunk_bytes));
  PrintPlacement(*model);

  absl::StatusOr<std::vector<std::pair<std::string, int>>> channel_args =
      ParseChannelArgs(FLAGS_channel_args);
  if (!channel_args.ok()) return Fail(std::string(channel_args.status().message()), 2);
  if (!channel_args->empty() && !FLAGS_separate_connections) {
    return Fail("--channel_args needs --separate_connections", 2);
  }
  GrpcPsTransportOptions transport_options;
  transport_options.chunk_bytes = FLAGS_chunk_bytes;
  std::vector<std::unique_ptr<ParameterClient>> clients;
  for (int w = 0; w < FLAGS_workers; ++w) {
    absl::StatusOr<std::unique_ptr<ParameterClient>> client =
        ConnectClient(*model, w, transport_options, FLAGS_separate_connections, *channel_args);
    if (!client.ok()) return Fail(std::string(client.status().message()), 1);
    clients.push_back(*std::move(client));
  }
  std::vector<int> ps_pids;
  for (absl::string_view p : absl::StrSplit(FLAGS_ps_pids, ',', absl::SkipEmpty())) {
    int pid = 0;
    if (!absl::SimpleAtoi(p, &pid)) return Fail(absl::StrCat("--ps_pids: not a pid: ", p), 2);
    ps_pids.push_back(pid);
  }
  PsBench bench(std::move(clients), limits, base, tag, std::move(ps_pids));
  const std::set<std::string> only = absl::StrSplit(FLAGS_only, ',', absl::SkipEmpty());
  for (const v1::VariableSpec& v : model->model().variables()) {
    if (!only.empty() && only.count(v.name()) == 0) continue;
    absl::Status s = bench.Dense(v.name());
    if (!s.ok()) return Fail(absl::StrCat("variable ", v.name(), ": ", s.message()), 1);
  }
  for (const v1::TableSpec& t : model->model().tables()) {
    if (!only.empty() && only.count(t.name()) == 0) continue;
    absl::Status s = bench.Sparse(t.name(), t.dim(), t.vocabulary_size(), FLAGS_sparse_keys,
                                  FLAGS_sparse_key_space, model->model().tables_size() > 1);
    if (!s.ok()) return Fail(absl::StrCat("table ", t.name(), ": ", s.message()), 1);
  }
  PrintResults(bench.rows(), base, tag);
  return 0;
}

}  // namespace
}  // namespace pscluster

int main(int argc, char** argv) {
  FLAGS_logtostderr = true;
  // Progress goes to stderr; keep the two in order when both go to one pipe.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  gflags::SetUsageMessage(
      "push/pull throughput and latency of a live cluster's ps tasks.\n"
      "usage: ps_bench --chief=HOST:PORT [--workers=N] [--tag=T] [--loopback_gbps=G]\n"
      "       ps_bench --loopback_rtt_only");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  google::InitGoogleLogging(argv[0]);
  pscluster::SetMutexChecksFromEnvironment();  // (off: as the daemons)
  return pscluster::Main();
}
