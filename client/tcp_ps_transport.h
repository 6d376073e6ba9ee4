#ifndef PSCLUSTER_CLIENT_TCP_PS_TRANSPORT_H_
#define PSCLUSTER_CLIENT_TCP_PS_TRANSPORT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/grpc_ps_transport.h"
#include "client/ps_transport.h"
#include "common/tensor_wire.h"
#include "security/wire_tls.h"

namespace pscluster {

class ThreadPool;

struct TcpPsTransportOptions {
  // Each read or write of a call must finish within this (DEADLINE_EXCEEDED otherwise).
  absl::Duration io_timeout = absl::Seconds(30);
  absl::Duration connect_timeout = absl::Seconds(2);
  // Send and receive buffers of each connection, in bytes (0: the system's).
  int socket_buffer_bytes = 4 << 20;
  // PushSparseGather gathers and writes a part this many bytes at a time (at least one key or
  // one row): small enough to stay in the core's cache between the gather and the socket's copy.
  int64_t gather_piece_bytes = 256 << 10;
  // Mutual TLS (security/wire_tls.h, client side), as the gRPC channels have it; null:
  // plaintext. The ps's certificate must name the host of its address.
  std::shared_ptr<WireTlsContext> tls;
  // A dense pull of at least 2 * pull_stripe_min_bytes is cut into up to pull_stripes stripes
  // of elements (at least pull_stripe_min_bytes each), pulled over as many connections at once
  // (PullDenseRequest.element_begin/end): the ps's threads of those connections send (and,
  // with TLS, seal) them side by side, and this process's pull threads receive them. 1: never.
  // -1: PSCLUSTER_PULL_STRIPES (1 to 16) where set, else half this machine's cores, 2 to 8
  // (none under 8 cores, as on the 2-core VM, where the connections' threads already fill the
  // cores). On the GPU machine's 16 cores (bench/gpu_ps.sh, docs/benchmarks.md) 4 stripes took
  // one client's pulls of 1 / 16 / 64 MiB from 6.8 / 5.3 / 3.6 GB/s to 10.8 / 14.5 / 12.1 in
  // plaintext and from 4.6 / 3.7 / 3.0 to 7.0 / 10.8 / 8.9 with TLS, and 8 took the 16 and 64
  // MiB pulls further, to 22-26 GB/s in plaintext and 14-17 with TLS; with 2 clients pulling 1
  // MiB from 2 ps tasks 4 stripes of 256 KiB lost to whole pulls with TLS (8.9 against 11.1
  // GB/s), and the MLP's 1 MiB pulls in 8 stripes of 128 KiB ran slower than in 2 of 512 KiB,
  // hence stripes of 512 KiB at least. PSCLUSTER_PULL_STRIPE_BYTES (16 KiB to 1 GiB) overrides
  // the default pull_stripe_min_bytes (not one set here).
  int pull_stripes = -1;
  int64_t pull_stripe_min_bytes = 512 << 10;
};

// PsTransport with pulls and pushes over the tensor data plane (common/tensor_wire.h) and
// everything else over gRPC. Each ps task's data port is asked of its gRPC service
// (GetStatus.data_port) on first use and again after a connection to it fails, so a ps task
// that restarts on another port is found; a ps task without a data plane is served over gRPC.
//
// Connections are pooled per ps task: a call takes an idle one (or opens one) and gives it
// back, so concurrent calls to one task use several connections. float32 tensors are written
// from and read into the caller's memory with no copy. A call that fails on a connection
// taken from the pool (the ps may have restarted meanwhile) is tried once more on a new one;
// pushes carry a request id, so the ps recognises a push that did arrive the first time.
//
// Errors: UNAVAILABLE (no connection, the ps went away), DEADLINE_EXCEEDED, or the ps's own
// status, each naming the ps task. Thread-safe.
class TcpPsTransport : public PsTransport {
  struct Connection;

 public:
  // `grpc` carries the control plane and the data-port lookups; owned. `addresses` are the ps
  // tasks' gRPC addresses (host:port), whose hosts the data ports are on.
  TcpPsTransport(std::unique_ptr<GrpcPsTransport> grpc, std::vector<std::string> addresses,
                 const TcpPsTransportOptions& options);
  ~TcpPsTransport() override;

  int num_ps() const override { return grpc_->num_ps(); }
  absl::Status CreateShards(int ps, const v1::CreateShardsRequest& request,
                            v1::CreateShardsResponse* response) override;
  absl::Status PullDense(int ps, const std::vector<DenseSlice>& slices, v1::DataType wire_dtype,
                         int64_t step) override;
  absl::Status PushDense(int ps, const std::vector<DenseSlice>& slices, const PushMeta& meta,
                         v1::PushDenseResponse* response) override;
  absl::Status PullSparse(int ps, const std::string& table, const int64_t* keys, int64_t n,
                          int64_t dim, v1::DataType wire_dtype, int64_t step, float* out) override;
  absl::Status PushSparse(int ps, const std::string& table, const int64_t* keys, int64_t n,
                          int64_t dim, const float* grads, const PushMeta& meta,
                          v1::PushSparseResponse* response) override;
  // Writes the part's keys, then its rows, gathered a piece of
  // TcpPsTransportOptions::gather_piece_bytes at a time into this thread's buffer, which each
  // write leaves free for the next piece: the part is never copied whole.
  absl::Status PushSparseGather(int ps, const std::string& table, const int64_t* keys,
                                const int64_t* positions, int64_t n, int64_t dim,
                                const float* grads, const PushMeta& meta,
                                v1::PushSparseResponse* response) override;
  // A primary ps task's forward to the backup task `ps` (issue 37, docs/replication.md):
  // `header` and the float32 gradients of its shards, sent from the caller's memory. Sets
  // *no_data_plane (sending nothing) when `ps` has no data plane.
  absl::Status Replicate(int ps, const v1::ReplicateHeader& header,
                         const std::vector<absl::Span<const float>>& grads,
                         v1::ReplicateResponse* response, bool* no_data_plane);
  // A primary's forward of a table push (ReplicateSparse), as from task `primary_ps_task`:
  // `request`'s keys and gradients are sent as the payload, from its memory. *no_data_plane as
  // for Replicate.
  absl::Status ReplicateSparse(int ps, int32_t primary_ps_task,
                               const v1::ReplicateSparseRequest& request,
                               v1::ReplicateSparseResponse* response, bool* no_data_plane);
  // The same forward sent while the primary is still receiving the push (wire ops
  // ReplicateStream and ReplicateCommit, docs/wire.md): Write() the gradients as they come,
  // Commit() the versions and outcome, Await() the answer. Destroyed before an answer, it
  // closes its connection: the backup abandons the forward.
  class ReplicateStream {
   public:
    ~ReplicateStream();
    absl::Status Write(const float* values, int64_t n);
    absl::Status Commit(const v1::ReplicateHeader& header);
    absl::Status Await(v1::ReplicateResponse* response);
    // Makes a Write blocked on another thread, and every later call, fail at once (the
    // forward is abandoned). Thread-safe.
    void Abort();

   private:
    friend class TcpPsTransport;
    ReplicateStream(TcpPsTransport* transport, int ps) : transport_(transport), ps_(ps) {}
    TcpPsTransport* const transport_;
    const int ps_;
    std::unique_ptr<Connection> connection_;
    uint64_t tag_ = 0;
    bool answered_ = false;
  };
  // Opens one to task `ps` with `header` (ReplicateHeader less versions and outcome) for
  // `values` floats. Null with OK when `ps` has no data plane.
  absl::StatusOr<std::unique_ptr<ReplicateStream>> OpenReplicateStream(
      int ps, const v1::ReplicateHeader& header, int64_t values);
  absl::StatusOr<v1::ListShardsResponse> ListShards(int ps,
                                                    const v1::ListShardsRequest& request) override;
  absl::StatusOr<v1::InspectShardResponse> InspectShard(
      int ps, const v1::InspectShardRequest& request) override;
  absl::Status SaveShards(int ps, const v1::SaveShardsRequest& request,
                          v1::SaveShardsResponse* response) override;
  absl::Status RestoreShards(int ps, const v1::RestoreShardsRequest& request,
                             v1::RestoreShardsResponse* response) override;
  absl::StatusOr<v1::TaskStatus> GetStatus(int ps) override;
  absl::Status FailOverPs(int ps, const v1::FailOverPsRequest& request,
                          v1::FailOverPsResponse* response) override;
  absl::Status RebuildBackup(int ps, const v1::RebuildBackupRequest& request,
                             v1::RebuildBackupResponse* response) override;
  // Both planes: the gRPC channel, and the data port looked up again on the new host; idle
  // connections to the old address are closed, and those in use are not pooled again.
  absl::Status SetAddress(int ps, const std::string& address) override;
  // Shuts down every socket open to `ps` (calls blocked on them return UNAVAILABLE).
  void AbortCalls(int ps) override;

  // Connections opened so far to task `ps` (for tests).
  int connections_opened(int ps) const;
  // The stripes a dense pull is cut into (TcpPsTransportOptions::pull_stripes resolved).
  int pull_stripes() const { return pull_stripes_; }
  int64_t pull_stripe_bytes() const { return pull_stripe_bytes_; }

 private:
  struct Endpoint;
  struct Connection {
    // Leaves the endpoint's `live` (AbortCalls reaches it no more).
    ~Connection();
    std::unique_ptr<WireSocket> socket;
    std::string scratch;  // encodings of non-float32 tensors, kept between calls
    uint64_t epoch = 0;   // the endpoint's epoch when it was opened
    uint64_t aborts = 0;  // the endpoint's AbortCalls count when it was acquired
    Endpoint* endpoint = nullptr;
  };
  struct Endpoint {
    mutable absl::Mutex mu;
    // 0: not looked up yet; -1: the ps had no data plane when asked at `looked_up` (use gRPC;
    // asked again after a while).
    int port ABSL_GUARDED_BY(mu) = 0;
    // Whether the ps said it serves pulls of element ranges (TaskStatus.serves_pull_ranges):
    // only then are its pulls striped.
    bool ranges ABSL_GUARDED_BY(mu) = false;
    // Where this task's striped pulls run their stripes beyond the first (pull_stripes_ - 1
    // threads, made at its first striped pull): a task of its own, so that pulls stuck on a
    // dead task never hold up another's.
    std::unique_ptr<ThreadPool> stripe_pool ABSL_GUARDED_BY(mu);
    absl::Time looked_up ABSL_GUARDED_BY(mu);
    // The sockets of every connection open to the task, idle or in a call (AbortCalls).
    // (Before `idle`: destroyed after it, as each connection leaves it.)
    absl::flat_hash_set<WireSocket*> live ABSL_GUARDED_BY(mu);
    // AbortCalls so far (raised under mu): a call it ended is not tried again on a new
    // connection, and a connection it shut down is not pooled again.
    std::atomic<uint64_t> aborts{0};
    std::vector<std::unique_ptr<Connection>> idle ABSL_GUARDED_BY(mu);
    int opened ABSL_GUARDED_BY(mu) = 0;
    // The host the data port is on, and how many times the address has changed.
    std::string host ABSL_GUARDED_BY(mu);
    uint64_t epoch ABSL_GUARDED_BY(mu) = 0;
  };
  // What one call sends and how it reads the answer.
  struct Exchange {
    FrameHeader request;
    std::string meta;
    std::vector<iovec> payload;
    // When set, sends the payload instead of `payload`: exactly streamed_payload_bytes bytes,
    // after `head` (the frame header and meta), which it must send first (with its first
    // piece, in one write, if it likes). Called again if the call is retried.
    uint64_t streamed_payload_bytes = 0;
    std::function<absl::Status(WireSocket&, std::vector<iovec>* head)> write_payload;
    // Reads the response's payload (status OK) from the socket; called with its size.
    std::function<absl::Status(WireSocket&, uint64_t payload_bytes, Connection&)> read_payload;
    // The response's meta on success.
    std::string response_meta;
  };

  // A connection to ps's data plane; *pooled tells whether it came from the idle pool.
  // nullptr with OK: the ps has no data plane.
  // `aborts_seen` (optional): the endpoint's AbortCalls count when the call began; a call
  // aborted since gets no connection (UNAVAILABLE).
  absl::StatusOr<std::unique_ptr<Connection>> Acquire(int ps, bool* pooled,
                                                      const uint64_t* aborts_seen = nullptr);
  static absl::Status Ended();
  void Release(int ps, std::unique_ptr<Connection> connection);
  // Forgets the port and the idle connections of ps (after a failure).
  void Forget(int ps);
  // Runs the exchange, retrying once on a fresh connection when a pooled one fails. Sets
  // *no_data_plane when the ps has none (nothing was sent).
  absl::Status Call(int ps, Exchange* exchange, bool* no_data_plane);
  // One exchange on one connection. *in_step: the connection can carry the next call.
  absl::Status CallOn(Connection& c, Exchange* exchange, bool* in_step);
  // Reads the answer to the request `exchange` sent on `c` (the second half of CallOn).
  absl::Status ReadAnswer(Connection& c, Exchange* exchange, bool* in_step);
  absl::Status Annotate(int ps, const absl::Status& status) const;
  // One PullDense exchange; `begins` (empty: whole shards) are the slices' first elements
  // within their shards. Sets *no_data_plane as Call does.
  absl::Status PullDenseOnce(int ps, const std::vector<DenseSlice>& slices,
                             const std::vector<int64_t>& begins, v1::DataType wire, int64_t step,
                             bool* no_data_plane);

  const std::unique_ptr<GrpcPsTransport> grpc_;
  const TcpPsTransportOptions options_;
  const int pull_stripes_;
  const int64_t pull_stripe_bytes_;  // pull_stripe_min_bytes resolved
  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::atomic<uint64_t> next_tag_{1};
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_TCP_PS_TRANSPORT_H_
