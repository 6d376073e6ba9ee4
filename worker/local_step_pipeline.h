#ifndef PSCLUSTER_WORKER_LOCAL_STEP_PIPELINE_H_
#define PSCLUSTER_WORKER_LOCAL_STEP_PIPELINE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "client/parameter_client.h"
#include "common/thread_pool.h"
#include "kernels/kernels.h"
#include "model/model.h"
#include "proto/model.pb.h"
#include "ps_server/optimizer.h"
#include "worker/step_pipeline.h"

namespace pscluster {

// The local-steps mode (SyncOptions.local_steps = K, async only; docs/training.md, "Local
// steps"), in the line of PaddlePaddle's GEO-SGD: the worker keeps its own copy of the dense
// variables on its device and takes its steps there, each updated with the variable's own
// optimizer (as the ps would apply it: Kernels::ApplyUpdate with Optimizer::ConstantsAt), with
// no request on the step's path. Every K steps it pushes the change those steps made (local -
// the values it last pulled) as a delta, which the ps adds to its values, and pulls the result;
// both happen on a communication thread while the next K steps compute, and the pulled values
// are folded in when they arrive: local = pulled + (what this worker changed since it took the
// delta). A step's parameters miss other workers' changes of at most 2K steps of theirs.
//
// The optimizer state (momentum, Adam's m and v) lives on the worker and is not checkpointed;
// the ps's slots stay at their initial values. Adam's bias correction counts this worker's
// local updates; a learning-rate decay counts the steps of every worker as the ps's does (its
// update count is every worker's pushes): the step the chief granted times the workers.
//
// Drain() pushes every local change and pulls (a checkpoint or the end of training sees all
// of them). A model without embedding tables, whose optimizers are sgd, momentum, adam or
// moving_average (INVALID_ARGUMENT / UNIMPLEMENTED otherwise, at Create).
//
// Several towers (the GPUs of one worker): each step's batch is split over them as
// StepPipeline splits it, their gradients are summed with the TowerReducer (each scaled by its
// share of the batch: DistributedDataParallel's arithmetic, one gradient of the whole batch)
// and every tower applies the same update to its own copy, so the copies stay equal, bit for
// bit. Tower 0's change is the worker's delta; the pulled values are folded into every tower.
// The ps sees one worker: all-reduce inside the host every step, the ps across hosts every K.
//
// Thread-compatible, as StepRunner; the communication thread is its own.
class LocalStepPipeline : public StepRunner {
 public:
  // `towers` (one model per device, same config), `reducer` (over the towers' kernels; null
  // with one tower) and `client` are not owned; they outlive the pipeline. `spec` gives each
  // dense variable's optimizer. Each delta is divided by `num_workers` (as PaddlePaddle's
  // GEO-SGD divides by its trainers): a round of every worker's deltas moves the model by their
  // mean.
  static absl::StatusOr<std::unique_ptr<LocalStepPipeline>> Create(
      std::vector<Model*> towers, TowerReducer* reducer, ParameterClient* client,
      const v1::ModelSpec& spec, int local_steps, int num_workers = 1);
  ~LocalStepPipeline() override;

  absl::Status Stage(int64_t index, const PreparedBatch& batch) override;
  absl::Status StageGathered(int64_t index, const Dataset& data,
                             const std::vector<int64_t>& positions) override;
  bool can_gather() const override { return true; }
  // Starts a sync first when the last K steps were not pushed yet, then computes and updates
  // the local copy. Fails before computing anything (the step can be run again): the first
  // pull's error, or the error of a sync (kept, and sent again with its request ids).
  absl::Status Run(int64_t index, int64_t tag, int64_t pull_step,
                   const PreparedBatch& batch) override;
  absl::Status Drain() override;
  // 1 while a delta is being pushed, and 1 more while local steps are not pushed.
  int pushes_in_flight() const override;
  // Forgets the local copy and its changes (the ps was restored): the next Run pulls.
  void Invalidate() override;
  std::vector<StepOutcome> TakeOutcomes() override;
  // The most local steps a step's parameters were from their last refresh from the ps.
  int max_staleness() const override;

 private:
  // Consecutive dense variables with the same optimizer: updated with one kernel.
  struct UpdateGroup {
    int64_t offset = 0;  // in the packed parameters
    int64_t size = 0;
    std::unique_ptr<Optimizer> optimizer;
    ElementwiseUpdate::Kind kind = ElementwiseUpdate::Kind::kSgd;
  };
  static constexpr int kOutputSlots = 3;
  // One device's copy of the variables and what updates it.
  struct Tower {
    Model* model = nullptr;  // Not owned.
    Kernels* k = nullptr;    // the model's
    // Device: the local copy, the values last pulled (base), the local copy when the sync in
    // flight took its delta (snapshot), and the pulled values being folded in.
    float* local = nullptr;
    float* base = nullptr;
    float* snap = nullptr;
    float* fresh = nullptr;
    // Each update group's optimizer slots (null where it has fewer).
    std::vector<float*> slot0;
    std::vector<float*> slot1;
    std::vector<void*> owned;
    std::unique_ptr<Kernels::Event> fresh_uploaded;
    std::unique_ptr<Kernels::Event> fresh_consumed;
    Model::Outputs outputs[kOutputSlots];
    std::unique_ptr<Kernels::Event> outputs_ready[kOutputSlots];
  };
  // A step whose outputs are being downloaded.
  struct Pending {
    int64_t index = 0;
    int64_t tag = 0;
    int slot = 0;
    std::vector<float> labels;
    std::vector<int> tower_sizes;
    int staleness = 0;
  };
  enum class Sync { kNone, kPushing, kDone, kFailed };

  LocalStepPipeline(std::vector<Model*> towers, TowerReducer* reducer, ParameterClient* client,
                    int local_steps, int num_workers);
  absl::Status Allocate(const v1::ModelSpec& spec);
  absl::Status AllocateTower(Tower* t);
  // Issues the upload of host_fresh_ into `device` (t.fresh or t.base) on tower t, ordered
  // after the last fold-in and before what the compute stream does next.
  void UploadFresh(Tower& t, float* device);
  // Pulls every variable into host_fresh_ (caller thread).
  absl::Status PullFresh();
  // The delta (snapshot - base) in host_delta_ pushed with the sync's ticket, then the values
  // pulled into host_fresh_.
  absl::Status PushAndPull();
  void CommThread();
  // Takes the delta of the local steps so far and hands it to the communication thread.
  void StartSync(int64_t tag);
  // Folds in a finished sync: with `wait`, waits for the one in flight. The sync's error (kept
  // for a retry).
  absl::Status Merge(bool wait);
  // Sends a failed sync again, on this thread; OK when there is none.
  absl::Status RetrySync();
  // Issues the local optimizer's update of every variable of every tower with the step's
  // gradients (summed over the towers).
  absl::Status ApplyLocalUpdate(int64_t tag);
  // Adds the outcomes of pending steps to outcomes_: all of them, or those older than `keep`
  // steps (waiting for their outputs).
  void CollectOutcomes(size_t keep);

  std::vector<Tower> towers_;
  const std::vector<Model*> models_;  // towers_[i].model, for the staging functions
  TowerReducer* const reducer_;       // Not owned; null with one tower.
  ParameterClient* const client_;     // Not owned.
  Model* const model_;                // tower 0's
  Kernels* const k_;                  // tower 0's
  const int local_steps_;
  const int num_workers_;
  const float delta_scale_;  // 1 / the number of workers
  const int64_t n_;          // dense_total
  std::vector<UpdateGroup> groups_;
  ThreadPool stage_;  // one thread per tower beyond the first

  // Tower 0's device: the delta; host (page-locked): the delta, and the pulled values every
  // tower uploads.
  float* delta_ = nullptr;
  float* host_delta_ = nullptr;
  float* host_fresh_ = nullptr;
  std::unique_ptr<Kernels::Event> delta_downloaded_;

  // Training thread only.
  bool have_params_ = false;
  int64_t local_updates_ = 0;
  int64_t last_tag_ = 0;
  int since_refresh_ = 0;  // local steps since the parameters were last refreshed
  std::deque<Pending> pending_;
  // The sync's push ids, kept for its retry: used by the communication thread while the sync is
  // kPushing, by the training thread otherwise.
  PushTicket ticket_;

  mutable absl::Mutex mu_;
  int since_sync_ ABSL_GUARDED_BY(mu_) = 0;  // local steps not yet in a delta
  Sync sync_ ABSL_GUARDED_BY(mu_) = Sync::kNone;
  bool queued_ ABSL_GUARDED_BY(mu_) = false;  // a sync waits for the communication thread
  absl::Status sync_status_ ABSL_GUARDED_BY(mu_);
  int64_t sync_tag_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<StepOutcome> outcomes_ ABSL_GUARDED_BY(mu_);
  int max_staleness_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread comm_thread_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_LOCAL_STEP_PIPELINE_H_
