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
  // A pause after every step, for tests that need a slow worker. Zero in real use.
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
  // Tells the chief that steps up to `step` - 1 are done (SYNC: global step `step` - 1).
  // Token (sync/ssp), pull, compute, push of one step. *step gets the step computed, or -1
  // when the chief says training is over.
  absl::Status RunStep(bool sync, int64_t last_done_step, Model& model,
                       const PreparedBatch& current, std::vector<std::vector<float>>* params,
                       std::vector<std::vector<float>>* rows, StepResult* result, int64_t* step,
                       const std::function<bool()>& stop);
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
};

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_TRAINER_H_
