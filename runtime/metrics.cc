#include "runtime/metrics.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/text_serializer.h"

namespace pscluster {

// The collectors, asked at each scrape.
class Metrics::CollectorSet : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override {
    absl::MutexLock lock(&mu_);
    std::vector<prometheus::MetricFamily> out;
    for (const Collector& c : collectors_) {
      std::vector<prometheus::MetricFamily> families = c();
      for (prometheus::MetricFamily& f : families) out.push_back(std::move(f));
    }
    return out;
  }
  void Add(Collector c) {
    absl::MutexLock lock(&mu_);
    collectors_.push_back(std::move(c));
  }
  void Clear() {
    absl::MutexLock lock(&mu_);
    collectors_.clear();
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<Collector> collectors_ ABSL_GUARDED_BY(mu_);
};

struct Metrics::RpcFamilies {
  explicit RpcFamilies(prometheus::Registry& r)
      : requests(prometheus::BuildCounter()
                     .Name("pscluster_rpc_requests_total")
                     .Help("gRPC calls served, by method and status code")
                     .Register(r)),
        sent_bytes(prometheus::BuildCounter()
                       .Name("pscluster_rpc_sent_bytes_total")
                       .Help("Bytes of response messages sent, by method (serialized)")
                       .Register(r)),
        latency(prometheus::BuildHistogram()
                    .Name("pscluster_rpc_duration_seconds")
                    .Help("Time from a call's arrival to its status, by method")
                    .Register(r)) {}
  prometheus::Family<prometheus::Counter>& requests;
  prometheus::Family<prometheus::Counter>& sent_bytes;
  prometheus::Family<prometheus::Histogram>& latency;
};

namespace {

// 50 us to about 13 s, doubling.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* const kBuckets = [] {
    auto* b = new prometheus::Histogram::BucketBoundaries();
    for (double s = 50e-6; s < 15; s *= 2) b->push_back(s);
    return b;
  }();
  return *kBuckets;
}

class RpcInterceptor : public grpc::experimental::Interceptor {
 public:
  RpcInterceptor(std::string method, std::shared_ptr<Metrics::RpcFamilies> families)
      : method_(std::move(method)), families_(std::move(families)), start_(absl::Now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using Hook = grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(Hook::PRE_SEND_MESSAGE)) {
      if (grpc::ByteBuffer* sent = methods->GetSerializedSendMessage()) sent_ += sent->Length();
    }
    if (methods->QueryInterceptionHookPoint(Hook::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      families_->requests.Add({{"method", method_}, {"code", CodeName(status.error_code())}})
          .Increment();
      families_->sent_bytes.Add({{"method", method_}}).Increment(static_cast<double>(sent_));
      families_->latency.Add({{"method", method_}}, LatencyBuckets())
          .Observe(absl::ToDoubleSeconds(absl::Now() - start_));
    }
    methods->Proceed();
  }

 private:
  static std::string CodeName(grpc::StatusCode code) {
    static const char* const kNames[] = {"OK",
                                         "CANCELLED",
                                         "UNKNOWN",
                                         "INVALID_ARGUMENT",
                                         "DEADLINE_EXCEEDED",
                                         "NOT_FOUND",
                                         "ALREADY_EXISTS",
                                         "PERMISSION_DENIED",
                                         "RESOURCE_EXHAUSTED",
                                         "FAILED_PRECONDITION",
                                         "ABORTED",
                                         "OUT_OF_RANGE",
                                         "UNIMPLEMENTED",
                                         "INTERNAL",
                                         "UNAVAILABLE",
                                         "DATA_LOSS",
                                         "UNAUTHENTICATED"};
    const int i = static_cast<int>(code);
    return i >= 0 && i < 17 ? kNames[i] : absl::StrCat(i);
  }

  const std::string method_;
  const std::shared_ptr<Metrics::RpcFamilies> families_;
  const absl::Time start_;
  int64_t sent_ = 0;
};

class RpcInterceptorFactory : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcInterceptorFactory(std::shared_ptr<Metrics::RpcFamilies> families)
      : families_(std::move(families)) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    // "/pscluster.v1.ParameterServer/PushDense" -> "ParameterServer.PushDense".
    std::string method = info->method() == nullptr ? "" : info->method();
    const size_t dot = method.rfind('.', method.find('/', 1));
    if (!method.empty() && method[0] == '/') {
      method = method.substr(dot == std::string::npos ? 1 : dot + 1);
      const size_t slash = method.find('/');
      if (slash != std::string::npos) method[slash] = '.';
    }
    return new RpcInterceptor(std::move(method), families_);
  }

 private:
  std::shared_ptr<Metrics::RpcFamilies> families_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const MetricsOptions& options) {
  auto m = std::unique_ptr<Metrics>(new Metrics());
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->collectors_ = std::make_shared<CollectorSet>();
  m->rpc_ = std::make_shared<RpcFamilies>(*m->registry_);

  absl::StatusOr<HostPort> hp = ParseHostPort(options.address);
  if (!hp.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address \"", options.address,
                                                   "\" is not host:port: ", hp.status().message()));
  }
  const std::string port = absl::StrCat(hp->port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICHOST | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(hp->host.c_str(), port.c_str(), &hints, &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("metrics address \"", options.address, "\" is not a numeric host:port"));
  }
  const int fd = socket(found->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const bool bound =
      fd >= 0 && bind(fd, found->ai_addr, found->ai_addrlen) == 0 && listen(fd, 64) == 0;
  const int bind_errno = errno;
  freeaddrinfo(found);
  if (!bound) {
    if (fd >= 0) close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", options.address, ": ", std::strerror(bind_errno)));
  }
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  m->port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                              : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  m->listen_fd_ = fd;
  if (pipe2(m->stop_fd_, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("metrics: pipe: ", std::strerror(errno)));
  }
  Metrics* raw = m.get();
  m->thread_ = std::thread([raw] { raw->ServeLoop(); });
  return m;
}

Metrics::~Metrics() {
  if (collectors_) collectors_->Clear();
  if (stop_fd_[1] >= 0) {
    const char byte = 0;
    (void)write(stop_fd_[1], &byte, 1);
  }
  if (thread_.joinable()) thread_.join();
  for (int fd : {listen_fd_, stop_fd_[0], stop_fd_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void Metrics::ServeLoop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_[0], POLLIN, 0}};
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int conn = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    Serve(conn);
    close(conn);
  }
}

void Metrics::Serve(int fd) {
  // One request per connection, read within 2 s and up to 8 KiB (a scrape's is a few hundred
  // bytes); anything else is answered 400, 404 or 405 and closed.
  std::string request;
  char buf[1024];
  const absl::Time deadline = absl::Now() + absl::Seconds(2);
  while (request.find("\r\n\r\n") == std::string::npos && request.size() < 8192) {
    const int left = static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p = {fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) return;
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) return;
    request.append(buf, static_cast<size_t>(n));
  }
  std::string status = "200 OK";
  std::string body;
  std::string type = "text/plain; version=0.0.4; charset=utf-8";
  std::istringstream line(request.substr(0, request.find("\r\n")));
  std::string method, target;
  line >> method >> target;
  const std::string path = target.substr(0, target.find('?'));
  if (method.empty() || target.empty()) {
    status = "400 Bad Request";
  } else if (method != "GET" && method != "HEAD") {
    status = "405 Method Not Allowed";
  } else if (path != "/metrics") {
    status = "404 Not Found";
  }
  if (status != "200 OK") {
    type = "text/plain; charset=utf-8";
    body = status + ": this endpoint serves GET /metrics only\n";
  } else {
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    for (prometheus::MetricFamily& f : collectors_->Collect()) families.push_back(std::move(f));
    std::ostringstream out;
    prometheus::TextSerializer().Serialize(out, families);
    if (method == "GET") body = out.str();
  }
  const std::string response =
      absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type,
                   "\r\nContent-Length: ", body.size(), "\r\nConnection: close\r\n\r\n", body);
  size_t sent = 0;
  while (sent < response.size()) {
    const ssize_t n = send(fd, response.data() + sent, response.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return;
    sent += static_cast<size_t>(n);
  }
}

void Metrics::AddCollector(Collector collector) { collectors_->Add(std::move(collector)); }

void Metrics::RemoveCollectors() { collectors_->Clear(); }

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
Metrics::RpcInterceptorFactory() {
  return std::make_unique<pscluster::RpcInterceptorFactory>(rpc_);
}

FamilyBuilder::FamilyBuilder(std::string name, std::string help, prometheus::MetricType type) {
  family_.name = std::move(name);
  family_.help = std::move(help);
  family_.type = type;
}

FamilyBuilder& FamilyBuilder::Add(double value,
                                  std::vector<prometheus::ClientMetric::Label> labels) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (family_.type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  family_.metric.push_back(std::move(m));
  return *this;
}

}  // namespace pscluster
