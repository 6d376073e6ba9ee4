#ifndef PSCLUSTER_CLIENT_PS_TRANSPORT_H_
#define PSCLUSTER_CLIENT_PS_TRANSPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/ps_service.pb.h"
#include "proto/status.pb.h"

namespace pscluster {

// A dense shard to pull into, or push from, caller memory.
struct DenseSlice {
  v1::ShardRef ref;
  int64_t num_elements = 0;
  // Pull: written, num_elements floats. Push: read. Not owned.
  float* pull_into = nullptr;
  const float* push_from = nullptr;
};

// The tags every push carries (PushDenseHeader / PushSparseRequest).
struct PushMeta {
  // Encoding of the gradients on the wire.
  v1::DataType wire_dtype = v1::DT_FLOAT32;
  // The global step the gradient was computed from (sync mode drops other steps').
  int64_t step = 0;
  // The pushing worker's index (-1: not a worker).
  int32_t worker = -1;
  // Names this push for the ps's retry detection (see RequestId); client 0: none.
  v1::RequestId request_id;
  // Sparse pushes split into several requests: this one's part of num_parts (see
  // PushSparseRequest.part).
  int32_t part = 0;
  int32_t num_parts = 1;
  // Dense pushes: the values are a change to add, not a gradient (PushDenseHeader.delta).
  bool delta = false;
};

// The RPCs of the ps tasks, one task at a time, with tensors already in caller memory: the
// boundary that ParameterClient routes over. Implementations encode to the wire dtype and
// back, so an in-process fake shows the same rounding as the network.
//
// Implementations: GrpcPsTransport (everything over gRPC), TcpPsTransport (pulls and pushes
// over the tensor data plane, the rest over gRPC) and InProcessPsTransport (over ParameterStore
// objects in this process, for tests and the single-process benchmark). One conformance suite
// (client/ps_transport_conformance.h) runs against each. Thread-safe: calls to different or the
// same task may run concurrently.
class PsTransport {
 public:
  virtual ~PsTransport() = default;

  virtual int num_ps() const = 0;

  virtual absl::Status CreateShards(int ps, const v1::CreateShardsRequest& request,
                                    v1::CreateShardsResponse* response) = 0;
  // `step`: the sync step the values are for (PullDenseRequest.step); -1: none.
  virtual absl::Status PullDense(int ps, const std::vector<DenseSlice>& slices,
                                 v1::DataType wire_dtype, int64_t step) = 0;
  virtual absl::Status PushDense(int ps, const std::vector<DenseSlice>& slices,
                                 const PushMeta& meta, v1::PushDenseResponse* response) = 0;
  // out[0..n*dim) receives the rows of keys[0..n).
  virtual absl::Status PullSparse(int ps, const std::string& table, const int64_t* keys, int64_t n,
                                  int64_t dim, v1::DataType wire_dtype, int64_t step,
                                  float* out) = 0;
  virtual absl::Status PushSparse(int ps, const std::string& table, const int64_t* keys, int64_t n,
                                  int64_t dim, const float* grads, const PushMeta& meta,
                                  v1::PushSparseResponse* response) = 0;
  // PushSparse of a part of a caller's request: the keys keys[positions[i]] with the gradient
  // rows grads[positions[i] * dim, (positions[i] + 1) * dim), for i in [0, n). The default
  // gathers the part into this thread's buffers (kept from call to call) and calls PushSparse;
  // TcpPsTransport gathers it a piece at a time as it writes it to the socket.
  virtual absl::Status PushSparseGather(int ps, const std::string& table, const int64_t* keys,
                                        const int64_t* positions, int64_t n, int64_t dim,
                                        const float* grads, const PushMeta& meta,
                                        v1::PushSparseResponse* response);
  virtual absl::StatusOr<v1::ListShardsResponse> ListShards(
      int ps, const v1::ListShardsRequest& request) = 0;
  virtual absl::StatusOr<v1::InspectShardResponse> InspectShard(
      int ps, const v1::InspectShardRequest& request) = 0;
  virtual absl::Status SaveShards(int ps, const v1::SaveShardsRequest& request,
                                  v1::SaveShardsResponse* response) = 0;
  virtual absl::Status RestoreShards(int ps, const v1::RestoreShardsRequest& request,
                                     v1::RestoreShardsResponse* response) = 0;
  virtual absl::StatusOr<v1::TaskStatus> GetStatus(int ps) = 0;
  // Failover (issue 37): tells task `ps` that task request.failed_ps_task() died.
  // UNIMPLEMENTED for a transport whose tasks hold no backups (in-process).
  virtual absl::Status FailOverPs(int ps, const v1::FailOverPsRequest& request,
                                  v1::FailOverPsResponse* response) {
    return absl::UnimplementedError("this transport's ps tasks hold no backups");
  }
  // Rebuild (issue 37): asks primary `ps` to copy the request's shards to their new backup.
  // UNIMPLEMENTED for a transport whose tasks hold no backups (in-process).
  virtual absl::Status RebuildBackup(int ps, const v1::RebuildBackupRequest& request,
                                     v1::RebuildBackupResponse* response) {
    return absl::UnimplementedError("this transport's ps tasks hold no backups");
  }
  // Points later calls for task `ps` at `address` (host:port): the task was restarted
  // elsewhere. Calls under way finish on the old address. UNIMPLEMENTED for a transport
  // without addresses (in-process).
  virtual absl::Status SetAddress(int ps, const std::string& address) {
    return absl::UnimplementedError("this transport has no addresses to change");
  }
  // Ends the calls under way to task `ps` at once (they fail, UNAVAILABLE) and closes its idle
  // connections: the task was failed over, and a call to a task that hangs (frozen, or cut off
  // without a reset) would otherwise wait out its I/O timeout before anything is retried
  // elsewhere. Later calls connect again. Does nothing in-process.
  virtual void AbortCalls(int ps) {}
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_PS_TRANSPORT_H_
