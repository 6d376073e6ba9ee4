#ifndef PSCLUSTER_WORKER_STEP_PIPELINE_H_
#define PSCLUSTER_WORKER_STEP_PIPELINE_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/parameter_client.h"
#include "common/clock.h"
#include "common/thread_pool.h"
#include "kernels/kernels.h"
#include "model/data/dataset.h"
#include "model/model.h"

namespace pscluster {

// A batch and its deduplicated sparse ids, assembled ahead of the step that uses it.
struct PreparedBatch {
  bool valid = false;
  Dataset data;
  SparseInput sparse;
};

// The host view of a prepared batch.
Batch AsBatch(const Dataset& d);

struct StepPipelineOptions {
  // How many of this worker's own steps' pushes the parameters of a step may miss. 0: each
  // step pulls after the previous step's push completed (no overlap between steps; what sync
  // mode needs). 1: the parameters of step s + 1 are pulled, and uploaded, while step s
  // computes and pushes; they then hold every push up to step s - 1.
  int staleness = 0;
  // Threads that run the per-layer pull and push requests at once.
  int comm_threads = 4;
  // Pull and push layer by layer (the first layer's parameters first, the last layer's
  // gradients first), so that communication overlaps the forward and backward passes. Without
  // it, one request per ps task carries every variable. -1: layer by layer when staleness is 0
  // (where a step waits for its own pull and push), whole otherwise (the requests are off the
  // step's path, and fewer round trips cost the ps tasks less).
  int per_layer = -1;
  // A pause between computing a step and pushing its gradients (tests: a straggler).
  absl::Duration push_delay = absl::ZeroDuration();
  // The time of push_delay. Not owned.
  Clock* clock = Clock::Real();
};

// What a step computed, once its outputs reached the host.
struct StepOutcome {
  int64_t index = 0;  // in this pipeline's sequence of steps
  int64_t tag = 0;    // the step its pushes carried
  int examples = 0;
  double loss_sum = 0;  // over the examples
  int64_t correct = 0;
  // How many of this worker's earlier steps' pushes its parameters missed.
  int staleness = 0;
};

// Adds the first `n` examples of a step's downloaded outputs to `out`: their loss, whether
// each was predicted right against labels[0, n) (softmax: the argmax; sigmoid: logit > 0
// against label > 0.5), and the count.
void CountOutputs(const Model::Outputs& outputs, int n, const float* labels, bool softmax,
                  StepOutcome* out);

// Splits a batch of `b` examples over `n` towers: sizes as equal as possible, the first ones
// larger.
std::vector<int> SplitOverTowers(int b, int n);

// Stages `batch` into input slot `slot` of every tower, split by SplitOverTowers (one tower:
// the batch whole, with its sparse part). INVALID_ARGUMENT for a bad batch, or one too small
// to give every tower an example.
absl::Status StageOverTowers(const std::vector<Model*>& towers, int slot,
                             const PreparedBatch& batch);

// The same for a model without tables, the batch being examples `positions` of `data`, each
// tower gathering its part into input slot index % Model::kInputSlots (the augmentation drawn
// for step `index`); the towers in parallel on `pool`, or in turn when it is null.
absl::Status StageGatheredOverTowers(const std::vector<Model*>& towers, int64_t index,
                                     const Dataset& data, const std::vector<int64_t>& positions,
                                     ThreadPool* pool);

// How the training loop (Trainer) runs its steps, whatever moves the parameters: StepPipeline
// (pull, compute, push every step) or LocalStepPipeline (local steps, then a delta).
// Thread-compatible, with StepPipeline's contract for each method.
class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual absl::Status Stage(int64_t index, const PreparedBatch& batch) = 0;
  virtual absl::Status StageGathered(int64_t index, const Dataset& data,
                                     const std::vector<int64_t>& positions) = 0;
  virtual bool can_gather() const = 0;
  virtual absl::Status Run(int64_t index, int64_t tag, int64_t pull_step,
                           const PreparedBatch& batch) = 0;
  virtual absl::Status Drain() = 0;
  virtual int pushes_in_flight() const = 0;
  virtual void Invalidate() = 0;
  virtual std::vector<StepOutcome> TakeOutcomes() = 0;
  virtual int max_staleness() const = 0;
};

// The pull -> compute -> push of a worker's steps, overlapped (docs/training.md, "The pipelined
// step"):
//  - parameters are pulled layer by layer, first layer first, on communication threads, into
//    page-locked host memory, and uploaded to each device as they arrive (upload stream); the
//    forward pass waits for a layer's parameters only when it reaches that layer;
//  - gradients are downloaded as backward produces them (last layer first, download stream)
//    and each layer's are pushed as soon as they are on the host;
//  - with staleness k >= 1, the parameters of step s + 1 are pulled while step s computes and
//    pushes, once the pushes of step s - k are complete;
//  - the batch's upload and the previous step's output downloads overlap compute;
//  - with several towers (GPUs of one worker), the batch is split across them, their gradients
//    are summed with the TowerReducer (each scaled by its share of the batch) and pushed once.
// Every buffer is allocated at creation (rows of sparse tables grow to the largest batch), so
// the steady state allocates no device or page-locked memory.
//
// A push that fails (after the ParameterClient's own retries) stalls the pipeline: the next
// Run returns its error and, once called again, first sends that push again with the same
// request ids, so a push that did arrive is not applied twice.
//
// Thread-compatible: Stage, Run, Drain and the rest are called by one thread (the training
// loop); the pipeline's own threads do the communication.
class StepPipeline : public StepRunner {
 public:
  // `towers` (one model per device, same config; not owned), `reducer` (over the towers'
  // kernels; null with one tower; not owned) and `client` (not owned) outlive the pipeline.
  // INVALID_ARGUMENT for no tower, towers of different models, or towers with embedding
  // tables (a model with tables runs on one device).
  static absl::StatusOr<std::unique_ptr<StepPipeline>> Create(std::vector<Model*> towers,
                                                              TowerReducer* reducer,
                                                              ParameterClient* client,
                                                              const StepPipelineOptions& options);
  ~StepPipeline() override;

  // Copies the batch of step `index` (0, 1, ... in this pipeline) into the towers' input slot
  // and starts its upload. Call before Run(index); it may run while step index - 1 computes.
  // INVALID_ARGUMENT for a bad batch (too large, labels out of range).
  absl::Status Stage(int64_t index, const PreparedBatch& batch) override;
  // As Stage for a model without tables: the batch is examples `positions` of `data`, gathered
  // straight into the towers' page-locked staging areas, the towers in parallel. May run on
  // another thread than Run (the batch feeder's), for an index whose slot Run is not using.
  // The model's augmentation, if any, is drawn for step `index`.
  absl::Status StageGathered(int64_t index, const Dataset& data,
                             const std::vector<int64_t>& positions) override;
  // Whether StageGathered can be used (the model has no tables).
  bool can_gather() const override { return tables_.empty(); }

  // Runs step `index` on its staged batch: pulls (or takes the prefetched) parameters for
  // `pull_step` (the sync step the values are for; -1 for the newest), issues forward and
  // backward, and hands the gradients to the push thread, tagged `tag`. With staleness 0 it
  // returns once the pushes are complete; otherwise at once, after asking for the next step's
  // parameters. Errors of the pull, of the compute, or of an earlier push.
  absl::Status Run(int64_t index, int64_t tag, int64_t pull_step,
                   const PreparedBatch& batch) override;

  // Sends a push that failed again (with its ids), then waits until every push in flight has
  // completed; returns the first error of one.
  absl::Status Drain() override;
  // Steps whose pushes are not complete.
  int pushes_in_flight() const override;
  // Forgets prefetched parameters (the next Run pulls anew), e.g. after the ps tasks were
  // restored or the chief sent the global step back. Waits for the pull in flight.
  void Invalidate() override;

  // The outcomes of steps whose outputs reached the host since the last call, in order.
  std::vector<StepOutcome> TakeOutcomes() override;
  // The most staleness any step had so far.
  int max_staleness() const override;

 private:
  struct Layer {
    std::vector<std::string> variables;  // dense variables read by this layer
    std::vector<int> indices;            // their indices in the model
  };
  // Parameters of one step in flight: host (page-locked) and each tower's device copy.
  struct ParamSlot {
    float* host = nullptr;
    std::vector<float*> device;  // per tower (== host on the CPU)
    // Per table: rows of the step's unique ids, host (grown) and device (the model's buffer).
    std::vector<std::vector<float>> host_rows;
    std::vector<std::vector<float*>> device_rows;  // [tower][table]
    // Per tower, per layer (and one more for the tables): the upload is done.
    std::vector<std::vector<std::unique_ptr<Kernels::Event>>> uploaded;
    // Per tower: the compute stream is done reading this slot's parameters.
    std::vector<std::unique_ptr<Kernels::Event>> consumed;
    // Host side: layers (and tables, at num_layers) pulled for `index`, or the pull's error.
    int64_t index = -1;
    std::vector<bool> ready;
    absl::Status error;
    int staleness = 0;
    bool pulling = false;
  };
  // Gradients of one step being pushed.
  struct GradSlot {
    float* host = nullptr;          // packed dense gradients (page-locked)
    std::vector<float*> host_rows;  // per table (page-locked, grown)
    std::vector<int64_t> host_rows_capacity;
    std::vector<std::unique_ptr<Kernels::Event>> downloaded;  // per variable (tower 0)
    // Per tower: outputs (loss, predictions, logits) and their event.
    std::vector<Model::Outputs> outputs;
    std::vector<std::unique_ptr<Kernels::Event>> outputs_ready;
  };
  // One step handed to the push thread.
  struct PushJob {
    int64_t index = 0;
    int64_t tag = 0;
    int grad_slot = 0;
    std::vector<int> tower_sizes;
    std::vector<float> labels;  // for the correct count
    std::vector<int64_t> unique_ids;
    int staleness = 0;
    // The ids of its push requests, kept for a retry.
    std::vector<PushTicket> tickets;  // per layer, then per table
  };

  StepPipeline(std::vector<Model*> towers, TowerReducer* reducer, ParameterClient* client,
               const StepPipelineOptions& options);
  absl::Status Allocate();
  // Starts pulling the parameters of step `index` (rows for `unique_ids`) into its slot.
  void StartPull(int64_t index, int64_t pull_step, std::vector<int64_t> unique_ids);
  void PullThread();
  absl::Status PullInto(ParamSlot& slot, int64_t pull_step, const std::vector<int64_t>& ids);
  void PushThread();
  absl::Status Push(PushJob& job);
  // Sends the failed push again, on this thread; OK when there is none.
  absl::Status RetryFailedPush();
  // Adds the outcome of a pushed step (its outputs are on the host by then, so the wait for
  // them under the lock is short).
  void Collect(const PushJob& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until layer `layer` of slot `slot` is on the host for step `index`.
  absl::Status AwaitLayer(int slot, int64_t index, int layer);

  const std::vector<Model*> towers_;  // Not owned.
  TowerReducer* const reducer_;       // Not owned.
  ParameterClient* const client_;     // Not owned.
  const StepPipelineOptions options_;
  const bool on_host_;  // the CPU backend: device memory is host memory
  const bool per_layer_;
  std::vector<Layer> layers_;
  std::vector<std::string> tables_;
  std::vector<int> table_dims_;
  Kernels* k0_;  // tower 0's kernels

  ParamSlot params_[2];
  std::vector<GradSlot> grads_;  // staleness + 1 of them
  ThreadPool comm_;
  ThreadPool stage_;  // one thread per tower beyond the first

  mutable absl::Mutex mu_;
  // Pull requests for the pull thread: (index, pull_step, ids).
  struct PullRequest {
    int64_t index;
    int64_t pull_step;
    std::vector<int64_t> ids;
  };
  std::deque<PullRequest> pull_queue_ ABSL_GUARDED_BY(mu_);
  std::deque<PushJob> push_queue_ ABSL_GUARDED_BY(mu_);
  // Push jobs handed over and not complete (queued or running).
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  // Steps whose pushes are complete: 0 .. pushed_ - 1.
  int64_t pushed_ ABSL_GUARDED_BY(mu_) = 0;
  // A push that failed, kept for its retry; its error.
  std::unique_ptr<PushJob> failed_ ABSL_GUARDED_BY(mu_);
  absl::Status failed_status_ ABSL_GUARDED_BY(mu_);
  // The failed push is being sent again (by RetryFailedPush): the push thread waits.
  bool retrying_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<StepOutcome> outcomes_ ABSL_GUARDED_BY(mu_);
  int max_staleness_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread pull_thread_;
  std::thread push_thread_;
};

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_STEP_PIPELINE_H_
