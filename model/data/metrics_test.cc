#include "model/data/metrics.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "model/data/seeded_random.h"

namespace pscluster {
namespace {

TEST(AucTest, PerfectReversedAndRandomOrders) {
  EXPECT_EQ(Auc({0.1f, 0.2f, 0.8f, 0.9f}, {0, 0, 1, 1}), 1.0);
  EXPECT_EQ(Auc({0.9f, 0.8f, 0.2f, 0.1f}, {0, 0, 1, 1}), 0.0);
  // Pairs (positive, negative): (0.8, 0.1) win, (0.8, 0.9) loss, (0.3, 0.1) win,
  // (0.3, 0.9) loss.
  EXPECT_EQ(Auc({0.1f, 0.8f, 0.9f, 0.3f}, {0, 1, 0, 1}), 0.5);
  // Positives 0.5, 0.7; negatives 0.2, 0.6, 0.9: wins 1 + 2 = 3 of 6.
  EXPECT_EQ(Auc({0.5f, 0.2f, 0.7f, 0.6f, 0.9f}, {1, 0, 1, 0, 0}), 0.5);
  // Positive 0.4 beats 0.3 only; positive 0.6 beats 0.3 and 0.5: 3 of 4.
  EXPECT_EQ(Auc({0.3f, 0.4f, 0.5f, 0.6f}, {0, 1, 0, 1}), 0.75);
}

TEST(AucTest, TiesCountHalf) {
  EXPECT_EQ(Auc({0.5f, 0.5f, 0.5f, 0.5f}, {0, 1, 0, 1}), 0.5);
  // Positive 0.5 ties negative 0.5 (half) and beats 0.1: 1.5 of 2.
  EXPECT_EQ(Auc({0.1f, 0.5f, 0.5f}, {0, 0, 1}), 0.75);
  // Positives {0.5, 0.5, 0.9}, negatives {0.5, 0.2}: 0.5 + 1 + 0.5 + 1 + 2 = 5 of 6.
  EXPECT_DOUBLE_EQ(Auc({0.5f, 0.5f, 0.9f, 0.5f, 0.2f}, {1, 1, 1, 0, 0}), 5.0 / 6.0);
}

TEST(AucTest, UndefinedWithoutBothClassesOrWithNaN) {
  EXPECT_TRUE(std::isnan(Auc({0.1f, 0.2f}, {1, 1})));
  EXPECT_TRUE(std::isnan(Auc({0.1f, 0.2f}, {0, 0})));
  EXPECT_TRUE(std::isnan(Auc({}, {})));
  EXPECT_TRUE(std::isnan(Auc({0.1f, NAN}, {0, 1})));
}

TEST(AucTest, MatchesTheQuadraticDefinition) {
  std::mt19937_64 rng(3);
  std::vector<float> scores, labels;
  for (int i = 0; i < 500; ++i) {
    // Coarse scores, so that many tie.
    scores.push_back(static_cast<float>(UniformBelow(&rng, 20)) / 20.0f);
    labels.push_back(UniformBelow(&rng, 3) == 0 ? 1.0f : 0.0f);
  }
  double wins = 0, pairs = 0;
  for (size_t i = 0; i < scores.size(); ++i) {
    for (size_t j = 0; j < scores.size(); ++j) {
      if (labels[i] != 1 || labels[j] != 0) continue;
      pairs += 1;
      wins += scores[i] > scores[j] ? 1.0 : scores[i] == scores[j] ? 0.5 : 0.0;
    }
  }
  EXPECT_NEAR(Auc(scores, labels), wins / pairs, 1e-12);
}

TEST(AccuracyTest, BinaryThresholdsAtOneHalf) {
  EXPECT_EQ(Accuracy({0.2f, 0.5f, 0.7f, 0.4f}, {0, 1, 0, 0}, 0), 0.75);
  EXPECT_TRUE(std::isnan(Accuracy({}, {}, 0)));
}

TEST(AccuracyTest, MulticlassTakesTheArgmax) {
  const std::vector<float> scores = {
      0.1f, 0.7f, 0.2f,  // predicts 1
      3.0f, 1.0f, 3.0f,  // tie: predicts the first, 0
      0.0f, 0.0f, 5.0f,  // predicts 2
  };
  EXPECT_DOUBLE_EQ(Accuracy(scores, {1, 2, 2}, 3), 2.0 / 3.0);
  EXPECT_EQ(Accuracy(scores, {1, 0, 2}, 3), 1.0);
}

TEST(MetricsDeathTest, MismatchedSizesAreProgrammerErrors) {
  EXPECT_DEATH(Auc({0.1f}, {0, 1}), "one label per score");
  EXPECT_DEATH(Accuracy({0.1f, 0.2f}, {0, 1}, 3), "score\\(s\\) per label");
}

}  // namespace
}  // namespace pscluster
