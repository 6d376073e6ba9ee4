#ifndef PSCLUSTER_WORKER_STEP_POLICY_H_
#define PSCLUSTER_WORKER_STEP_POLICY_H_

#include <cstdint>
#include <memory>

#include "proto/ps_service.pb.h"
#include "worker/step_source.h"

namespace pscluster {

// What the training loop does next.
struct StepPlan {
  // Training is over for this worker.
  bool end = false;
  // The step the pushes carry (SYNC: the global step, which the ps accumulators check; SSP:
  // the chief's step; ASYNC: this worker's own step count).
  int64_t tag = 0;
  // SYNC: the step the pulled values are for (see PullDenseRequest.step); -1: the newest.
  int64_t pull_step = -1;
  // The batch: batch `batch` of epoch `epoch` of this worker's shard.
  int64_t epoch = 0;
  int64_t batch = 0;
  // SYNC: a new generation (a recovery sent the global step back, or the chief restarted):
  // what was computed or fetched before belongs to abandoned steps.
  bool new_generation = false;
};

// How a training mode turns the chief's answers into steps and batches: the one part of the
// training loop that differs between SYNC, SSP and ASYNC (docs/training.md).
//
//   SYNC   the token's global step s picks the batch (batch s mod B of epoch s / B, B batches
//          per epoch), so a step computed again after a recovery uses the same batch; the loop
//          reports every step, and steps never overlap (a step's pull needs the step before it
//          complete on every ps task).
//   SSP    the worker walks its epochs in order; the token (the staleness bound) gives the step
//          the pushes carry; it reports every step; steps may overlap.
//   ASYNC  the worker walks its epochs in order and numbers its own steps; the token is the
//          gate (checkpoints and recoveries hold it); it reports every few seconds; steps may
//          overlap.
// Training ends after epochs * B steps of this worker (SYNC: global steps), after max_steps,
// or when the chief says so.
//
// Thread-compatible.
class StepPolicy {
 public:
  virtual ~StepPolicy() = default;

  // The step to run for the chief's `grant`.
  virtual StepPlan Plan(const StepGrant& grant) = 0;
  // The loop ran `plan` (its compute issued and its pushes handed over).
  virtual void Done(const StepPlan& plan) = 0;

  // What the next token request says: the last step done, and (SYNC) the generation.
  virtual int64_t last_done() const = 0;
  virtual int64_t generation() const = 0;
  // Steps done by this worker (for reports: the next step to do).
  virtual int64_t steps_done() const = 0;

  virtual bool report_every_step() const = 0;
  // Whether steps may overlap (a pipeline staleness above 0).
  virtual bool allows_overlap() const = 0;
};

// REQUIRES: batches_per_epoch >= 1, epochs >= 1; max_steps 0 means no limit.
std::unique_ptr<StepPolicy> NewStepPolicy(v1::UpdateMode mode, int64_t batches_per_epoch,
                                          int epochs, int64_t max_steps);

}  // namespace pscluster

#endif  // PSCLUSTER_WORKER_STEP_POLICY_H_
