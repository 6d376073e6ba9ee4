#include "ps_server/admission_filter.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

// One request of `keys`: decides each on the counts before the request, then applies them.
std::vector<bool> Request(AdmissionFilter& sketch, const std::vector<int64_t>& keys) {
  std::vector<AdmissionFilter::Bump> bumps;
  std::vector<bool> admitted;
  for (int64_t key : keys) admitted.push_back(sketch.Admit(key, &bumps));
  sketch.Apply(bumps);
  return admitted;
}

TEST(AdmissionFilterTest, AdmitsAtTheMinCountAndNotBefore) {
  AdmissionFilter sketch(/*width=*/1024, /*min_count=*/3, /*probability=*/0);
  EXPECT_FALSE(Request(sketch, {42})[0]);
  EXPECT_FALSE(Request(sketch, {42})[0]);
  EXPECT_TRUE(Request(sketch, {42})[0]);
  // Another key has its own count.
  EXPECT_FALSE(Request(sketch, {43})[0]);
}

TEST(AdmissionFilterTest, TheKeysOfOneRequestAreDecidedOnTheCountsBeforeIt) {
  AdmissionFilter sketch(1024, /*min_count=*/2, 0);
  // Twice in one request: both see the count 1, and the count after it is 1, not 2.
  EXPECT_EQ(Request(sketch, {7, 7}), (std::vector<bool>{false, false}));
  EXPECT_TRUE(Request(sketch, {7})[0]);
}

TEST(AdmissionFilterTest, EachKeyRaisesFourCountersConservatively) {
  AdmissionFilter sketch(1024, 100, 0);
  for (int i = 0; i < 3; ++i) Request(sketch, {5});
  const std::vector<uint16_t>& c = sketch.counters();
  ASSERT_EQ(c.size(), 4u * 1024);
  EXPECT_EQ(std::count(c.begin(), c.end(), 3), 4);  // one counter per row, each at the count
  EXPECT_EQ(std::accumulate(c.begin(), c.end(), 0), 12);
  // A key whose counters include one at 3 and others at 0 has the estimate 0: only the
  // counters at the minimum grow, so the counter at 3 stays.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(std::count(c.begin() + i * 1024, c.begin() + (i + 1) * 1024, 3), 1) << "row " << i;
  }
}

TEST(AdmissionFilterTest, CountsSaturateAt65535) {
  AdmissionFilter sketch(16, /*min_count=*/65535, 0);
  bool admitted = false;
  for (int i = 0; i < 65535; ++i) admitted = Request(sketch, {9})[0];
  EXPECT_TRUE(admitted);
  Request(sketch, {9});
  const std::vector<uint16_t>& c = sketch.counters();
  EXPECT_EQ(*std::max_element(c.begin(), c.end()), 0xffff);
}

TEST(AdmissionFilterTest, ProbabilityAdmitsEarlyTheSameKeysEveryTime) {
  AdmissionFilter a(1 << 14, /*min_count=*/1000, /*probability=*/0.25);
  AdmissionFilter b(1 << 14, 1000, 0.25);
  std::vector<int64_t> keys(10000);
  std::iota(keys.begin(), keys.end(), 1);
  const std::vector<bool> first = Request(a, keys);
  const int64_t n = std::count(first.begin(), first.end(), true);
  EXPECT_GT(n, 2200);
  EXPECT_LT(n, 2800);
  EXPECT_EQ(Request(b, keys), first) << "the draw depends only on the key and its count";
  AdmissionFilter always(1024, 1000, 1.0);
  EXPECT_TRUE(Request(always, {123})[0]);
}

TEST(AdmissionFilterTest, MergeAddsAndSaturatesAndClearForgets) {
  AdmissionFilter a(64, 3, 0), b(64, 3, 0);
  Request(a, {1});
  Request(a, {1});
  b.Merge(a.counters().data());
  EXPECT_EQ(b.counters(), a.counters());
  EXPECT_TRUE(Request(b, {1})[0]) << "the merged counts admit at the third push";
  std::vector<uint16_t> full(b.counters().size(), 0xfffe);
  b.Merge(full.data());
  const std::vector<uint16_t>& c = b.counters();
  EXPECT_EQ(*std::max_element(c.begin(), c.end()), 0xffff);
  b.Clear();
  EXPECT_EQ(std::accumulate(c.begin(), c.end(), 0), 0);
  EXPECT_FALSE(Request(b, {1})[0]);
}

}  // namespace
}  // namespace pscluster
