#ifndef PSCLUSTER_CHIEF_IN_PROCESS_CHIEF_H_
#define PSCLUSTER_CHIEF_IN_PROCESS_CHIEF_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "chief/coordinator.h"
#include "chief/in_process_chief_client.h"
#include "common/clock.h"
#include "proto/coordinator_service.pb.h"
#include "proto/model_config.pb.h"
#include "ps_server/in_process_ps_transport.h"
#include "storage/crash_points.h"

namespace pscluster {

// A real chief whose ps tasks live in this process: a Coordinator over ParameterStores behind
// an InProcessPsTransport, every ps task and worker registered, the variables created and
// initialized by the chief, as a cluster's chief does at start. The chief of the training
// loop's tests and of train_bench's pipelined loop: tokens, the async gate, the checks of step
// reports and checkpoints are the Coordinator's own, reached through an InProcessChiefClient
// as a worker reaches the chief over gRPC.
//
// Time is, unless the options give a clock, a FakeClock that moves only when the caller
// advances it (Waits::kBlock): the chief's waits end when what they wait for happens, and its
// timers (periodic evaluations and checkpoints) never fire on their own. On any clock no task is
// ever found missing: nothing here sends heartbeats. Thread-safe as the Coordinator is.
class InProcessChief {
 public:
  struct Options {
    // The model the workers train (the chief derives its variables and places them).
    v1::ModelConfig config;
    v1::TrainingOptions training;
    v1::SyncOptions sync;
    v1::PlacementOptions placement;
    int num_ps = 2;
    int num_workers = 1;
    ParameterStoreOptions store;
    // Checkpoints (empty: none).
    std::string checkpoint_dir;
    // Not owned; may be null.
    CrashPoints* crash_points = nullptr;
    // The chief's clock; not owned. Null: the blocking FakeClock above. (Its waits check their
    // condition every millisecond: a benchmark gives the real clock.)
    Clock* clock = nullptr;
  };

  // Starts the chief, registers every task and waits (60 s of real time at most) until the
  // model is ready. The chief's own error when it refuses the options or fails to create the
  // variables.
  static absl::StatusOr<std::unique_ptr<InProcessChief>> Start(const Options& options);
  // Stops the chief. Whatever uses its clients must be done by then.
  ~InProcessChief();

  // What the chief serves a worker (GetModel): the model, its placement, the training and
  // sync options.
  const v1::GetModelResponse& model() const { return model_; }
  Coordinator& coordinator() { return *coordinator_; }
  // The ps tasks (Share() for another client of the same stores).
  InProcessPsTransport& stores() { return *stores_; }
  // A client of the chief for worker `worker` (or any caller); owned by this object.
  ChiefClient* client(int worker);

 private:
  InProcessChief();

  FakeClock clock_;
  std::unique_ptr<InProcessPsTransport> stores_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::unique_ptr<InProcessChiefClient>> clients_;
  v1::GetModelResponse model_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_CHIEF_IN_PROCESS_CHIEF_H_
