#ifndef PSCLUSTER_WORKER_TRAINER_H_
#define PSCLUSTER_WORKER_TRAINER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/parameter_client.h"
#include "common/clock.h"
#include "kernels/kernels.h"
#include "model/data/dataset.h"
#include "proto/coordinator_service.pb.h"
#include "worker/step_source.h"

namespace pscluster {

struct TrainerOptions {
  int32_t worker = 0;
  int32_t num_workers = 1;
  // Report progress to the chief this often (SYNC and SSP report every step), the first step at
  // once; the progress is logged every 2 s.
  absl::Duration report_every = absl::Seconds(2);
  // A pause between computing a step's gradients and pushing them, for tests that need a slow
  // worker (a straggler). Zero in real use.
  absl::Duration step_delay = absl::ZeroDuration();
  // A step failing with UNAVAILABLE, NOT_FOUND or DEADLINE_EXCEEDED (a task restarting or
  // being restored) is tried again this many times before Run gives up.
  int max_step_retries = 300;
  // Called before a failed step is tried again (for example to look up whether a ps task was
  // restarted at another address). May be empty.
  std::function<void()> before_retry;
  // ASYNC and SSP: how many of this worker's own steps' pushes the parameters of a step may
  // miss: the depth of the step pipeline (0: no overlap between steps). SYNC uses 0.
  int staleness = 1;
  // Threads that run the pull and push requests of a step at once.
  int comm_threads = 4;
  // Steps replayed from graphs where the device and the step allow (Model::set_capture): the
  // local-step pipeline's, whose steps wait for nothing from the ps.
  bool cuda_graphs = true;
  // Updated with the number of completed steps, for heartbeats. Not owned; may be null.
  std::atomic<int64_t>* step_counter = nullptr;
  // The time of reports, logs, pauses before retries and step_delay. Not owned.
  Clock* clock = Clock::Real();
};

// A worker's training loop, one for every mode: ask the chief for the next step (StepSource:
// token, staleness bound or gate) -> the step's policy picks the batch and the step the pushes
// carry (StepPolicy) -> the step pipeline pulls, computes and pushes (StepPipeline, which in
// ASYNC and SSP overlaps a step's pushes and the next step's pull with compute) -> progress to
// the chief. Failed steps (a task briefly gone) are tried again with the same batch. The next
// batch is assembled on another thread while the current one computes.
//
// Thread-compatible; steps(), epoch() and max_staleness() may be read from any thread.
class Trainer {
 public:
  // Not owned: client, the towers' kernels (one per device; several: a multi-GPU worker whose
  // batch is split across them), source; they must outlive the trainer. `train` is this
  // worker's shard.
  Trainer(const v1::GetModelResponse& model, Dataset train, ParameterClient* client,
          std::vector<Kernels*> towers, StepSource* source, const TrainerOptions& options);

  // Runs every epoch (or max_steps) unless stop() turns true; then tells the chief this worker
  // has finished.
  absl::Status Run(const std::function<bool()>& stop);

  int64_t steps() const { return steps_.load(); }
  // The step of the final report (the steps this worker did) once Run has told the chief it
  // finished; -1 before.
  int64_t finished_step() const { return finished_step_.load(); }
  int32_t epoch() const { return epoch_.load(); }
  int max_staleness() const { return max_staleness_.load(); }

 private:
  // True (after a pause) when a failed step should be tried again: a task briefly gone, and
  // fewer than max_step_retries failures in a row.
  bool RetryStep(const absl::Status& status, int* failures) const;
  // Report, retried while the chief is UNAVAILABLE (restarting) unless stop() turns true.
  absl::Status ReportWithRetries(const StepReport& report, const std::function<bool()>& stop);

  const v1::GetModelResponse model_;
  const Dataset train_;
  ParameterClient* const client_;       // Not owned.
  const std::vector<Kernels*> towers_;  // Not owned.
  StepSource* const source_;            // Not owned.
  const TrainerOptions options_;
  std::atomic<int64_t> steps_{0};
  std::atomic<int64_t> finished_step_{-1};
  std::atomic<int32_t> epoch_{0};
  std::atomic<int> max_staleness_{0};
};

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_TRAINER_H_
