#ifndef PSCLUSTER_RUNTIME_SERVICE_HOST_H_
#define PSCLUSTER_RUNTIME_SERVICE_HOST_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/server.h"
#include "security/tls.h"

namespace pscluster {

class Metrics;

struct ServiceHostOptions {
  // host:port from the cluster spec. Port 0 binds any free port. A numeric host (127.0.0.1,
  // [::1]) is bound as given, "localhost" as 127.0.0.1; another name is served on all
  // interfaces, as TensorFlow does.
  std::string address = "127.0.0.1:0";
  // Mutual TLS (security/tls.h). Without it the host refuses to bind anything but loopback
  // unless allow_insecure is set.
  TlsConfig tls;
  // Serve plaintext on a non-loopback address (anyone who reaches the port may call anything).
  bool allow_insecure = false;
  // Serve gRPC server reflection (grpc_cli ls); off unless asked for, as it lists every method.
  bool reflection = false;
  // When set, the bound port is written to this file (atomically) once serving.
  std::string port_file;
  // Largest message received or sent, in bytes.
  int max_message_bytes = 64 << 20;
  // Calls one connection (one peer's channel) may have open at once; more wait. 0: gRPC's
  // default (no limit).
  int max_concurrent_streams = 256;
  // On Shutdown, calls in flight get this long to finish before they are cancelled.
  absl::Duration shutdown_grace = absl::Seconds(2);
  // When set (not owned; it must outlive the host), every call served is counted in it.
  Metrics* metrics = nullptr;
};

// A gRPC server with the project's services plus the standard health service
// (grpc.health.v1.Health), and server reflection when asked for.
//
// Lifecycle: Start() -> serving -> Shutdown() -> stopped. Health reports NOT_SERVING until
// SetServing(true) and again from Shutdown() on. Thread-safe.
class ServiceHost {
 public:
  // Binds and starts serving `services` (not owned; they must outlive the host).
  static absl::StatusOr<std::unique_ptr<ServiceHost>> Start(
      const ServiceHostOptions& options, const std::vector<grpc::Service*>& services);
  ~ServiceHost();

  // The port actually bound.
  int port() const { return port_; }
  // host:port where peers reach this server (the spec's host with the bound port).
  const std::string& address() const { return address_; }

  void SetServing(bool serving);

  // Stops accepting calls, waits up to the grace period for those in flight, cancels the rest.
  // Idempotent.
  void Shutdown();

 private:
  ServiceHost(const ServiceHostOptions& options, std::unique_ptr<grpc::Server> server, int port,
              std::string address);

  const ServiceHostOptions options_;
  const std::unique_ptr<grpc::Server> server_;
  const int port_;
  const std::string address_;
  absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
};

// Writes `contents` to `path` through a temporary file and a rename, so readers never see a
// partial file.
absl::Status WriteFileAtomically(const std::string& path, const std::string& contents);

// The address a server for `host` (from a host:port, brackets removed) binds: a numeric host as
// given, "localhost" as 127.0.0.1, another name as 0.0.0.0 (every interface), as TensorFlow
// does.
std::string BindHostFor(const std::string& host);

// "host:port", with an IPv6 host in brackets.
std::string JoinHostPort(const std::string& host, int port);

// Whether `host` (from a host:port) names this machine's loopback: 127.0.0.0/8, ::1 or
// localhost.
bool IsLoopbackHost(const std::string& host);

}  // namespace pscluster

#endif  // PSCLUSTER_RUNTIME_SERVICE_HOST_H_
