#include "model/data/seeded_random.h"

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAreArray;

TEST(SeededRandomTest, Mt19937_64IsTheStandardSequence) {
  // The C++ standard fixes the 10000th output of a default-constructed std::mt19937_64.
  std::mt19937_64 rng;
  rng.discard(9999);
  EXPECT_EQ(rng(), 9981545732273789042ULL);
}

TEST(SeededRandomTest, CombineSeedsDependsOnTheOrder) {
  EXPECT_NE(CombineSeeds(1, 2), CombineSeeds(2, 1));
}

TEST(SeededRandomTest, UniformBelowStaysInRangeAndCoversIt) {
  std::mt19937_64 rng(7);
  std::vector<int> counts(5, 0);
  for (int i = 0; i < 5000; ++i) ++counts[UniformBelow(&rng, 5)];
  for (const int c : counts) EXPECT_GT(c, 800);
  EXPECT_EQ(UniformBelow(&rng, 1), 0u);
}

TEST(SeededRandomTest, UniformDoubleIsInUnitInterval) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    const double u = UniformDouble(&rng);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
  }
}

TEST(SeededRandomTest, StandardNormalHasUnitMoments) {
  std::mt19937_64 rng(11);
  double sum = 0, sum_sq = 0;
  constexpr int kN = 100000;
  for (int i = 0; i < kN; ++i) {
    const double z = StandardNormal(&rng);
    sum += z;
    sum_sq += z * z;
  }
  EXPECT_NEAR(sum / kN, 0.0, 0.02);
  EXPECT_NEAR(sum_sq / kN, 1.0, 0.02);
  EXPECT_EQ(HashedStandardNormal(42), HashedStandardNormal(42));
  EXPECT_NE(HashedStandardNormal(42), HashedStandardNormal(43));
}

TEST(SeededRandomTest, FisherYatesIsAPermutationFixedByTheSeed) {
  std::vector<int> values(10);
  std::iota(values.begin(), values.end(), 0);
  std::vector<int> a = values, b = values;
  std::mt19937_64 rng_a(5), rng_b(5);
  FisherYatesShuffle(&a, &rng_a);
  FisherYatesShuffle(&b, &rng_b);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, values);
  EXPECT_THAT(a, UnorderedElementsAreArray(values));
  // Pinned, so a change of algorithm (which would reorder every epoch) is caught.
  EXPECT_THAT(a, ElementsAre(8, 7, 1, 3, 5, 9, 6, 0, 4, 2));
}

}  // namespace
}  // namespace pscluster
