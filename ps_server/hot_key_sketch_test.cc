#include "ps_server/hot_key_sketch.h"

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

std::vector<std::pair<int64_t, int64_t>> Top(const HotKeySketch& sketch, int k) {
  std::vector<std::pair<int64_t, int64_t>> top;
  for (const v1::HotKey& h : sketch.Top(k)) top.emplace_back(h.key(), h.count());
  return top;
}

void Push(HotKeySketch& sketch, const std::vector<int64_t>& keys) {
  sketch.SamplePush(keys.data(), static_cast<int64_t>(keys.size()));
}

TEST(HotKeySketchTest, EmptyUntilPushedAndForNonPositiveK) {
  HotKeySketch sketch;
  EXPECT_TRUE(sketch.Top(5).empty());
  Push(sketch, {1, 2});
  EXPECT_TRUE(sketch.Top(0).empty());
  EXPECT_TRUE(sketch.Top(-1).empty());
  sketch.SamplePush(nullptr, 0);
  EXPECT_EQ(Top(sketch, 5).size(), 2u);
}

TEST(HotKeySketchTest, SmallPushesAreCountedExactlyMostFirstTiesByKey) {
  HotKeySketch sketch;
  Push(sketch, {1, 3, 2, 3, 2, 3});
  Push(sketch, {5, 4});
  using P = std::pair<int64_t, int64_t>;
  EXPECT_EQ(Top(sketch, 10), (std::vector<P>{{3, 3}, {2, 2}, {1, 1}, {4, 1}, {5, 1}}));
  EXPECT_EQ(Top(sketch, 2), (std::vector<P>{{3, 3}, {2, 2}}));
}

TEST(HotKeySketchTest, ANewKeyTakesTheSmallestCounterAndItsCount) {
  HotKeySketch sketch;
  std::vector<int64_t> keys;
  for (int64_t k = 0; k < HotKeySketch::kCounters; ++k) keys.push_back(k);
  Push(sketch, keys);
  Push(sketch, keys);  // every counter at 2
  Push(sketch, {1000});
  const auto top = Top(sketch, HotKeySketch::kCounters);
  ASSERT_EQ(top.size(), static_cast<size_t>(HotKeySketch::kCounters));
  EXPECT_EQ(top[0], std::make_pair(int64_t{1000}, int64_t{3})) << "inherits 2, plus its own 1";
  for (const auto& [key, count] : top) EXPECT_NE(key, 0) << "the smallest key of the lowest count";
}

TEST(HotKeySketchTest, ADominantKeyIsFoundInLargeSampledPushes) {
  HotKeySketch sketch;
  std::mt19937_64 rng(7);
  constexpr int kPushes = 200, kKeys = 10000;
  for (int p = 0; p < kPushes; ++p) {
    std::vector<int64_t> keys(kKeys);
    for (int i = 0; i < kKeys; ++i) keys[i] = i % 4 == 0 ? 77 : static_cast<int64_t>(rng() >> 1);
    Push(sketch, keys);
  }
  const auto top = Top(sketch, 1);
  ASSERT_EQ(top.size(), 1u);
  EXPECT_EQ(top[0].first, 77);
  // A quarter of 2 M positions, estimated from samples of 1 in 79: within 10 %.
  const double expected = kPushes * kKeys / 4.0;
  EXPECT_NEAR(static_cast<double>(top[0].second), expected, 0.1 * expected);
  EXPECT_LE(Top(sketch, 1000).size(), static_cast<size_t>(HotKeySketch::kCounters));
}

}  // namespace
}  // namespace pscluster
