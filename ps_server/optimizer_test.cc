#include "ps_server/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "proto/model.pb.h"

namespace pscluster {
namespace {

v1::OptimizerSpec ParseSpec(const std::string& text) {
  v1::OptimizerSpec spec;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &spec)) << text;
  return spec;
}

std::unique_ptr<Optimizer> CreateOrNull(const std::string& text) {
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer = Optimizer::Create(ParseSpec(text));
  EXPECT_TRUE(optimizer.ok()) << text << ": " << optimizer.status();
  return optimizer.ok() ? *std::move(optimizer) : nullptr;
}

// A variable and its slots in float, as a parameter server holds them.
struct FloatState {
  FloatState(const Optimizer& optimizer, std::vector<float> initial_params)
      : params(std::move(initial_params)) {
    for (int i = 0; i < optimizer.num_slots(); ++i) {
      slots.emplace_back(params.size(), optimizer.slot_initial_value(i));
    }
  }

  void Apply(const Optimizer& optimizer, const std::vector<float>& grad, int64_t t) {
    std::vector<float*> slot_pointers;
    for (std::vector<float>& slot : slots) slot_pointers.push_back(slot.data());
    optimizer.Apply(params.data(), slot_pointers.data(), grad.data(),
                    static_cast<int64_t>(params.size()), t);
  }

  std::vector<float> params;
  std::vector<std::vector<float>> slots;
};

// Hand-worked single steps. Each comment shows the arithmetic.

TEST(OptimizerByHandTest, Sgd) {
  std::unique_ptr<Optimizer> sgd = CreateOrNull("sgd { learning_rate: 0.1 }");
  ASSERT_NE(sgd, nullptr);
  FloatState state(*sgd, {1.0f, -2.0f});
  state.Apply(*sgd, {0.5f, -4.0f}, 1);
  EXPECT_NEAR(state.params[0], 0.95f, 1e-6);  // 1 - 0.1 * 0.5
  EXPECT_NEAR(state.params[1], -1.6f, 1e-6);  // -2 - 0.1 * -4
}

TEST(OptimizerByHandTest, Momentum) {
  std::unique_ptr<Optimizer> momentum =
      CreateOrNull("momentum { learning_rate: 0.1 momentum: 0.9 }");
  ASSERT_NE(momentum, nullptr);
  FloatState state(*momentum, {2.0f});
  state.slots[0][0] = 0.5f;
  state.Apply(*momentum, {1.0f}, 1);
  EXPECT_NEAR(state.slots[0][0], 1.45f, 1e-6);  // 0.9 * 0.5 + 1
  EXPECT_NEAR(state.params[0], 1.855f, 1e-6);   // 2 - 0.1 * 1.45
}

TEST(OptimizerByHandTest, MomentumNesterov) {
  std::unique_ptr<Optimizer> nesterov =
      CreateOrNull("momentum { learning_rate: 0.1 momentum: 0.9 use_nesterov: true }");
  ASSERT_NE(nesterov, nullptr);
  FloatState state(*nesterov, {2.0f});
  state.slots[0][0] = 0.5f;
  state.Apply(*nesterov, {1.0f}, 1);
  EXPECT_NEAR(state.slots[0][0], 1.45f, 1e-6);  // 0.9 * 0.5 + 1
  EXPECT_NEAR(state.params[0], 1.7695f, 1e-6);  // 2 - (0.1 * 1 + 0.1 * 0.9 * 1.45)
}

TEST(OptimizerByHandTest, Adagrad) {
  std::unique_ptr<Optimizer> adagrad =
      CreateOrNull("adagrad { learning_rate: 0.1 initial_accumulator_value: 0.07 epsilon: 0.1 }");
  ASSERT_NE(adagrad, nullptr);
  FloatState state(*adagrad, {1.0f});
  EXPECT_EQ(state.slots[0][0], 0.07f);
  state.Apply(*adagrad, {0.3f}, 1);
  EXPECT_NEAR(state.slots[0][0], 0.16f, 1e-6);  // 0.07 + 0.3^2
  EXPECT_NEAR(state.params[0], 0.94f, 1e-6);    // 1 - 0.1 * 0.3 / (sqrt(0.16) + 0.1)
}

TEST(OptimizerByHandTest, Adam) {
  std::unique_ptr<Optimizer> adam =
      CreateOrNull("adam { learning_rate: 0.1 beta1: 0.5 beta2: 0.75 epsilon: 1 }");
  ASSERT_NE(adam, nullptr);
  FloatState state(*adam, {1.0f});
  state.Apply(*adam, {2.0f}, 1);
  EXPECT_NEAR(state.slots[0][0], 1.0f, 1e-6);  // m = 0 + (1 - 0.5) * (2 - 0)
  EXPECT_NEAR(state.slots[1][0], 1.0f, 1e-6);  // v = 0 + (1 - 0.75) * (4 - 0)
  // lr_t = 0.1 * sqrt(1 - 0.75) / (1 - 0.5) = 0.1; var = 1 - 0.1 * 1 / (sqrt(1) + 1).
  EXPECT_NEAR(state.params[0], 0.95f, 1e-6);
}

TEST(OptimizerByHandTest, AdamFirstStepMovesEachWeightByTheLearningRate) {
  // With the default betas, step 1 gives m = 0.1 g, v = 0.001 g^2 and
  // lr_t = lr * sqrt(0.001) / 0.1, so the step is lr * sign(g) * (1 - d) where epsilon's share
  // d = 1e-7 / (sqrt(0.001) |g| + 1e-7) is at most 6.4e-6 for |g| >= 0.5.
  std::unique_ptr<Optimizer> adam = CreateOrNull("adam { learning_rate: 0.01 }");
  ASSERT_NE(adam, nullptr);
  FloatState state(*adam, {0.0f, 0.0f, 0.0f});
  state.Apply(*adam, {0.5f, -3.0f, 40.0f}, 1);
  EXPECT_NEAR(state.params[0], -0.01f, 1e-7);
  EXPECT_NEAR(state.params[1], 0.01f, 1e-7);
  EXPECT_NEAR(state.params[2], -0.01f, 1e-7);
}

TEST(OptimizerByHandTest, Ftrl) {
  std::unique_ptr<Optimizer> ftrl = CreateOrNull(
      "ftrl { learning_rate: 0.5 initial_accumulator_value: 9 l1_regularization_strength: 0.6 "
      "l2_regularization_strength: 1 }");
  ASSERT_NE(ftrl, nullptr);
  FloatState state(*ftrl, {0.25f, 1.0f});
  state.Apply(*ftrl, {4.0f, 4.0f}, 1);
  // accum: 9 + 4^2 = 25 for both; quadratic = sqrt(25) / 0.5 + 2 * 1 = 12.
  EXPECT_NEAR(state.slots[0][0], 25.0f, 1e-5);
  EXPECT_NEAR(state.slots[0][1], 25.0f, 1e-5);
  // linear = 4 - (sqrt(25) - sqrt(9)) / 0.5 * 0.25 = 3; var = (0.6 - 3) / 12.
  EXPECT_NEAR(state.slots[1][0], 3.0f, 1e-6);
  EXPECT_NEAR(state.params[0], -0.2f, 1e-6);
  // linear = 4 - (5 - 3) / 0.5 * 1 = 0, within l1: the weight is exactly zero.
  EXPECT_NEAR(state.slots[1][1], 0.0f, 1e-6);
  EXPECT_EQ(state.params[1], 0.0f);
}

TEST(OptimizerByHandTest, FtrlL1ZeroesAWeight) {
  std::unique_ptr<Optimizer> ftrl = CreateOrNull(
      "ftrl { learning_rate: 0.5 initial_accumulator_value: 9 l1_regularization_strength: 3.5 "
      "l2_regularization_strength: 1 }");
  ASSERT_NE(ftrl, nullptr);
  FloatState state(*ftrl, {0.25f, 0.25f});
  state.Apply(*ftrl, {4.0f, -4.0f}, 1);
  // linear = 3 and |3| <= 3.5: zeroed.
  EXPECT_NEAR(state.slots[1][0], 3.0f, 1e-6);
  EXPECT_EQ(state.params[0], 0.0f);
  // linear = -4 - 4 * 0.25 = -5, beyond l1: var = (-3.5 + 5) / 12.
  EXPECT_NEAR(state.slots[1][1], -5.0f, 1e-6);
  EXPECT_NEAR(state.params[1], 0.125f, 1e-6);
}

TEST(OptimizerByHandTest, RmsProp) {
  std::unique_ptr<Optimizer> rmsprop =
      CreateOrNull("rmsprop { learning_rate: 0.1 rho: 0.75 momentum: 0.5 epsilon: 3 }");
  ASSERT_NE(rmsprop, nullptr);
  FloatState state(*rmsprop, {1.0f});
  state.slots[1][0] = 0.2f;
  state.Apply(*rmsprop, {2.0f}, 1);
  EXPECT_NEAR(state.slots[0][0], 1.0f, 1e-6);  // ms = 0 + 0.25 * (4 - 0)
  EXPECT_NEAR(state.slots[1][0], 0.2f, 1e-6);  // mom = 0.5 * 0.2 + 0.1 * 2 / sqrt(1 + 3)
  EXPECT_NEAR(state.params[0], 0.8f, 1e-6);    // 1 - 0.2
}

// The pushed values are observations: the variable moves a (1 - momentum) share of the way to
// each, from its current value, and no slot is kept.
TEST(OptimizerByHandTest, MovingAverage) {
  std::unique_ptr<Optimizer> avg = CreateOrNull("moving_average { momentum: 0.75 }");
  ASSERT_NE(avg, nullptr);
  EXPECT_EQ(avg->num_slots(), 0);
  FloatState state(*avg, {1.0f, -2.0f});
  state.Apply(*avg, {3.0f, -2.0f}, 1);
  EXPECT_FLOAT_EQ(state.params[0], 1.5f);  // 1 - 0.25 * (1 - 3)
  EXPECT_FLOAT_EQ(state.params[1], -2.0f);
  state.Apply(*avg, {3.0f, 2.0f}, 2);
  EXPECT_FLOAT_EQ(state.params[0], 1.875f);  // 1.5 - 0.25 * (1.5 - 3)
  EXPECT_FLOAT_EQ(state.params[1], -1.0f);
}

TEST(OptimizerByHandTest, CenteredRmsProp) {
  std::unique_ptr<Optimizer> rmsprop = CreateOrNull(
      "rmsprop { learning_rate: 0.1 rho: 0.75 momentum: 0.5 epsilon: 0.25 centered: true }");
  ASSERT_NE(rmsprop, nullptr);
  FloatState state(*rmsprop, {1.0f});
  state.slots[1][0] = 0.2f;
  state.Apply(*rmsprop, {2.0f}, 1);
  EXPECT_NEAR(state.slots[0][0], 1.0f, 1e-6);  // ms = 0.25 * 4
  EXPECT_NEAR(state.slots[2][0], 0.5f, 1e-6);  // mg = 0.25 * 2
  // denom = 1 - 0.5^2 + 0.25 = 1; mom = 0.5 * 0.2 + 0.1 * 2 / sqrt(1).
  EXPECT_NEAR(state.slots[1][0], 0.3f, 1e-6);
  EXPECT_NEAR(state.params[0], 0.7f, 1e-6);
}

// Independent double-precision references, written from TensorFlow's documented formulas
// (in the textbook form where one exists, e.g. m = beta1 * m + (1 - beta1) * g).

struct ReferenceState {
  std::vector<double> var;
  std::vector<std::vector<double>> slots;
};

using ReferenceStep =
    std::function<void(ReferenceState&, const std::vector<double>& grad, int64_t t)>;

ReferenceStep ReferenceSgd(double lr) {
  return [=](ReferenceState& s, const std::vector<double>& g, int64_t) {
    for (size_t i = 0; i < g.size(); ++i) s.var[i] -= lr * g[i];
  };
}

ReferenceStep ReferenceMomentum(double lr, double momentum, bool nesterov) {
  return [=](ReferenceState& s, const std::vector<double>& g, int64_t) {
    std::vector<double>& accum = s.slots[0];
    for (size_t i = 0; i < g.size(); ++i) {
      accum[i] = momentum * accum[i] + g[i];
      s.var[i] -= nesterov ? lr * (g[i] + momentum * accum[i]) : lr * accum[i];
    }
  };
}

ReferenceStep ReferenceAdagrad(double lr, double epsilon) {
  return [=](ReferenceState& s, const std::vector<double>& g, int64_t) {
    std::vector<double>& accum = s.slots[0];
    for (size_t i = 0; i < g.size(); ++i) {
      accum[i] += g[i] * g[i];
      s.var[i] -= lr * g[i] / (std::sqrt(accum[i]) + epsilon);
    }
  };
}

ReferenceStep ReferenceAdam(double lr, double beta1, double beta2, double epsilon) {
  return [=](ReferenceState& s, const std::vector<double>& g, int64_t t) {
    std::vector<double>& m = s.slots[0];
    std::vector<double>& v = s.slots[1];
    const double lr_t = lr * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t));
    for (size_t i = 0; i < g.size(); ++i) {
      m[i] = beta1 * m[i] + (1 - beta1) * g[i];
      v[i] = beta2 * v[i] + (1 - beta2) * g[i] * g[i];
      s.var[i] -= lr_t * m[i] / (std::sqrt(v[i]) + epsilon);
    }
  };
}

ReferenceStep ReferenceFtrl(double lr, double lr_power, double l1, double l2) {
  return [=](ReferenceState& s, const std::vector<double>& g, int64_t) {
    std::vector<double>& accum = s.slots[0];
    std::vector<double>& linear = s.slots[1];
    for (size_t i = 0; i < g.size(); ++i) {
      const double accum_new = accum[i] + g[i] * g[i];
      const double sigma = (std::pow(accum_new, -lr_power) - std::pow(accum[i], -lr_power)) / lr;
      linear[i] += g[i] - sigma * s.var[i];
      const double quadratic = std::pow(accum_new, -lr_power) / lr + 2 * l2;
      s.var[i] =
          std::abs(linear[i]) > l1 ? (std::copysign(l1, linear[i]) - linear[i]) / quadratic : 0.0;
      accum[i] = accum_new;
    }
  };
}

ReferenceStep ReferenceRmsProp(double lr, double rho, double momentum, double epsilon,
                               bool centered) {
  return [=](ReferenceState& s, const std::vector<double>& g, int64_t) {
    std::vector<double>& ms = s.slots[0];
    std::vector<double>& mom = s.slots[1];
    for (size_t i = 0; i < g.size(); ++i) {
      ms[i] = rho * ms[i] + (1 - rho) * g[i] * g[i];
      double variance = ms[i];
      if (centered) {
        std::vector<double>& mg = s.slots[2];
        mg[i] = rho * mg[i] + (1 - rho) * g[i];
        variance -= mg[i] * mg[i];
      }
      mom[i] = momentum * mom[i] + lr * g[i] / std::sqrt(variance + epsilon);
      s.var[i] -= mom[i];
    }
  };
}

struct ReferenceCase {
  std::string label;
  std::string spec;
  std::string name;
  std::vector<std::string> slot_names;
  std::vector<double> slot_initial_values;
  ReferenceStep step;
};

std::ostream& operator<<(std::ostream& os, const ReferenceCase& c) { return os << c.label; }

// Hyperparameters are written as float literals so that the reference uses exactly the values
// the optimizer holds.
std::vector<ReferenceCase> ReferenceCases() {
  return {
      {"Sgd", "sgd { learning_rate: 0.1 }", "sgd", {}, {}, ReferenceSgd(0.1f)},
      {"Momentum",
       "momentum { learning_rate: 0.05 momentum: 0.9 }",
       "momentum",
       {"momentum"},
       {0.0},
       ReferenceMomentum(0.05f, 0.9f, false)},
      {"MomentumNesterov",
       "momentum { learning_rate: 0.05 momentum: 0.9 use_nesterov: true }",
       "momentum",
       {"momentum"},
       {0.0},
       ReferenceMomentum(0.05f, 0.9f, true)},
      {"AdagradDefaults",
       "adagrad { learning_rate: 0.1 }",
       "adagrad",
       {"accumulator"},
       {0.1f},
       ReferenceAdagrad(0.1f, 1e-7f)},
      {"Adagrad",
       "adagrad { learning_rate: 0.2 initial_accumulator_value: 0.5 epsilon: 0.001 }",
       "adagrad",
       {"accumulator"},
       {0.5f},
       ReferenceAdagrad(0.2f, 0.001f)},
      {"AdamDefaults",
       "adam { learning_rate: 0.01 }",
       "adam",
       {"m", "v"},
       {0.0, 0.0},
       ReferenceAdam(0.01f, 0.9f, 0.999f, 1e-7f)},
      {"Adam",
       "adam { learning_rate: 0.1 beta1: 0.8 beta2: 0.95 epsilon: 0.0001 }",
       "adam",
       {"m", "v"},
       {0.0, 0.0},
       ReferenceAdam(0.1f, 0.8f, 0.95f, 1e-4f)},
      {"FtrlDefaults",
       "ftrl { learning_rate: 0.3 }",
       "ftrl",
       {"accumulator", "linear"},
       {0.1f, 0.0},
       ReferenceFtrl(0.3f, -0.5f, 0.0f, 0.0f)},
      {"FtrlPowerL1L2",
       "ftrl { learning_rate: 0.3 learning_rate_power: -0.7 initial_accumulator_value: 0.2 "
       "l1_regularization_strength: 0.05 l2_regularization_strength: 0.1 }",
       "ftrl",
       {"accumulator", "linear"},
       {0.2f, 0.0},
       ReferenceFtrl(0.3f, -0.7f, 0.05f, 0.1f)},
      {"FtrlStrongL1",
       "ftrl { learning_rate: 0.3 l1_regularization_strength: 0.3 "
       "l2_regularization_strength: 0.01 }",
       "ftrl",
       {"accumulator", "linear"},
       {0.1f, 0.0},
       ReferenceFtrl(0.3f, -0.5f, 0.3f, 0.01f)},
      {"RmsPropDefaults",
       "rmsprop { learning_rate: 0.01 }",
       "rmsprop",
       {"ms", "mom"},
       {0.0, 0.0},
       ReferenceRmsProp(0.01f, 0.9f, 0.0f, 1e-7f, false)},
      {"RmsPropMomentum",
       "rmsprop { learning_rate: 0.01 rho: 0.8 momentum: 0.5 epsilon: 0.0001 }",
       "rmsprop",
       {"ms", "mom"},
       {0.0, 0.0},
       ReferenceRmsProp(0.01f, 0.8f, 0.5f, 1e-4f, false)},
      {"RmsPropCentered",
       "rmsprop { learning_rate: 0.01 rho: 0.8 momentum: 0.5 epsilon: 0.0001 centered: true }",
       "rmsprop",
       {"ms", "mom", "mg"},
       {0.0, 0.0, 0.0},
       ReferenceRmsProp(0.01f, 0.8f, 0.5f, 1e-4f, true)},
  };
}

// Varied gradients: both signs, a zero now and then, and an occasional large one.
float Gradient(int64_t step, int64_t i) {
  if ((i + step) % 7 == 3) return 0.0f;
  if ((i * 3 + step) % 11 == 5) return 25.0f * (i % 2 == 0 ? 1.0f : -1.0f);
  return static_cast<float>(0.8 * std::sin(1.7 * i + 0.9 * step + 0.3) + 0.05 * (i % 5 - 2));
}

float InitialParam(int64_t i) {
  constexpr float kParams[] = {0.5f, -1.25f, 2.0f, 0.0f, -0.03f, 0.75f};
  return kParams[i % 6] + 0.001f * static_cast<float>(i / 6);
}

// The largest error, relative to max(|expected|, 1). Below 1 the bound is absolute: a value
// near zero that float computes as the difference of O(1) terms (var - lr * g, FTRL's
// sign(linear) * l1 - linear) carries their rounding error, about 6e-8, which no float
// implementation can shrink in proportion to the small result.
struct WorstError {
  double error = 0.0;
  std::string where;

  void Update(double actual, double expected, const std::string& what, int64_t i) {
    const double scaled_error = std::abs(actual - expected) / std::max(std::abs(expected), 1.0);
    if (scaled_error > error) {
      error = scaled_error;
      where = what + "[" + std::to_string(i) + "]: actual " + std::to_string(actual) +
              ", expected " + std::to_string(expected);
    }
  }
};

class MatchesReferenceTest : public testing::TestWithParam<ReferenceCase> {};

TEST_P(MatchesReferenceTest, SeveralSteps) {
  const ReferenceCase& c = GetParam();
  std::unique_ptr<Optimizer> optimizer = CreateOrNull(c.spec);
  ASSERT_NE(optimizer, nullptr);
  EXPECT_EQ(optimizer->name(), c.name);
  ASSERT_EQ(optimizer->num_slots(), static_cast<int>(c.slot_names.size()));
  for (int s = 0; s < optimizer->num_slots(); ++s) {
    EXPECT_EQ(optimizer->slot_name(s), c.slot_names[s]);
    EXPECT_EQ(optimizer->slot_initial_value(s), c.slot_initial_values[s]);
  }

  // Six elements see a zero and a large gradient among their steps. (Many more would find the
  // ill-conditioned cases where float cannot reach 1e-6 at all: FTRL's linear update subtracts
  // nearly equal square roots; BlockedApplyTest covers large spans.)
  constexpr int64_t kElements = 6;
  std::vector<float> initial(kElements);
  for (int64_t i = 0; i < kElements; ++i) initial[i] = InitialParam(i);
  FloatState actual(*optimizer, initial);
  ReferenceState expected{std::vector<double>(initial.begin(), initial.end()), {}};
  for (double value : c.slot_initial_values) expected.slots.emplace_back(kElements, value);

  constexpr int kSteps = 6;
  for (int64_t t = 1; t <= kSteps; ++t) {
    std::vector<float> grad(kElements);
    for (int64_t i = 0; i < kElements; ++i) grad[i] = Gradient(t, i);
    actual.Apply(*optimizer, grad, t);
    c.step(expected, std::vector<double>(grad.begin(), grad.end()), t);

    WorstError worst;
    for (int64_t i = 0; i < kElements; ++i) {
      worst.Update(actual.params[i], expected.var[i], "var", i);
      for (size_t s = 0; s < actual.slots.size(); ++s) {
        worst.Update(actual.slots[s][i], expected.slots[s][i], c.slot_names[s], i);
      }
    }
    EXPECT_LE(worst.error, 1e-6) << "after step " << t << ", " << worst.where;
  }
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, MatchesReferenceTest, testing::ValuesIn(ReferenceCases()),
                         [](const testing::TestParamInfo<ReferenceCase>& param_info) {
                           return param_info.param.label;
                         });

// One Apply over a long span gives bit for bit what applying each element on its own gives
// (whatever vector lanes or tails the compiler makes), so results don't depend on partitioning.
class BlockedApplyTest : public testing::TestWithParam<ReferenceCase> {};

TEST_P(BlockedApplyTest, MatchesElementByElement) {
  std::unique_ptr<Optimizer> optimizer = CreateOrNull(GetParam().spec);
  ASSERT_NE(optimizer, nullptr);
  constexpr int64_t kElements = 4099;
  std::vector<float> initial(kElements);
  for (int64_t i = 0; i < kElements; ++i) initial[i] = InitialParam(i);
  FloatState whole(*optimizer, initial);
  FloatState single(*optimizer, initial);
  for (int64_t t = 1; t <= 3; ++t) {
    std::vector<float> grad(kElements);
    for (int64_t i = 0; i < kElements; ++i) grad[i] = Gradient(t, i);
    whole.Apply(*optimizer, grad, t);
    for (int64_t i = 0; i < kElements; ++i) {
      std::vector<float*> slots;
      for (std::vector<float>& slot : single.slots) slots.push_back(slot.data() + i);
      optimizer->Apply(single.params.data() + i, slots.data(), grad.data() + i, 1, t);
    }
  }
  int mismatches = 0;
  for (int64_t i = 0; i < kElements; ++i) {
    mismatches += whole.params[i] != single.params[i];
    for (size_t s = 0; s < whole.slots.size(); ++s) {
      mismatches += whole.slots[s][i] != single.slots[s][i];
    }
  }
  EXPECT_EQ(mismatches, 0);
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, BlockedApplyTest, testing::ValuesIn(ReferenceCases()),
                         [](const testing::TestParamInfo<ReferenceCase>& param_info) {
                           return param_info.param.label;
                         });

// ApplyRows over many rows of a table's layout (values, then each slot) gives bit for bit what
// Apply on each row gives: for every optimizer (sgd, adagrad and adam have loops of their own,
// the rest the default), dims with and without compiled loops, rows whose update numbers differ
// and repeat, more rows than one block, and with a learning-rate decay.
class ApplyRowsTest : public testing::TestWithParam<ReferenceCase> {};

TEST_P(ApplyRowsTest, MatchesApplyOnEachRow) {
  for (const char* decay : {"", " decay { decay_rate: 0.5 decay_steps: 3 }"}) {
    if (GetParam().name == "moving_average" && *decay != '\0') continue;  // refused
    std::unique_ptr<Optimizer> optimizer = CreateOrNull(GetParam().spec + decay);
    ASSERT_NE(optimizer, nullptr) << GetParam().spec << decay;
    const int64_t stride_rows = 1 + optimizer->num_slots();
    for (int64_t dim : {1, 3, 4, 8, 16, 17, 32, 64, 100}) {
      SCOPED_TRACE(absl::StrCat("dim ", dim, decay));
      constexpr int64_t kRows = 150;  // over two blocks of 64
      const int64_t stride = stride_rows * dim;
      std::vector<float> batched(kRows * stride);
      for (int64_t r = 0; r < kRows; ++r) {
        for (int64_t i = 0; i < dim; ++i) batched[r * stride + i] = InitialParam(r * dim + i);
        for (int k = 0; k < optimizer->num_slots(); ++k) {
          std::fill_n(batched.begin() + r * stride + (k + 1) * dim, dim,
                      optimizer->slot_initial_value(k));
        }
      }
      std::vector<float> single = batched;
      for (int64_t step = 1; step <= 3; ++step) {
        std::vector<float> grads(kRows * dim);
        for (int64_t j = 0; j < kRows * dim; ++j) grads[j] = Gradient(step, j);
        std::vector<Optimizer::RowUpdate> rows;
        for (int64_t r = 0; r < kRows; ++r) {
          // Runs of equal t and changes between them: t = step, step + 1 or step + 7.
          const int64_t t = step + (r / 5 % 3 == 0 ? 0 : r / 5 % 3 == 1 ? 1 : 7);
          rows.push_back({batched.data() + r * stride, grads.data() + r * dim, t});
          std::vector<float*> slots;
          for (int k = 0; k < optimizer->num_slots(); ++k) {
            slots.push_back(single.data() + r * stride + (k + 1) * dim);
          }
          optimizer->Apply(single.data() + r * stride, slots.data(), grads.data() + r * dim, dim,
                           t);
        }
        optimizer->ApplyRows(rows.data(), kRows, dim);
      }
      int64_t mismatches = 0;
      for (size_t j = 0; j < batched.size(); ++j) {
        mismatches += std::memcmp(&batched[j], &single[j], sizeof(float)) != 0;
      }
      EXPECT_EQ(mismatches, 0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, ApplyRowsTest, testing::ValuesIn(ReferenceCases()),
                         [](const testing::TestParamInfo<ReferenceCase>& param_info) {
                           return param_info.param.label;
                         });

TEST(OptimizerTest, StrongL1KeepsSomeWeightsAtExactlyZero) {
  // The reference comparison above requires exact zeros where the reference has them; make
  // sure that case does zero some weights and keep others.
  std::unique_ptr<Optimizer> ftrl = CreateOrNull(
      "ftrl { learning_rate: 0.3 l1_regularization_strength: 0.3 "
      "l2_regularization_strength: 0.01 }");
  ASSERT_NE(ftrl, nullptr);
  std::vector<float> initial(60);
  for (int64_t i = 0; i < 60; ++i) initial[i] = InitialParam(i);
  FloatState state(*ftrl, initial);
  std::vector<float> grad(60);
  for (int64_t i = 0; i < 60; ++i) grad[i] = Gradient(1, i);
  state.Apply(*ftrl, grad, 1);
  int zeros = 0;
  for (float value : state.params) zeros += value == 0.0f;
  EXPECT_GT(zeros, 5);
  EXPECT_LT(zeros, 55);
}

TEST(OptimizerTest, ApplyOnNoElementsIsANoOp) {
  std::unique_ptr<Optimizer> adam = CreateOrNull("adam { learning_rate: 0.1 }");
  ASSERT_NE(adam, nullptr);
  float* slots[2] = {nullptr, nullptr};
  adam->Apply(nullptr, slots, nullptr, 0, 1);
  std::unique_ptr<Optimizer> sgd = CreateOrNull("sgd { learning_rate: 0.1 }");
  ASSERT_NE(sgd, nullptr);
  sgd->Apply(nullptr, nullptr, nullptr, 0, 1);
}

TEST(OptimizerDebugStringTest, ShowsEffectiveHyperparameters) {
  EXPECT_EQ(OptimizerDebugString(ParseSpec("sgd { learning_rate: 0.1 }")), "sgd(lr=0.1)");
  EXPECT_EQ(OptimizerDebugString(
                ParseSpec("momentum { learning_rate: 0.1 momentum: 0.9 use_nesterov: true }")),
            "momentum(lr=0.1,momentum=0.9,nesterov=true)");
  EXPECT_EQ(OptimizerDebugString(ParseSpec("adagrad { learning_rate: 0.01 }")),
            "adagrad(lr=0.01,initial_accumulator_value=0.1,epsilon=1e-07)");
  EXPECT_EQ(OptimizerDebugString(ParseSpec("adam { learning_rate: 0.001 }")),
            "adam(lr=0.001,beta1=0.9,beta2=0.999,epsilon=1e-07)");
  EXPECT_EQ(OptimizerDebugString(ParseSpec("ftrl { learning_rate: 0.05 }")),
            "ftrl(lr=0.05,learning_rate_power=-0.5,initial_accumulator_value=0.1,l1=0,l2=0)");
  EXPECT_EQ(OptimizerDebugString(ParseSpec("rmsprop { learning_rate: 0.001 centered: true }")),
            "rmsprop(lr=0.001,rho=0.9,momentum=0,epsilon=1e-07,centered=true)");
  EXPECT_EQ(OptimizerDebugString(v1::OptimizerSpec()), "none");
  // Invalid specs are described as given.
  EXPECT_EQ(OptimizerDebugString(ParseSpec("adam { learning_rate: -1 beta1: 2 }")),
            "adam(lr=-1,beta1=2,beta2=0.999,epsilon=1e-07)");
}

struct BadSpecCase {
  std::string spec;
  std::string message_substring;
};

std::ostream& operator<<(std::ostream& os, const BadSpecCase& c) {
  return os << "'" << c.spec << "'";
}

class BadSpecTest : public testing::TestWithParam<BadSpecCase> {};

TEST_P(BadSpecTest, IsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      Optimizer::Create(ParseSpec(GetParam().spec));
  ASSERT_FALSE(optimizer.ok()) << GetParam().spec;
  EXPECT_EQ(optimizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(optimizer.status().message(), GetParam().message_substring))
      << optimizer.status();
}

INSTANTIATE_TEST_SUITE_P(
    AllRules, BadSpecTest,
    testing::Values(
        BadSpecCase{"", "no optimizer set"},
        BadSpecCase{"sgd {}", "sgd.learning_rate must be a finite number > 0, got 0"},
        BadSpecCase{"sgd { learning_rate: -0.5 }",
                    "sgd.learning_rate must be a finite number > 0, got -0.5"},
        BadSpecCase{"sgd { learning_rate: nan }",
                    "sgd.learning_rate must be a finite number > 0, got nan"},
        BadSpecCase{"sgd { learning_rate: inf }",
                    "sgd.learning_rate must be a finite number > 0, got inf"},
        BadSpecCase{"momentum { learning_rate: 0.1 momentum: -0.9 }",
                    "momentum.momentum must be a finite number >= 0, got -0.9"},
        BadSpecCase{"adagrad { learning_rate: 0 }", "adagrad.learning_rate"},
        BadSpecCase{"adagrad { learning_rate: 0.1 initial_accumulator_value: -0.1 }",
                    "adagrad.initial_accumulator_value must be a finite number >= 0, got -0.1"},
        BadSpecCase{"adagrad { learning_rate: 0.1 epsilon: -1e-7 }",
                    "adagrad.epsilon must be a finite number >= 0, got -1e-07"},
        BadSpecCase{"adam { learning_rate: 0.1 beta1: 1 }", "adam.beta1 must be in [0, 1), got 1"},
        BadSpecCase{"adam { learning_rate: 0.1 beta1: -0.1 }",
                    "adam.beta1 must be in [0, 1), got -0.1"},
        BadSpecCase{"adam { learning_rate: 0.1 beta2: 1.5 }",
                    "adam.beta2 must be in [0, 1), got 1.5"},
        BadSpecCase{"adam { learning_rate: 0.1 epsilon: -1 }",
                    "adam.epsilon must be a finite number >= 0, got -1"},
        BadSpecCase{"adam { learning_rate: 0.1 epsilon: inf }",
                    "adam.epsilon must be a finite number >= 0, got inf"},
        BadSpecCase{"ftrl { learning_rate: -1 }", "ftrl.learning_rate"},
        BadSpecCase{"ftrl { learning_rate: 0.1 learning_rate_power: 0.5 }",
                    "ftrl.learning_rate_power must be a finite number <= 0"},
        BadSpecCase{"ftrl { learning_rate: 0.1 initial_accumulator_value: -1 }",
                    "ftrl.initial_accumulator_value must be a finite number >= 0, got -1"},
        BadSpecCase{"ftrl { learning_rate: 0.1 l1_regularization_strength: -0.01 }",
                    "ftrl.l1_regularization_strength must be a finite number >= 0, got -0.01"},
        BadSpecCase{"ftrl { learning_rate: 0.1 l2_regularization_strength: -2 }",
                    "ftrl.l2_regularization_strength must be a finite number >= 0, got -2"},
        BadSpecCase{"rmsprop { learning_rate: 0.1 rho: 1 }",
                    "rmsprop.rho must be in [0, 1), got 1"},
        BadSpecCase{"rmsprop { learning_rate: 0.1 momentum: -0.5 }",
                    "rmsprop.momentum must be a finite number >= 0, got -0.5"},
        BadSpecCase{"rmsprop { learning_rate: 0.1 epsilon: -1 }",
                    "rmsprop.epsilon must be a finite number >= 0, got -1"},
        BadSpecCase{"moving_average { momentum: 1 }",
                    "MovingAverageOptions.momentum must be in [0, 1), got 1"},
        BadSpecCase{"moving_average { momentum: -0.5 }",
                    "MovingAverageOptions.momentum must be in [0, 1), got -0.5"},
        BadSpecCase{"moving_average { momentum: 0.9 } decay { decay_rate: 0.5 decay_steps: 10 }",
                    "decay does not apply to moving_average"}));

}  // namespace
}  // namespace pscluster

namespace pscluster {
namespace {

TEST(LearningRateDecayTest, ExponentialDecayScalesEveryUpdate) {
  v1::OptimizerSpec spec;
  spec.mutable_sgd()->set_learning_rate(1.0f);
  spec.mutable_decay()->set_decay_rate(0.5f);
  spec.mutable_decay()->set_decay_steps(2);
  auto opt = Optimizer::Create(spec);
  ASSERT_TRUE(opt.ok()) << opt.status();
  float w = 0;
  const float g = 1;
  // lr_t = 0.5 ^ ((t - 1) / 2): 1, 0.7071.., 0.5.
  (*opt)->Apply(&w, nullptr, &g, 1, 1);
  EXPECT_FLOAT_EQ(w, -1.0f);
  (*opt)->Apply(&w, nullptr, &g, 1, 2);
  EXPECT_FLOAT_EQ(w, -1.0f - std::sqrt(0.5f));
  (*opt)->Apply(&w, nullptr, &g, 1, 3);
  EXPECT_FLOAT_EQ(w, -1.5f - std::sqrt(0.5f));

  spec.mutable_decay()->set_decay_rate(1.5f);
  auto bad = Optimizer::Create(spec);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("decay_rate must be in (0, 1], got 1.5"),
            absl::string_view::npos);
  spec.mutable_decay()->set_decay_rate(0.5f);
  spec.mutable_decay()->set_decay_steps(0);
  EXPECT_EQ(Optimizer::Create(spec).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pscluster
