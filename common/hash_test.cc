#include "common/hash.h"

#include <string>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

TEST(SplitMix64Test, MatchesTheReferenceGenerator) {
  // The reference generator seeded with 0 returns SplitMix64(0), SplitMix64(step), ...
  EXPECT_EQ(SplitMix64(0), 0xe220a8397b1dcdafULL);
  EXPECT_EQ(SplitMix64(kSplitMix64Step), 0x6e789e6aa1b965f4ULL);
  EXPECT_EQ(SplitMix64(2 * kSplitMix64Step), 0x06c45d188009454fULL);
}

TEST(Fnv1a64Test, MatchesThePublishedVectors) {
  EXPECT_EQ(Fnv1a64(""), 0xcbf29ce484222325ULL);
  EXPECT_EQ(Fnv1a64("a"), 0xaf63dc4c8601ec8cULL);
  EXPECT_EQ(Fnv1a64("foobar"), 0x85944171f73967e8ULL);
}

TEST(Fnv1a64Test, ContinuesAsIfConcatenated) {
  EXPECT_EQ(Fnv1a64("bar", Fnv1a64("foo")), Fnv1a64("foobar"));
  EXPECT_EQ(Fnv1a64(std::string(1, '\0')), Fnv1a64(absl::string_view("\0", 1)));
  EXPECT_NE(Fnv1a64(std::string(1, '\0')), Fnv1a64(""));
}

}  // namespace
}  // namespace pscluster
