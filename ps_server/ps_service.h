#ifndef PSCLUSTER_PS_SERVER_PS_SERVICE_H_
#define PSCLUSTER_PS_SERVER_PS_SERVICE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/ps_service.grpc.pb.h"
#include "ps_server/backup_stores.h"
#include "ps_server/parameter_store.h"
#include "security/authz.h"

namespace pscluster {

struct PsServiceOptions {
  // Chunk size of streamed pulls when the request does not say, in bytes.
  int64_t default_chunk_bytes = 1 << 20;
  // Largest chunk a client may ask for, in bytes (kept under the message size limit).
  int64_t max_chunk_bytes = 16 << 20;
  // Who may call what (security/authz.h); every call is allowed without TLS.
  Authorizer authorizer = Authorizer::AllowAll();
  // Called with CreateShardsRequest.ps_addresses when a request names them (the forwards to
  // backups go there). May be null.
  std::function<void(const std::vector<std::string>&)> ps_addresses_changed;
};

// Adapts a ParameterStore to the ParameterServer gRPC service: marshals requests into the
// store's operations (which validate and decode), streams dense tensors in chunks, and turns
// Status into gRPC status. Also holds the task's backups of other tasks' shards
// (CreateShardsRequest.backups: BackupStores), which CreateShards, ListShards, InspectShard and
// Replicate reach, and, once FailOverPs made them primaries, the dense pulls and pushes.
// Thread-safe.
class PsService : public v1::ParameterServer::Service {
 public:
  // `store` is not owned and must outlive the service.
  PsService(ParameterStore* store, const PsServiceOptions& options);

  // The task's backups of other tasks' shards (for the tensor data plane's Replicate).
  BackupStores* backups() { return &backups_; }

  // Filled into GetStatus answers; data_port is the tensor data plane's (0: none).
  void SetIdentity(const v1::TaskId& task, const std::string& address, int data_port);

  grpc::Status CreateShards(grpc::ServerContext* ctx, const v1::CreateShardsRequest* req,
                            v1::CreateShardsResponse* resp) override;
  grpc::Status PullDense(grpc::ServerContext* ctx, const v1::PullDenseRequest* req,
                         grpc::ServerWriter<v1::TensorChunk>* writer) override;
  grpc::Status PushDense(grpc::ServerContext* ctx, grpc::ServerReader<v1::PushDenseRequest>* reader,
                         v1::PushDenseResponse* resp) override;
  grpc::Status PullSparse(grpc::ServerContext* ctx, const v1::PullSparseRequest* req,
                          v1::PullSparseResponse* resp) override;
  grpc::Status PushSparse(grpc::ServerContext* ctx, const v1::PushSparseRequest* req,
                          v1::PushSparseResponse* resp) override;
  grpc::Status ListShards(grpc::ServerContext* ctx, const v1::ListShardsRequest* req,
                          v1::ListShardsResponse* resp) override;
  grpc::Status InspectShard(grpc::ServerContext* ctx, const v1::InspectShardRequest* req,
                            v1::InspectShardResponse* resp) override;
  grpc::Status GetStatus(grpc::ServerContext* ctx, const v1::GetStatusRequest* req,
                         v1::TaskStatus* resp) override;
  grpc::Status SaveShards(grpc::ServerContext* ctx, const v1::SaveShardsRequest* req,
                          v1::SaveShardsResponse* resp) override;
  grpc::Status RestoreShards(grpc::ServerContext* ctx, const v1::RestoreShardsRequest* req,
                             v1::RestoreShardsResponse* resp) override;
  grpc::Status Replicate(grpc::ServerContext* ctx, grpc::ServerReader<v1::ReplicateRequest>* reader,
                         v1::ReplicateResponse* resp) override;
  grpc::Status ReplicateSparse(grpc::ServerContext* ctx, const v1::ReplicateSparseRequest* req,
                               v1::ReplicateSparseResponse* resp) override;
  grpc::Status FailOverPs(grpc::ServerContext* ctx, const v1::FailOverPsRequest* req,
                          v1::FailOverPsResponse* resp) override;
  grpc::Status RebuildBackup(grpc::ServerContext* ctx, const v1::RebuildBackupRequest* req,
                             v1::RebuildBackupResponse* resp) override;
  grpc::Status InstallReplica(grpc::ServerContext* ctx,
                              grpc::ServerReader<v1::InstallReplicaRequest>* reader,
                              v1::InstallReplicaResponse* resp) override;

 private:
  // This task's index once SetIdentity named a ps task, else -1.
  int SelfIndex() ABSL_LOCKS_EXCLUDED(mu_);
  // InstallReplica's table form, after `first` (its table_replica) was read and the caller
  // allowed: the rows' bytes read, checked against their announced size, and installed in
  // `store` (ParameterStore::InstallTableReplica).
  grpc::Status InstallTableReplica(ParameterStore* store, const v1::InstallReplicaRequest& first,
                                   grpc::ServerReader<v1::InstallReplicaRequest>* reader,
                                   v1::InstallReplicaResponse* resp);

  ParameterStore* const store_;  // Not owned.
  const PsServiceOptions options_;
  BackupStores backups_;
  DensePushPool pushes_;
  const absl::Time start_time_;
  absl::Mutex mu_;
  v1::TaskId task_ ABSL_GUARDED_BY(mu_);
  std::string address_ ABSL_GUARDED_BY(mu_);
  int data_port_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_PS_SERVICE_H_
