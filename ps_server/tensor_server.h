#ifndef PSCLUSTER_PS_SERVER_TENSOR_SERVER_H_
#define PSCLUSTER_PS_SERVER_TENSOR_SERVER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/tensor_wire.h"
#include "ps_server/backup_stores.h"
#include "ps_server/parameter_store.h"
#include "security/wire_tls.h"

namespace pscluster {

struct TensorServerOptions {
  // Address to bind: a numeric host ("127.0.0.1", "0.0.0.0", "::"); port 0 binds a free one.
  std::string host = "127.0.0.1";
  int port = 0;
  // Each read or write of a request, once its first byte arrived, must finish within this.
  absl::Duration io_timeout = absl::Seconds(60);
  // A connection with no request under way for this long is closed (a client's pool opens
  // another when it next needs one).
  absl::Duration idle_timeout = absl::Seconds(60);
  // Send and receive buffers of each connection, in bytes (0: the system's).
  int socket_buffer_bytes = 4 << 20;
  // Largest meta message a request may carry, in bytes.
  int64_t max_meta_bytes = 1 << 20;
  // Largest payload of a sparse request, in bytes (a dense push's payload is bounded by the
  // shards its header names, which exist).
  int64_t max_sparse_payload_bytes = 512 << 20;
  // Mutual TLS (security/wire_tls.h, server side); null: plaintext. With it, a connection must
  // complete the handshake with a certificate of `cluster` within io_timeout, and each request
  // is checked against the caller's role as the same call over gRPC (security/authz.h): pulls
  // for the roles that may pull, pushes by a worker for itself only.
  std::shared_ptr<WireTlsContext> tls;
  std::string cluster;
  // The context was made with kernel TLS asked for: connections are admitted to TLS records
  // (common/tensor_wire.h), which the kernel encrypts where it has kTLS (logged once either
  // way). Otherwise they are admitted to sealed chunks (common/sealed_channel.h).
  bool kernel_tls_wanted = false;
  // Connections served at once. With that many open, a new one takes the place of the one
  // idle longest; when none is idle (every one in the middle of a request, which ends within
  // io_timeout), the new one is closed at once.
  int max_connections = 1024;
  // The task's backups of other tasks' shards, which Replicate requests update (issue 37);
  // not owned; null: Replicate is refused.
  BackupStores* backups = nullptr;
};

// The ps side of the tensor data plane (common/tensor_wire.h): accepts TCP connections and
// serves pulls and pushes on each, one request at a time, by handing them to the
// ParameterStore. A connection has its own thread and its own buffers, which it keeps, so the
// steady state allocates nothing; float32 tensors go from the socket into the gradient buffer
// and from shard memory into the socket with no other copy.
//
// Lifecycle: Start() -> serving -> Shutdown() (closes the listener and every connection, waits
// for their threads). Thread-safe.
class TensorServer {
 public:
  // `store` is not owned and must outlive the server. UNAVAILABLE when the address cannot be
  // bound.
  static absl::StatusOr<std::unique_ptr<TensorServer>> Start(ParameterStore* store,
                                                             const TensorServerOptions& options);
  ~TensorServer();

  int port() const { return port_; }
  // Connections served so far, and closed for being idle (for tests and metrics).
  int64_t connections_accepted() const;
  int64_t connections_closed_idle() const;

  void Shutdown();

 private:
  class Connection;

  TensorServer(ParameterStore* store, const TensorServerOptions& options, int listen_fd, int port);
  void AcceptLoop();
  // Joins the threads of connections that have ended.
  void ReapLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At max_connections: closes the connection idle longest and waits for its thread; false
  // when none is idle.
  bool EvictIdlestLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  ParameterStore* const store_;  // Not owned.
  const TensorServerOptions options_;
  const int listen_fd_;
  const int port_;
  std::thread accept_thread_;
  mutable absl::Mutex mu_;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  int64_t accepted_ ABSL_GUARDED_BY(mu_) = 0;
  std::atomic<int64_t> closed_idle_{0};
  struct Served {
    std::shared_ptr<Connection> connection;
    std::thread thread;
  };
  std::vector<Served> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_TENSOR_SERVER_H_
