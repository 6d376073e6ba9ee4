#include "runtime/metrics.h"

#include <cstdio>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"

namespace pscluster {

// The collectors, as one Collectable the exposer asks at each scrape.
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
  try {
    m->exposer_ = std::make_unique<prometheus::Exposer>(options.address, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", options.address, ": ", e.what()));
  }
  m->exposer_->RegisterCollectable(m->registry_);
  m->exposer_->RegisterCollectable(m->collectors_);
  const std::vector<int> ports = m->exposer_->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("metrics: nothing listens on ", options.address));
  }
  m->port_ = ports[0];
  if (!options.port_file.empty()) {
    // Written whole, then renamed into place: a reader sees no file or the whole port.
    const std::string tmp = options.port_file + ".tmp";
    std::ofstream(tmp) << m->port_ << "\n";
    if (std::rename(tmp.c_str(), options.port_file.c_str()) != 0) {
      return absl::UnavailableError(absl::StrCat("cannot write ", options.port_file));
    }
  }
  return m;
}

Metrics::~Metrics() {
  if (collectors_) collectors_->Clear();
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
