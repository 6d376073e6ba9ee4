#include "ps_server/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/attributes.h"
#include "absl/base/macros.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/row_length.h"
#include "common/status_macros.h"
#include "proto/model.pb.h"

namespace pscluster {
namespace {

// Keras defaults for fields whose 0 means "unset" (see optimizer.h).
constexpr float kDefaultEpsilon = 1e-7f;
constexpr float kDefaultInitialAccumulator = 0.1f;
constexpr float kDefaultAdamBeta1 = 0.9f;
constexpr float kDefaultAdamBeta2 = 0.999f;
constexpr float kDefaultFtrlLearningRatePower = -0.5f;
constexpr float kDefaultRmsPropRho = 0.9f;

float OrDefault(float value, float default_value) { return value == 0.0f ? default_value : value; }

absl::Status CheckLearningRate(absl::string_view kind, float lr) {
  if (!(lr > 0.0f) || !std::isfinite(lr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OptimizerSpec.", kind, ".learning_rate must be a finite number > 0, got ", lr));
  }
  return absl::OkStatus();
}

absl::Status CheckNonNegative(absl::string_view field, float value) {
  if (!(value >= 0.0f) || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("OptimizerSpec.", field, " must be a finite number >= 0, got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckUnitInterval(absl::string_view field, float value) {
  if (!(value >= 0.0f && value < 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("OptimizerSpec.", field, " must be in [0, 1), got ", value));
  }
  return absl::OkStatus();
}

// Each optimizer's hyperparameters with defaults applied. Resolve() never fails, so that
// OptimizerDebugString can describe invalid specs; Validate() says whether they are usable.

struct SgdHyperparams {
  float lr;
};

SgdHyperparams Resolve(const v1::SgdOptions& o) { return {o.learning_rate()}; }

absl::Status Validate(const SgdHyperparams& h) { return CheckLearningRate("sgd", h.lr); }

std::string ToString(const SgdHyperparams& h) { return absl::StrCat("sgd(lr=", h.lr, ")"); }

struct MovingAverageHyperparams {
  float momentum;
};

MovingAverageHyperparams Resolve(const v1::MovingAverageOptions& o) { return {o.momentum()}; }

absl::Status Validate(const MovingAverageHyperparams& h) {
  if (!(h.momentum >= 0.0f && h.momentum < 1.0f)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "moving_average: MovingAverageOptions.momentum must be in [0, 1), got ", h.momentum));
  }
  return absl::OkStatus();
}

std::string ToString(const MovingAverageHyperparams& h) {
  return absl::StrCat("moving_average(momentum=", h.momentum, ")");
}

struct MomentumHyperparams {
  float lr;
  float momentum;
  bool use_nesterov;
};

MomentumHyperparams Resolve(const v1::MomentumOptions& o) {
  return {o.learning_rate(), o.momentum(), o.use_nesterov()};
}

absl::Status Validate(const MomentumHyperparams& h) {
  PS_RETURN_IF_ERROR(CheckLearningRate("momentum", h.lr));
  return CheckNonNegative("momentum.momentum", h.momentum);
}

std::string ToString(const MomentumHyperparams& h) {
  return absl::StrCat("momentum(lr=", h.lr, ",momentum=", h.momentum,
                      ",nesterov=", h.use_nesterov ? "true" : "false", ")");
}

struct AdagradHyperparams {
  float lr;
  float initial_accumulator_value;
  float epsilon;
};

AdagradHyperparams Resolve(const v1::AdagradOptions& o) {
  return {o.learning_rate(), OrDefault(o.initial_accumulator_value(), kDefaultInitialAccumulator),
          OrDefault(o.epsilon(), kDefaultEpsilon)};
}

absl::Status Validate(const AdagradHyperparams& h) {
  PS_RETURN_IF_ERROR(CheckLearningRate("adagrad", h.lr));
  PS_RETURN_IF_ERROR(
      CheckNonNegative("adagrad.initial_accumulator_value", h.initial_accumulator_value));
  return CheckNonNegative("adagrad.epsilon", h.epsilon);
}

std::string ToString(const AdagradHyperparams& h) {
  return absl::StrCat("adagrad(lr=", h.lr,
                      ",initial_accumulator_value=", h.initial_accumulator_value,
                      ",epsilon=", h.epsilon, ")");
}

struct AdamHyperparams {
  float lr;
  float beta1;
  float beta2;
  float epsilon;
};

AdamHyperparams Resolve(const v1::AdamOptions& o) {
  return {o.learning_rate(), OrDefault(o.beta1(), kDefaultAdamBeta1),
          OrDefault(o.beta2(), kDefaultAdamBeta2), OrDefault(o.epsilon(), kDefaultEpsilon)};
}

absl::Status Validate(const AdamHyperparams& h) {
  PS_RETURN_IF_ERROR(CheckLearningRate("adam", h.lr));
  PS_RETURN_IF_ERROR(CheckUnitInterval("adam.beta1", h.beta1));
  PS_RETURN_IF_ERROR(CheckUnitInterval("adam.beta2", h.beta2));
  return CheckNonNegative("adam.epsilon", h.epsilon);
}

std::string ToString(const AdamHyperparams& h) {
  return absl::StrCat("adam(lr=", h.lr, ",beta1=", h.beta1, ",beta2=", h.beta2,
                      ",epsilon=", h.epsilon, ")");
}

struct FtrlHyperparams {
  float lr;
  float lr_power;
  float initial_accumulator_value;
  float l1;
  float l2;
};

FtrlHyperparams Resolve(const v1::FtrlOptions& o) {
  return {o.learning_rate(), OrDefault(o.learning_rate_power(), kDefaultFtrlLearningRatePower),
          OrDefault(o.initial_accumulator_value(), kDefaultInitialAccumulator),
          o.l1_regularization_strength(), o.l2_regularization_strength()};
}

absl::Status Validate(const FtrlHyperparams& h) {
  PS_RETURN_IF_ERROR(CheckLearningRate("ftrl", h.lr));
  if (!(h.lr_power <= 0.0f) || !std::isfinite(h.lr_power)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "OptimizerSpec.ftrl.learning_rate_power must be a finite number <= 0 (0 means the "
        "default -0.5), got ",
        h.lr_power));
  }
  PS_RETURN_IF_ERROR(
      CheckNonNegative("ftrl.initial_accumulator_value", h.initial_accumulator_value));
  PS_RETURN_IF_ERROR(CheckNonNegative("ftrl.l1_regularization_strength", h.l1));
  return CheckNonNegative("ftrl.l2_regularization_strength", h.l2);
}

std::string ToString(const FtrlHyperparams& h) {
  return absl::StrCat("ftrl(lr=", h.lr, ",learning_rate_power=", h.lr_power,
                      ",initial_accumulator_value=", h.initial_accumulator_value, ",l1=", h.l1,
                      ",l2=", h.l2, ")");
}

struct RmsPropHyperparams {
  float lr;
  float rho;
  float momentum;
  float epsilon;
  bool centered;
};

RmsPropHyperparams Resolve(const v1::RmsPropOptions& o) {
  return {o.learning_rate(), OrDefault(o.rho(), kDefaultRmsPropRho), o.momentum(),
          OrDefault(o.epsilon(), kDefaultEpsilon), o.centered()};
}

absl::Status Validate(const RmsPropHyperparams& h) {
  PS_RETURN_IF_ERROR(CheckLearningRate("rmsprop", h.lr));
  PS_RETURN_IF_ERROR(CheckUnitInterval("rmsprop.rho", h.rho));
  PS_RETURN_IF_ERROR(CheckNonNegative("rmsprop.momentum", h.momentum));
  return CheckNonNegative("rmsprop.epsilon", h.epsilon);
}

std::string ToString(const RmsPropHyperparams& h) {
  return absl::StrCat("rmsprop(lr=", h.lr, ",rho=", h.rho, ",momentum=", h.momentum,
                      ",epsilon=", h.epsilon, ",centered=", h.centered ? "true" : "false", ")");
}

// One slot's name (a string literal) and its value before the first update.
struct SlotInfo {
  absl::string_view name;
  float initial_value;
};

// Holds the name, hyperparameters and slot table shared by every implementation below.
template <typename Hyperparams>
class OptimizerBase : public Optimizer {
 public:
  OptimizerBase(absl::string_view name, const Hyperparams& h, std::vector<SlotInfo> slots)
      : name_(name), h_(h), slots_(std::move(slots)) {}

  absl::string_view name() const final { return name_; }
  int num_slots() const final { return static_cast<int>(slots_.size()); }
  absl::string_view slot_name(int i) const final {
    ABSL_ASSERT(i >= 0 && i < num_slots());
    return slots_[i].name;
  }
  float slot_initial_value(int i) const final {
    ABSL_ASSERT(i >= 0 && i < num_slots());
    return slots_[i].initial_value;
  }

 protected:
  const Hyperparams& h() const { return h_; }

 private:
  const absl::string_view name_;
  const Hyperparams h_;
  const std::vector<SlotInfo> slots_;
};

// The element-wise loops of every optimizer, as free functions compiled twice: for AVX2 and for
// the baseline x86-64 (SSE2), the better one chosen when the program loads (GCC's
// target_clones). Every operation is an IEEE one (add, multiply, divide, square root, no fused
// multiply-add: -ffp-contract=off), correctly rounded at any vector width, so both versions
// give the same bits and an element's result never depends on where it sits in a vector.
#if defined(__x86_64__) && !defined(__clang_analyzer__)
#define PS_VECTOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PS_VECTOR_CLONES
#endif

PS_VECTOR_CLONES void SgdLoop(float* params, const float* grad, int64_t n, float lr) {
  for (int64_t i = 0; i < n; ++i) params[i] -= grad[i] * lr;
}

PS_VECTOR_CLONES void MovingAverageLoop(float* params, const float* value, int64_t n,
                                        float one_minus_momentum) {
  for (int64_t i = 0; i < n; ++i) params[i] -= (params[i] - value[i]) * one_minus_momentum;
}

PS_VECTOR_CLONES void MomentumLoop(float* params, float* accum, const float* grad, int64_t n,
                                   float lr, float momentum, bool nesterov) {
  if (nesterov) {
    for (int64_t i = 0; i < n; ++i) {
      accum[i] = accum[i] * momentum + grad[i];
      params[i] -= grad[i] * lr + accum[i] * momentum * lr;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      accum[i] = accum[i] * momentum + grad[i];
      params[i] -= accum[i] * lr;
    }
  }
}

PS_VECTOR_CLONES void AdagradLoop(float* params, float* accum, const float* grad, int64_t n,
                                  float lr, float epsilon) {
  for (int64_t i = 0; i < n; ++i) {
    accum[i] += grad[i] * grad[i];
    params[i] -= grad[i] * lr / (std::sqrt(accum[i]) + epsilon);
  }
}

PS_VECTOR_CLONES void AdamLoop(float* params, float* m, float* v, const float* grad, int64_t n,
                               float one_minus_beta1, float one_minus_beta2, float lr_t,
                               float epsilon) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    m[i] += (g - m[i]) * one_minus_beta1;
    v[i] += (g * g - v[i]) * one_minus_beta2;
    params[i] -= (m[i] * lr_t) / (std::sqrt(v[i]) + epsilon);
  }
}

PS_VECTOR_CLONES void RmsPropLoop(float* params, float* ms, float* mom, const float* grad,
                                  int64_t n, float lr, float one_minus_rho, float momentum,
                                  float epsilon) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    ms[i] += (g * g - ms[i]) * one_minus_rho;
    mom[i] = mom[i] * momentum + (g * lr) / std::sqrt(ms[i] + epsilon);
    params[i] -= mom[i];
  }
}

PS_VECTOR_CLONES void CenteredRmsPropLoop(float* params, float* ms, float* mom, float* mg,
                                          const float* grad, int64_t n, float lr,
                                          float one_minus_rho, float momentum, float epsilon) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    ms[i] += (g * g - ms[i]) * one_minus_rho;
    mg[i] += (g - mg[i]) * one_minus_rho;
    mom[i] = mom[i] * momentum + (g * lr) / std::sqrt((ms[i] - mg[i] * mg[i]) + epsilon);
    params[i] -= mom[i];
  }
}

// The row loops of ApplyRows: one short row per update, the same operations in the same order as
// the loops above. N is the row's length: std::integral_constant for the dims embedding tables
// commonly use (a row of 8 floats is then one AVX vector and no loop), int64_t otherwise.
template <typename N>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void SgdRow(float* __restrict params,
                                                const float* __restrict grad, N n, float lr) {
  for (int64_t i = 0; i < n; ++i) params[i] -= grad[i] * lr;
}

template <typename N>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void AdagradRow(float* __restrict params,
                                                    const float* __restrict grad, N n, float lr,
                                                    float epsilon) {
  float* __restrict accum = params + n;
  for (int64_t i = 0; i < n; ++i) {
    accum[i] += grad[i] * grad[i];
    params[i] -= grad[i] * lr / (std::sqrt(accum[i]) + epsilon);
  }
}

template <typename N>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void AdamRow(float* __restrict params,
                                                 const float* __restrict grad, N n,
                                                 float one_minus_beta1, float one_minus_beta2,
                                                 float lr_t, float epsilon) {
  float* __restrict m = params + n;
  float* __restrict v = params + 2 * static_cast<int64_t>(n);
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    m[i] += (g - m[i]) * one_minus_beta1;
    v[i] += (g * g - v[i]) * one_minus_beta2;
    params[i] -= (m[i] * lr_t) / (std::sqrt(v[i]) + epsilon);
  }
}

// Calls row(i, n) for i in [0, count), n the rows' length `dim` (common/row_length.h).
template <typename RowFn>
ABSL_ATTRIBUTE_ALWAYS_INLINE inline void ForEachRow(int64_t count, int64_t dim, const RowFn& row) {
  WithRowLength(dim, [count, &row](auto n) ABSL_ATTRIBUTE_ALWAYS_INLINE {
    for (int64_t i = 0; i < count; ++i) row(i, n);
  });
}

// lr[i] is row i's learning rate (Adam: lr_t).
PS_VECTOR_CLONES void SgdRows(const Optimizer::RowUpdate* rows, const float* lr, int64_t count,
                              int64_t dim) {
  ForEachRow(count, dim, [&](int64_t i, auto n) ABSL_ATTRIBUTE_ALWAYS_INLINE {
    SgdRow(rows[i].values, rows[i].grad, n, lr[i]);
  });
}

PS_VECTOR_CLONES void AdagradRows(const Optimizer::RowUpdate* rows, const float* lr, int64_t count,
                                  int64_t dim, float epsilon) {
  ForEachRow(count, dim, [&](int64_t i, auto n) ABSL_ATTRIBUTE_ALWAYS_INLINE {
    AdagradRow(rows[i].values, rows[i].grad, n, lr[i], epsilon);
  });
}

PS_VECTOR_CLONES void AdamRows(const Optimizer::RowUpdate* rows, const float* lr_t, int64_t count,
                               int64_t dim, float one_minus_beta1, float one_minus_beta2,
                               float epsilon) {
  ForEachRow(count, dim, [&](int64_t i, auto n) ABSL_ATTRIBUTE_ALWAYS_INLINE {
    AdamRow(rows[i].values, rows[i].grad, n, one_minus_beta1, one_minus_beta2, lr_t[i], epsilon);
  });
}

// ApplyRows works in blocks of this many rows: each block's learning rates are computed first
// (LearningRateFactor, Adam's bias correction), then its rows updated in one loop.
constexpr int64_t kRowBlock = 64;

// Calls update(rows, lr, m) for consecutive blocks of at most kRowBlock rows, lr[i] being
// rate(rows[i].t); consecutive rows with the same t reuse the rate. Unless `rate_varies`, the
// rate is the same for every t (no decay), and is computed once.
template <typename RateFn, typename UpdateFn>
void ForEachRowBlock(const Optimizer::RowUpdate* rows, int64_t count, bool rate_varies,
                     const RateFn& rate, const UpdateFn& update) {
  float lr[kRowBlock];
  if (!rate_varies) {
    std::fill_n(lr, kRowBlock, rate(1));
    for (int64_t begin = 0; begin < count; begin += kRowBlock) {
      update(rows + begin, lr, std::min(kRowBlock, count - begin));
    }
    return;
  }
  int64_t last_t = -1;
  float last_rate = 0.0f;
  for (int64_t begin = 0; begin < count; begin += kRowBlock) {
    const int64_t m = std::min(kRowBlock, count - begin);
    for (int64_t i = 0; i < m; ++i) {
      const int64_t t = rows[begin + i].t;
      if (t != last_t) {
        last_t = t;
        last_rate = rate(t);
      }
      lr[i] = last_rate;
    }
    update(rows + begin, lr, m);
  }
}

// The Apply loops below are plain per-element float code, in the order of operations of
// TensorFlow's kernels. Eigen's vectorized sqrt (EIGEN_FAST_MATH) is not correctly rounded,
// which would make an element's result depend on whether it fell in a vector lane or in the
// scalar tail, i.e. on how the variable is partitioned; IEEE sqrt and division don't.

class SgdOptimizer final : public OptimizerBase<SgdHyperparams> {
 public:
  explicit SgdOptimizer(const SgdHyperparams& h) : OptimizerBase("sgd", h, {}) {}

  void Apply(float* params, float* const* /*slots*/, const float* grad, int64_t n,
             int64_t t) const override {
    SgdLoop(params, grad, n, h().lr * LearningRateFactor(t));
  }

  absl::StatusOr<Constants> ConstantsAt(int64_t /*t*/, int64_t decay_t) const override {
    Constants c;
    c.kind = "sgd";
    c.lr = h().lr * LearningRateFactor(decay_t);
    return c;
  }

  void ApplyRows(const RowUpdate* rows, int64_t count, int64_t dim) const override {
    ForEachRowBlock(
        rows, count, decay_steps_ > 0, [this](int64_t t) { return h().lr * LearningRateFactor(t); },
        [dim](const RowUpdate* block, const float* lr, int64_t m) { SgdRows(block, lr, m, dim); });
  }
};

class MovingAverageOptimizer final : public OptimizerBase<MovingAverageHyperparams> {
 public:
  explicit MovingAverageOptimizer(const MovingAverageHyperparams& h)
      : OptimizerBase("moving_average", h, {}) {}

  void Apply(float* params, float* const* /*slots*/, const float* value, int64_t n,
             int64_t /*t*/) const override {
    MovingAverageLoop(params, value, n, 1.0f - h().momentum);
  }

  absl::StatusOr<Constants> ConstantsAt(int64_t /*t*/, int64_t /*decay_t*/) const override {
    Constants c;
    c.kind = "moving_average";
    c.momentum = h().momentum;
    return c;
  }
};

class MomentumOptimizer final : public OptimizerBase<MomentumHyperparams> {
 public:
  explicit MomentumOptimizer(const MomentumHyperparams& h)
      : OptimizerBase("momentum", h, {{"momentum", 0.0f}}) {}

  void Apply(float* params, float* const* slots, const float* grad, int64_t n,
             int64_t t) const override {
    MomentumLoop(params, slots[0], grad, n, h().lr * LearningRateFactor(t), h().momentum,
                 h().use_nesterov);
  }

  absl::StatusOr<Constants> ConstantsAt(int64_t /*t*/, int64_t decay_t) const override {
    Constants c;
    c.kind = "momentum";
    c.lr = h().lr * LearningRateFactor(decay_t);
    c.momentum = h().momentum;
    c.nesterov = h().use_nesterov;
    return c;
  }
};

class AdagradOptimizer final : public OptimizerBase<AdagradHyperparams> {
 public:
  explicit AdagradOptimizer(const AdagradHyperparams& h)
      : OptimizerBase("adagrad", h, {{"accumulator", h.initial_accumulator_value}}) {}

  void Apply(float* params, float* const* slots, const float* grad, int64_t n,
             int64_t t) const override {
    AdagradLoop(params, slots[0], grad, n, h().lr * LearningRateFactor(t), h().epsilon);
  }

  void ApplyRows(const RowUpdate* rows, int64_t count, int64_t dim) const override {
    ForEachRowBlock(
        rows, count, decay_steps_ > 0, [this](int64_t t) { return h().lr * LearningRateFactor(t); },
        [this, dim](const RowUpdate* block, const float* lr, int64_t m) {
          AdagradRows(block, lr, m, dim, h().epsilon);
        });
  }
};

class AdamOptimizer final : public OptimizerBase<AdamHyperparams> {
 public:
  explicit AdamOptimizer(const AdamHyperparams& h)
      : OptimizerBase("adam", h, {{"m", 0.0f}, {"v", 0.0f}}) {}

  void Apply(float* params, float* const* slots, const float* grad, int64_t n,
             int64_t t) const override {
    AdamLoop(params, slots[0], slots[1], grad, n, 1.0f - h().beta1, 1.0f - h().beta2,
             LearningRateAt(t), h().epsilon);
  }

  absl::StatusOr<Constants> ConstantsAt(int64_t t, int64_t decay_t) const override {
    Constants c;
    c.kind = "adam";
    c.lr = LearningRateAt(t, decay_t);
    c.beta1 = h().beta1;
    c.beta2 = h().beta2;
    c.epsilon = h().epsilon;
    return c;
  }

  void ApplyRows(const RowUpdate* rows, int64_t count, int64_t dim) const override {
    ForEachRowBlock(
        rows, count, /*rate_varies=*/true, [this](int64_t t) { return LearningRateAt(t); },
        [this, dim](const RowUpdate* block, const float* lr_t, int64_t m) {
          AdamRows(block, lr_t, m, dim, 1.0f - h().beta1, 1.0f - h().beta2, h().epsilon);
        });
  }

 private:
  // lr_t of update t: the learning rate with the bias correction folded in.
  float LearningRateAt(int64_t t) const { return LearningRateAt(t, t); }
  // The bias correction of update t, the decay of update decay_t.
  float LearningRateAt(int64_t t, int64_t decay_t) const {
    ABSL_ASSERT(t >= 1);
    // TensorFlow keeps beta^t in float variables; computing them in double from t is at least
    // as accurate and needs no extra state.
    const double beta1_power = std::pow(static_cast<double>(h().beta1), static_cast<double>(t));
    const double beta2_power = std::pow(static_cast<double>(h().beta2), static_cast<double>(t));
    return static_cast<float>(h().lr * LearningRateFactor(decay_t) * std::sqrt(1.0 - beta2_power) /
                              (1.0 - beta1_power));
  }
};

class FtrlOptimizer final : public OptimizerBase<FtrlHyperparams> {
 public:
  explicit FtrlOptimizer(const FtrlHyperparams& h)
      : OptimizerBase("ftrl", h, {{"accumulator", h.initial_accumulator_value}, {"linear", 0.0f}}) {
  }

  void Apply(float* params, float* const* slots, const float* grad, int64_t n,
             int64_t t) const override {
    const float lr = h().lr * LearningRateFactor(t);
    // As TensorFlow does, the default power -0.5 takes sqrt, which is exact and faster.
    if (h().lr_power == -0.5f) {
      ApplyWith(params, slots, grad, n, lr, [](float x) { return std::sqrt(x); });
    } else {
      const float exponent = -h().lr_power;
      ApplyWith(params, slots, grad, n, lr, [exponent](float x) { return std::pow(x, exponent); });
    }
  }

 private:
  // `power(x)` computes x^(-learning_rate_power).
  template <typename PowerFn>
  void ApplyWith(float* params, float* const* slots, const float* grad, int64_t n, float lr,
                 PowerFn power) const {
    const float l1 = h().l1;
    const float two_l2 = 2.0f * h().l2;
    float* accum = slots[0];
    float* linear = slots[1];
    for (int64_t i = 0; i < n; ++i) {
      const float g = grad[i];
      const float accum_new = accum[i] + g * g;
      const float accum_new_power = power(accum_new);
      linear[i] += g - (accum_new_power - power(accum[i])) / lr * params[i];
      const float quadratic = accum_new_power / lr + two_l2;
      // |linear| > l1 >= 0 implies linear != 0, so the sign is +-1.
      params[i] =
          std::abs(linear[i]) > l1 ? ((linear[i] > 0.0f ? l1 : -l1) - linear[i]) / quadratic : 0.0f;
      accum[i] = accum_new;
    }
  }
};

class RmsPropOptimizer final : public OptimizerBase<RmsPropHyperparams> {
 public:
  explicit RmsPropOptimizer(const RmsPropHyperparams& h)
      : OptimizerBase("rmsprop", h, Slots(h.centered)) {}

  void Apply(float* params, float* const* slots, const float* grad, int64_t n,
             int64_t t) const override {
    const float lr = h().lr * LearningRateFactor(t);
    const float one_minus_rho = 1.0f - h().rho;
    const float momentum = h().momentum;
    const float epsilon = h().epsilon;
    if (h().centered) {
      CenteredRmsPropLoop(params, slots[0], slots[1], slots[2], grad, n, lr, one_minus_rho,
                          momentum, epsilon);
    } else {
      RmsPropLoop(params, slots[0], slots[1], grad, n, lr, one_minus_rho, momentum, epsilon);
    }
  }

 private:
  static std::vector<SlotInfo> Slots(bool centered) {
    std::vector<SlotInfo> slots = {{"ms", 0.0f}, {"mom", 0.0f}};
    if (centered) slots.push_back({"mg", 0.0f});
    return slots;
  }
};

template <typename OptimizerType, typename Options>
absl::StatusOr<std::unique_ptr<Optimizer>> ValidateAndMake(const Options& options) {
  const auto hyperparams = Resolve(options);
  PS_RETURN_IF_ERROR(Validate(hyperparams));
  return std::unique_ptr<Optimizer>(std::make_unique<OptimizerType>(hyperparams));
}

}  // namespace

void Optimizer::ApplyRows(const RowUpdate* rows, int64_t count, int64_t dim) const {
  constexpr int kMaxSlots = 3;  // rmsprop, centered
  ABSL_ASSERT(num_slots() <= kMaxSlots);
  float* slots[kMaxSlots];
  for (int64_t i = 0; i < count; ++i) {
    for (int k = 0; k < num_slots(); ++k) slots[k] = rows[i].values + (k + 1) * dim;
    Apply(rows[i].values, slots, rows[i].grad, dim, rows[i].t);
  }
}

absl::StatusOr<Optimizer::Constants> Optimizer::ConstantsAt(int64_t /*t*/,
                                                            int64_t /*decay_t*/) const {
  return absl::UnimplementedError(absl::StrCat(
      "optimizer ", name(), " has no device update (sgd, momentum, adam and moving_average do)"));
}

float Optimizer::LearningRateFactor(int64_t t) const {
  if (decay_steps_ <= 0) return 1.0f;
  return static_cast<float>(
      std::pow(static_cast<double>(decay_rate_), static_cast<double>(t - 1) / decay_steps_));
}

absl::StatusOr<std::unique_ptr<Optimizer>> CreateOptimizerWithDecay(
    std::unique_ptr<Optimizer> optimizer, const v1::OptimizerSpec& spec) {
  if (!spec.has_decay()) return optimizer;
  if (spec.has_moving_average()) {
    return absl::InvalidArgumentError(
        "OptimizerSpec.decay does not apply to moving_average, which has no learning rate");
  }
  const v1::LearningRateDecay& d = spec.decay();
  if (!(d.decay_rate() > 0.0f && d.decay_rate() <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("OptimizerSpec.decay.decay_rate must be in (0, 1], got ", d.decay_rate()));
  }
  if (d.decay_steps() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("OptimizerSpec.decay.decay_steps must be >= 1, got ", d.decay_steps()));
  }
  optimizer->decay_rate_ = d.decay_rate();
  optimizer->decay_steps_ = static_cast<double>(d.decay_steps());
  return optimizer;
}

namespace {

absl::StatusOr<std::unique_ptr<Optimizer>> CreateWithoutDecay(const v1::OptimizerSpec& spec) {
  switch (spec.kind_case()) {
    case v1::OptimizerSpec::kSgd:
      return ValidateAndMake<SgdOptimizer>(spec.sgd());
    case v1::OptimizerSpec::kMomentum:
      return ValidateAndMake<MomentumOptimizer>(spec.momentum());
    case v1::OptimizerSpec::kAdagrad:
      return ValidateAndMake<AdagradOptimizer>(spec.adagrad());
    case v1::OptimizerSpec::kAdam:
      return ValidateAndMake<AdamOptimizer>(spec.adam());
    case v1::OptimizerSpec::kFtrl:
      return ValidateAndMake<FtrlOptimizer>(spec.ftrl());
    case v1::OptimizerSpec::kRmsprop:
      return ValidateAndMake<RmsPropOptimizer>(spec.rmsprop());
    case v1::OptimizerSpec::kMovingAverage:
      return ValidateAndMake<MovingAverageOptimizer>(spec.moving_average());
    case v1::OptimizerSpec::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "OptimizerSpec has no optimizer set; set one of sgd, momentum, adagrad, adam, ftrl, "
      "rmsprop, moving_average");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const v1::OptimizerSpec& spec) {
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = CreateWithoutDecay(spec);
  if (!optimizer.ok()) return optimizer.status();
  return CreateOptimizerWithDecay(*std::move(optimizer), spec);
}

std::string OptimizerDebugString(const v1::OptimizerSpec& spec) {
  switch (spec.kind_case()) {
    case v1::OptimizerSpec::kSgd:
      return ToString(Resolve(spec.sgd()));
    case v1::OptimizerSpec::kMomentum:
      return ToString(Resolve(spec.momentum()));
    case v1::OptimizerSpec::kAdagrad:
      return ToString(Resolve(spec.adagrad()));
    case v1::OptimizerSpec::kAdam:
      return ToString(Resolve(spec.adam()));
    case v1::OptimizerSpec::kFtrl:
      return ToString(Resolve(spec.ftrl()));
    case v1::OptimizerSpec::kRmsprop:
      return ToString(Resolve(spec.rmsprop()));
    case v1::OptimizerSpec::kMovingAverage:
      return ToString(Resolve(spec.moving_average()));
    case v1::OptimizerSpec::KIND_NOT_SET:
      break;
  }
  return "none";
}

}  // namespace pscluster
