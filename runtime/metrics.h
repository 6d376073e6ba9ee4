#ifndef PSCLUSTER_RUNTIME_METRICS_H_
#define PSCLUSTER_RUNTIME_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_interceptor.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"

namespace pscluster {

struct MetricsOptions {
  // host:port the HTTP endpoint (/metrics, Prometheus' text format) listens on; port 0: any
  // free port (see port()).
  std::string address;
};

// A daemon's Prometheus endpoint. Two kinds of series:
//   - instruments updated as things happen (registry(): counters, histograms), among them
//     every gRPC call the daemon serves, through RpcInterceptorFactory(): requests by method
//     and status code, latency, bytes sent;
//   - series read from the daemon's own state at scrape time (AddCollector): nothing is
//     counted twice and the hot paths pay nothing.
// The endpoint is a minimal HTTP/1.1 server of its own (GET /metrics, one request per
// connection), not prometheus-cpp's civetweb exposer: civetweb starts its threads with a
// 100 KiB stack, which glibc refuses (EINVAL) in a process whose libraries' static TLS is
// larger, as the CUDA worker's (cuBLAS alone has 94 KiB).
// Thread-safe. Lifecycle: Start() -> serving until destroyed; the daemon whose state a
// collector reads must remove it (RemoveCollectors) or outlive this object.
class Metrics {
 public:
  using Collector = std::function<std::vector<prometheus::MetricFamily>()>;

  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const MetricsOptions& options);
  ~Metrics();

  prometheus::Registry& registry() { return *registry_; }
  int port() const { return port_; }

  void AddCollector(Collector collector);
  void RemoveCollectors();

  // For ServiceHost: counts every call into this object's registry.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcInterceptorFactory();

  struct RpcFamilies;  // the RPC instruments (metrics.cc)

 private:
  class CollectorSet;
  Metrics() = default;

  // Serves connections until stop_fd_ is written to.
  void ServeLoop();
  void Serve(int fd);

  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<CollectorSet> collectors_;
  std::shared_ptr<RpcFamilies> rpc_;
  int listen_fd_ = -1;
  int stop_fd_[2] = {-1, -1};
  std::thread thread_;
  int port_ = 0;
};

// Builders for collectors' families: one family, then one sample per call of Add.
class FamilyBuilder {
 public:
  FamilyBuilder(std::string name, std::string help, prometheus::MetricType type);
  FamilyBuilder& Add(double value, std::vector<prometheus::ClientMetric::Label> labels = {});
  // Moves the family out: call once, last.
  prometheus::MetricFamily Build() { return std::move(family_); }

 private:
  prometheus::MetricFamily family_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_RUNTIME_METRICS_H_
