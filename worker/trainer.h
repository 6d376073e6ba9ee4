#ifndef PSCLUSTER_WORKER_TRAINER_H_
#define PSCLUSTER_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/parameter_client.h"
#include "proto/coordinator_service.grpc.pb.h"
#include "worker/data/dataset.h"
#include "worker/kernels/kernels.h"
#include "worker/model.h"

namespace pscluster {

// A batch and its deduplicated sparse ids, assembled ahead of the step that uses it.
struct PreparedBatch {
  bool valid = false;
  Dataset data;
  SparseInput sparse;
};

struct TrainerOptions {
  int32_t worker = 0;
  int32_t num_workers = 1;
  // Report progress to the chief (and log it) this often.
  absl::Duration report_every = absl::Seconds(2);
  // Deadline of each call to the chief.
  absl::Duration rpc_timeout = absl::Seconds(30);
  // A pause between computing a step's gradients and pushing them, for tests that need a slow
  // worker (a straggler). Zero in real use.
  absl::Duration step_delay = absl::ZeroDuration();
  // A step failing with UNAVAILABLE, NOT_FOUND or DEADLINE_EXCEEDED (a task restarting or
  // being restored) is tried again this many times before Run gives up.
  int max_step_retries = 300;
  // Updated with the number of completed steps, for heartbeats. Not owned; may be null.
  std::atomic<int64_t>* step_counter = nullptr;
};

// A worker's training loop: for each batch of its shard of the data, (sync: wait for the
// token) -> pull the dense variables and the embedding rows the batch needs -> forward and
// backward -> push the gradients tagged with the step they came from -> report progress to
// the chief. The next batch is assembled on another thread while the current one computes.
//
// SYNC: the token's global step s picks the batch (batch s mod B of epoch s / B, B batches
// per epoch), so a run that a recovery sent back to a checkpoint's step computes the same
// steps from the same batches again. Training ends at epochs * B steps (or max_steps), or when
// the chief says so. ASYNC / SSP: each worker walks its epochs in order.
//
// Thread-compatible; steps() may be read from any thread.
class Trainer {
 public:
  // Not owned: client, kernels, chief; they must outlive the trainer. `train` is this worker's
  // shard.
  Trainer(const v1::GetModelResponse& model, Dataset train, ParameterClient* client,
          Kernels* kernels, v1::Coordinator::StubInterface* chief, const TrainerOptions& options);

  // Runs every epoch (or max_steps) unless stop() turns true; then tells the chief this worker
  // has finished.
  absl::Status Run(const std::function<bool()>& stop);

  int64_t steps() const { return steps_.load(); }
  int32_t epoch() const { return epoch_.load(); }

 private:
  // SYNC: the batch of each step is a function of the global step (see RunSync in the .cc).
  absl::Status RunSync(Model& model, int batch_size, const std::function<bool()>& stop);
  // Long-polls the chief for the token after `last_done_step`. OK with an empty response
  // when stop() turned true.
  absl::Status AcquireToken(int64_t last_done_step, v1::AcquireTokenResponse* resp,
                            const std::function<bool()>& stop);
  // Pull, forward and backward, push of one step's batch, tagged with `step`.
  absl::Status ComputeAndPush(int64_t step, Model& model, const PreparedBatch& current,
                              std::vector<std::vector<float>>* params,
                              std::vector<std::vector<float>>* rows, StepResult* result);
  // True (after a pause) when a failed step should be tried again: a task briefly gone, and
  // fewer than max_step_retries failures in a row.
  bool RetryStep(const absl::Status& status, int* failures) const;
  // Report, retried while the chief is UNAVAILABLE (restarting) unless stop() turns true.
  absl::Status ReportWithRetries(int64_t step, int64_t examples, double loss_sum,
                                 int64_t steps_in_report, bool finished,
                                 const std::function<bool()>& stop);
  absl::Status Report(int64_t step, int64_t examples, double loss_sum, int64_t steps_in_report,
                      bool finished);

  const v1::GetModelResponse model_;
  const Dataset train_;
  ParameterClient* const client_;             // Not owned.
  Kernels* const kernels_;                    // Not owned.
  v1::Coordinator::StubInterface* const chief_;  // Not owned.
  const TrainerOptions options_;
  std::atomic<int64_t> steps_{0};
  std::atomic<int32_t> epoch_{0};
  // SYNC: the generation of the last token (see AcquireTokenRequest.generation).
  int64_t generation_ = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_TRAINER_H_
