#ifndef PSCLUSTER_CLIENT_GRPC_PS_TRANSPORT_H_
#define PSCLUSTER_CLIENT_GRPC_PS_TRANSPORT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/ps_transport.h"
#include "proto/ps_service.grpc.pb.h"
#include "security/tls.h"

namespace pscluster {

struct GrpcPsTransportOptions {
  // Deadline of each RPC, but SaveShards and RestoreShards.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // Deadline of SaveShards and RestoreShards, which write or read every shard of a ps task
  // (tables of tens of millions of rows take tens of seconds).
  absl::Duration checkpoint_timeout = absl::Minutes(10);
  // Size of each streamed chunk of a dense push or pull, in bytes.
  int64_t chunk_bytes = 1 << 20;
  // Largest message sent or received, in bytes (a sparse request and its answer are one
  // message; ParameterClient splits larger ones).
  int max_message_bytes = 64 << 20;
  // Mutual TLS toward the ps tasks (security/tls.h); plaintext when not enabled.
  TlsConfig tls;
};

// PsTransport over gRPC: one channel per ps task. Dense tensors stream in chunks, so no
// tensor is bounded by the message size limit. Thread-safe.
class GrpcPsTransport : public PsTransport {
 public:
  GrpcPsTransport(const std::vector<std::string>& ps_addresses,
                  const GrpcPsTransportOptions& options);
  // For tests: stubs given directly (e.g. mocks of the generated StubInterface). Owned.
  GrpcPsTransport(std::vector<std::unique_ptr<v1::ParameterServer::StubInterface>> stubs,
                  const GrpcPsTransportOptions& options);

  int num_ps() const override { return num_ps_; }
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
  absl::Status SetAddress(int ps, const std::string& address) override;
  // Cancels the calls under way to `ps`: they fail UNAVAILABLE ("the call was ended").
  void AbortCalls(int ps) override;

  // The address calls to task `ps` go to now.
  std::string address(int ps) const;

 private:
  // One ps task's channel; replaced whole by SetAddress, while calls under way keep theirs.
  struct Target {
    std::string address;
    std::shared_ptr<v1::ParameterServer::StubInterface> stub;
  };
  // A call's context, which AbortCalls reaches while it lives.
  class TrackedContext {
   public:
    TrackedContext(const GrpcPsTransport* transport, int ps);
    ~TrackedContext();
    TrackedContext(const TrackedContext&) = delete;
    TrackedContext& operator=(const TrackedContext&) = delete;
    grpc::ClientContext* get() { return &ctx_; }

   private:
    const GrpcPsTransport* const transport_;
    const int ps_;
    grpc::ClientContext ctx_;
  };
  std::shared_ptr<v1::ParameterServer::StubInterface> Stub(int ps) const;
  std::shared_ptr<v1::ParameterServer::StubInterface> NewStub(const std::string& address) const;
  void SetDeadline(grpc::ClientContext* ctx) const;
  void SetDeadline(grpc::ClientContext* ctx, absl::Duration timeout) const;
  absl::Status Annotate(int ps, const grpc::Status& status) const;

  const GrpcPsTransportOptions options_;
  mutable absl::Mutex mu_;
  std::vector<Target> targets_ ABSL_GUARDED_BY(mu_);  // size fixed at construction
  // The calls under way to one task (TrackedContext, AbortCalls): a lock of its own per task,
  // so that calls to different tasks never meet here.
  struct CallSet {
    absl::Mutex mu;
    absl::flat_hash_set<grpc::ClientContext*> live ABSL_GUARDED_BY(mu);
  };
  const int num_ps_;
  const std::unique_ptr<CallSet[]> calls_;  // num_ps_ of them
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLIENT_GRPC_PS_TRANSPORT_H_
