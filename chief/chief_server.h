#ifndef PSCLUSTER_CHIEF_CHIEF_SERVER_H_
#define PSCLUSTER_CHIEF_CHIEF_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "chief/task_registry.h"
#include "client/grpc_ps_transport.h"
#include "common/clock.h"
#include "common/daemon.h"
#include "common/service_host.h"
#include "proto/cluster.pb.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "proto/model.pb.h"

namespace pscluster {

struct ChiefOptions {
  // The cluster; the task must be chief:0.
  v1::ClusterConfig cluster;
  // Server settings; `address` is taken from the cluster spec.
  ServiceHostOptions host;
  // Tasks are told to send heartbeats this often.
  absl::Duration heartbeat_interval = absl::Seconds(1);
  // A task without a heartbeat for this long is MISSING.
  absl::Duration heartbeat_timeout = absl::Seconds(5);
  // The variables and tables the ps tasks hold. Empty: the chief only tracks membership.
  v1::ModelSpec model;
  // How variables are spread over the ps tasks.
  v1::PlacementOptions placement;
  // Update mode the ps tasks are created with.
  v1::SyncOptions sync;
  // Settings of the chief's own calls to the ps tasks.
  GrpcPsTransportOptions ps_transport;
};

// The chief daemon: serves the Coordinator service. Its first job: wait until every ps task
// has registered, compute the placement of the model's variables, create and initialize every
// variable on its ps tasks (harmless if repeated), then serve the model, the placement and the
// ps addresses to workers and tools (GetModel).
//
// Lifecycle: Create() -> Start() -> Stop() (any thread) -> Wait(). Thread-safe.
class ChiefServer : public Daemon, private v1::Coordinator::Service {
 public:
  static absl::StatusOr<std::unique_ptr<ChiefServer>> Create(const ChiefOptions& options);
  ~ChiefServer() override;

  absl::Status Start() override;
  void Stop() override;
  absl::Status Wait() override;

  // The address actually served (valid after Start).
  std::string address() const;

 private:
  explicit ChiefServer(const ChiefOptions& options);

  grpc::Status RegisterTask(grpc::ServerContext* ctx, const v1::RegisterTaskRequest* req,
                            v1::RegisterTaskResponse* resp) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const v1::HeartbeatRequest* req,
                         v1::HeartbeatResponse* resp) override;
  grpc::Status GetClusterStatus(grpc::ServerContext* ctx, const v1::GetClusterStatusRequest* req,
                                v1::ClusterStatus* resp) override;
  grpc::Status GetModel(grpc::ServerContext* ctx, const v1::GetModelRequest* req,
                        v1::GetModelResponse* resp) override;

  // Waits for the ps tasks, places and creates the variables. Runs on init_thread_.
  void InitializeModel();
  bool stop_requested() const;

  const ChiefOptions options_;
  const absl::Time start_time_;
  TaskRegistry registry_;
  std::unique_ptr<ServiceHost> host_;
  std::thread init_thread_;
  mutable absl::Mutex mu_;
  bool stop_requested_ ABSL_GUARDED_BY(mu_) = false;
  // Set once every variable exists on its ps task.
  bool model_ready_ ABSL_GUARDED_BY(mu_) = false;
  std::string init_state_ ABSL_GUARDED_BY(mu_) = "waiting for the ps tasks";
  v1::GetModelResponse model_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_CHIEF_SERVER_H_
