#ifndef PSCLUSTER_PS_SERVER_REMOTE_PUSH_FORWARDER_H_
#define PSCLUSTER_PS_SERVER_REMOTE_PUSH_FORWARDER_H_

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/grpc_channel.h"
#include "client/tcp_ps_transport.h"
#include "common/thread_pool.h"
#include "proto/ps_service.grpc.pb.h"
#include "ps_server/push_forwarder.h"
#include "security/tls.h"

namespace pscluster {

// A primary ps task's forwards to its backups, one per backup task, all backups at once:
// over the backup's tensor data plane (common/tensor_wire.h's Replicate: the gradients go from
// the forward's memory into the backup's push buffers, as a worker's push does), or over gRPC
// (ParameterServer.Replicate, in chunks) to a task without a data plane. Thread-safe.
class RemotePushForwarder : public PushForwarder {
 public:
  // `self`: this task's index, sent as ReplicateHeader.primary_ps_task (with TLS, the backup
  // checks it against this task's certificate, `tls`).
  RemotePushForwarder(int self, TlsConfig tls, absl::Duration timeout = absl::Seconds(60));

  // Where the ps tasks are (gRPC addresses: CreateShardsRequest.ps_addresses); the data ports
  // are asked of them. A changed list gets new connections.
  void SetAddresses(const std::vector<std::string>& addresses);

  absl::Status Forward(const ForwardList& list) override;
  // Over the backup's tensor data plane (ReplicateStream); null where it has none.
  std::unique_ptr<ForwardStream> OpenStream(int backup, const v1::ReplicateHeader& header,
                                            int64_t values) override;
  // Over gRPC (ParameterServer.ReplicateSparse).
  absl::Status ForwardSparse(int backup, const v1::ReplicateSparseRequest& request) override;
  // Over gRPC (ParameterServer.InstallReplica, in chunks).
  absl::Status SendReplica(int backup, const v1::DenseReplica& replica, bool* installed,
                           std::atomic<int64_t>* sent = nullptr) override;
  absl::Status SendTableReplica(int backup, const v1::TableReplica& replica,
                                absl::Span<const int64_t> keys, absl::Span<const int64_t> counts,
                                absl::Span<const float> rows, bool* installed,
                                std::atomic<int64_t>* sent) override;
  // Over the data plane (TcpPsTransport::AbortCalls); forwards over gRPC end at their deadline.
  void AbortCalls(int backup) override;

 private:
  struct Peers {
    std::vector<std::string> addresses;
    std::unique_ptr<TcpPsTransport> wire;
    std::map<int, std::shared_ptr<v1::ParameterServer::Stub>> stubs;
  };
  // Sends one forward and waits for its answer.
  absl::Status ForwardOne(const DenseForward& forward);
  absl::Status ForwardOverGrpc(const DenseForward& forward, const v1::ReplicateHeader& header);
  // The gRPC stub of task `backup` (made on first use), or null without its address.
  std::shared_ptr<v1::ParameterServer::Stub> StubFor(const std::shared_ptr<Peers>& peers,
                                                     int backup);
  std::shared_ptr<Peers> peers() {
    absl::MutexLock lock(&mu_);
    return peers_;
  }

  static constexpr int64_t kChunkBytes = 1 << 20;
  // Threads that write the pipelined forwards (OpenStream's), each stream's pieces in order,
  // on machines of 8 cores or more; on smaller ones the thread receiving the push writes them
  // (bench/ps.sh on 2 cores: 0.35-0.53 of R = 1 with writer threads, 0.47-0.63 without).
  // PSCLUSTER_FORWARD_WRITERS (0 to 16) sets their number whatever the cores (tests, A/B).
  // Only with writer threads are a push's commits made before its apply
  // (ForwardStream::CommitQueues).
  static constexpr int kStreamWriters = 4;
  static int StreamWriters();
  const int self_;
  const TlsConfig tls_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::shared_ptr<Peers> peers_ ABSL_GUARDED_BY(mu_);
  // The data plane's TLS client context (made once; null: plaintext or not made yet).
  std::shared_ptr<WireTlsContext> wire_tls_ ABSL_GUARDED_BY(mu_);
  ThreadPool writers_;  // last: its threads end before the rest goes
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_REMOTE_PUSH_FORWARDER_H_
