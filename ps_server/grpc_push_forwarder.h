#ifndef PSCLUSTER_PS_SERVER_GRPC_PUSH_FORWARDER_H_
#define PSCLUSTER_PS_SERVER_GRPC_PUSH_FORWARDER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/grpc_channel.h"
#include "proto/ps_service.grpc.pb.h"
#include "ps_server/push_forwarder.h"

namespace pscluster {

// A primary ps task's forwards to its backups over gRPC (ParameterServer.Replicate): the
// header, then each gradient in chunks, one stream per backup task, all backups at once.
// Thread-safe.
class GrpcPushForwarder : public PushForwarder {
 public:
  // `self`: this task's index, sent as ReplicateHeader.primary_ps_task (with TLS, the backup
  // checks it against this task's certificate). `channel`: TLS and message limits.
  GrpcPushForwarder(int self, GrpcChannelOptions channel,
                    absl::Duration timeout = absl::Seconds(60));

  // Where the ps tasks are (CreateShardsRequest.ps_addresses); a changed address gets a new
  // channel.
  void SetAddresses(const std::vector<std::string>& addresses);

  absl::Status Forward(const ForwardList& list) override;

 private:
  // Sends one forward and waits for its answer.
  absl::Status ForwardOne(const DenseForward& forward);
  // The stub for ps task `ps`, or null when its address is unknown.
  std::shared_ptr<v1::ParameterServer::Stub> StubFor(int ps);

  static constexpr int64_t kChunkBytes = 1 << 20;
  const int self_;
  const GrpcChannelOptions channel_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::vector<std::string> addresses_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::pair<std::string, std::shared_ptr<v1::ParameterServer::Stub>>> stubs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_GRPC_PUSH_FORWARDER_H_
