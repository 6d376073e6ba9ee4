#ifndef PSCLUSTER_PS_SERVER_OPTIMIZER_H_
#define PSCLUSTER_PS_SERVER_OPTIMIZER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/model.pb.h"

namespace pscluster {

// Server-side optimizers: the update a parameter server applies to a variable (or to the rows
// of an embedding table) when a gradient arrives. Each one is element-wise and computes, in
// float, exactly what TensorFlow's training op of the same name computes. Below, `g` is the
// gradient, `var` the parameter, `lr` the learning rate, and every operation is per element.
//
// "sgd"       ApplyGradientDescent. No slots.
//               var -= lr * g
//
// "momentum"  ApplyMomentum. Slot "momentum" (starts at 0).
//               momentum_slot = momentum * momentum_slot + g
//               var -= lr * momentum_slot                            (use_nesterov = false)
//               var -= lr * g + lr * momentum * momentum_slot        (use_nesterov = true)
//
// "adagrad"   ApplyAdagradV2. Slot "accumulator" (starts at initial_accumulator_value).
//               accumulator += g^2
//               var -= lr * g / (sqrt(accumulator) + epsilon)
//
// "adam"      ApplyAdam (use_nesterov = false). Slots "m" and "v" (both start at 0).
//               lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)
//               m += (1 - beta1) * (g - m)
//               v += (1 - beta2) * (g^2 - v)
//               var -= lr_t * m / (sqrt(v) + epsilon)
//
// "ftrl"      ApplyFtrl, with p = learning_rate_power. Slots "accumulator" (starts at
//             initial_accumulator_value) and "linear" (starts at 0).
//               accum_new = accumulator + g^2
//               linear += g - (accum_new^(-p) - accumulator^(-p)) / lr * var
//               quadratic = accum_new^(-p) / lr + 2 * l2
//               var = |linear| > l1 ? (sign(linear) * l1 - linear) / quadratic : 0
//               accumulator = accum_new
//
// "rmsprop"   ApplyRMSProp, or ApplyCenteredRMSProp when `centered`. Slots "ms", "mom" and,
//             when centered, "mg" (all start at 0, as in Keras; TF1's RMSPropOptimizer started
//             "ms" at 1).
//               ms += (1 - rho) * (g^2 - ms)
//               mg += (1 - rho) * (g - mg)                           (centered only)
//               denom = ms + epsilon                                 (plain)
//               denom = ms - mg^2 + epsilon                          (centered)
//               mom = momentum * mom + lr * g / sqrt(denom)
//               var -= mom
//             Note that epsilon is inside the square root, as in the training ops (Keras's
//             momentum-free fast path puts it outside).
//
// "moving_average"  assign_moving_average: `g` is an observation, not a gradient (batch
//             normalization's moving statistics). No slots; no learning rate or decay.
//               var -= (1 - momentum) * (var - g)
//
// Defaults. proto3 cannot tell an unset field from 0, so a field that is 0 where 0 is not a
// meaningful value takes TensorFlow's Keras default instead:
//   adagrad:  initial_accumulator_value 0.1, epsilon 1e-7
//   adam:     beta1 0.9, beta2 0.999, epsilon 1e-7
//   ftrl:     learning_rate_power -0.5, initial_accumulator_value 0.1
//   rmsprop:  rho 0.9, epsilon 1e-7
// (so these cannot be set to exactly 0; a tiny positive value does the same job). Every other
// field means what it says when 0: momentum 0, l1 0, l2 0, use_nesterov/centered false. The
// learning rate has no default and must be set.
//
// Validation. Create returns INVALID_ARGUMENT, naming the field and its value, when: no
// optimizer is set; learning_rate is not a finite number > 0; momentum < 0 (moving_average:
// outside [0, 1)); a decay on moving_average; beta1, beta2 or rho
// is outside [0, 1); epsilon < 0; learning_rate_power > 0; l1 or l2 < 0; an
// initial_accumulator_value < 0; or any hyperparameter is not finite.
//
// Determinism: each element's result depends only on its own inputs, never on n or on where it
// sits in the span, so an update is bit-identical however a variable is partitioned.
//
// Denormals: the ps runs every Apply inside ScopedFlushDenormals (common/denormal.h), as
// TensorFlow runs its kernels: a denormal input counts as 0 and a result below 2^-126 in
// magnitude becomes 0. Callers of Apply outside the ps should do the same for the same bits.
//
// Thread-safety: an Optimizer is immutable after Create, and Apply touches only its arguments,
// so one instance may be shared by any number of threads, as long as no two threads update the
// same elements at once (the caller's locking decides that).
class Optimizer {
 public:
  // Returns the optimizer `spec` describes, with defaults applied, or INVALID_ARGUMENT (see
  // "Validation" above).
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const v1::OptimizerSpec& spec);

  virtual ~Optimizer() = default;

  // "sgd", "momentum", "adagrad", "adam", "ftrl" or "rmsprop".
  virtual absl::string_view name() const = 0;

  // The number of float slots (per-element optimizer state) a variable needs alongside its
  // values: 0 for sgd, 1 for momentum and adagrad, 2 for adam and ftrl, 2 or 3 for rmsprop.
  virtual int num_slots() const = 0;

  // The name of slot i, as listed above ("momentum", "accumulator", "m", "v", "linear", "ms",
  // "mom", "mg"). REQUIRES: 0 <= i < num_slots().
  virtual absl::string_view slot_name(int i) const = 0;

  // The value every element of slot i holds before the first update (e.g. Adagrad's
  // initial_accumulator_value). REQUIRES: 0 <= i < num_slots().
  virtual float slot_initial_value(int i) const = 0;

  // Applies one update to n elements: params[0..n), slots[i][0..n) for each slot i, using
  // grad[0..n). `t` is the 1-based number of this update for these elements (Adam's bias
  // correction uses it; the others ignore it).
  // REQUIRES: n >= 0; t >= 1; slots has num_slots() entries (it may be null when that is 0);
  // params, every slot and grad hold n floats each and do not overlap. Not owned.
  virtual void Apply(float* params, float* const* slots, const float* grad, int64_t n,
                     int64_t t) const = 0;

  // One row of an embedding table to update: its values at `values[0, dim)`, its slot i at
  // `values + (i + 1) * dim` (a table row's layout), its gradient at `grad[0, dim)`, and `t` as
  // for Apply.
  struct RowUpdate {
    float* values;
    const float* grad;
    int64_t t;
  };

  // Updates each of `count` rows of `dim` elements as Apply(values, {values + dim, ...}, grad,
  // dim, t) would, in order, with the same bits. One call for many rows: the dispatch and
  // hyperparameters are paid once, and sgd, adagrad and adam run loops compiled for common dims
  // (an embedding row is short, so Apply's per-call work would cost as much as the update).
  // REQUIRES: dim >= 1; t >= 1; no row overlaps another row or a gradient.
  virtual void ApplyRows(const RowUpdate* rows, int64_t count, int64_t dim) const;

  // The learning-rate multiplier of update t: decay_rate ^ ((t - 1) / decay_steps) with a
  // LearningRateDecay in the spec, 1 without. Every Apply scales its learning rate by it.
  float LearningRateFactor(int64_t t) const;

  // The constants of one update, for running the same element-wise update elsewhere (a
  // worker's local steps run it on their device: kernels.h, ElementwiseUpdate). `lr` is the
  // learning rate of update `t` with the decay of update `decay_t` folded in (and, for adam,
  // the bias correction of update t): lr * LearningRateFactor(decay_t), and adam's lr_t.
  struct Constants {
    std::string kind;  // name()
    float lr = 0;
    float beta1 = 0;  // adam
    float beta2 = 0;
    float epsilon = 0;
    float momentum = 0;  // momentum, moving_average
    bool nesterov = false;
  };
  // UNIMPLEMENTED, naming the optimizer, for adagrad, ftrl and rmsprop (no device runs them).
  // REQUIRES: t >= 1, decay_t >= 1.
  virtual absl::StatusOr<Constants> ConstantsAt(int64_t t, int64_t decay_t) const;

 protected:
  float decay_rate_ = 1.0f;
  double decay_steps_ = 0;

 private:
  friend absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizerWithDecay(
      std::unique_ptr<Optimizer> optimizer, const v1::OptimizerSpec& spec);
};

// A one-line description of `spec` with its defaults applied, for logs, e.g.
// "adam(lr=0.001,beta1=0.9,beta2=0.999,epsilon=1e-07)", or "none" when no optimizer is set.
// Works on invalid specs too (it shows the values as given).
std::string OptimizerDebugString(const v1::OptimizerSpec& spec);

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_OPTIMIZER_H_
