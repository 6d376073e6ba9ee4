#include "common/huge_page_pool.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace pscluster {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

struct Block {
  unsigned char* p;
  size_t bytes;
  unsigned char fill;
};

// Fills each block with its own byte, so that overlapping blocks show as wrong bytes.
Block AllocateFilled(HugePagePool* pool, size_t bytes, unsigned char fill) {
  auto* p = static_cast<unsigned char*>(pool->Allocate(bytes));
  std::memset(p, fill, bytes);
  return Block{p, bytes, fill};
}

bool Intact(const Block& b) {
  return std::all_of(b.p, b.p + b.bytes, [&b](unsigned char c) { return c == b.fill; });
}

// With everything freed and the kept slabs trimmed, the pool holds no memory.
void ExpectEmptyAfterTrim(HugePagePool* pool) {
  pool->Trim();
  const HugePagePool::Stats stats = pool->stats();
  EXPECT_EQ(stats.slab_bytes, 0u);
  EXPECT_EQ(stats.free_bytes, 0u);
  EXPECT_EQ(stats.large_bytes, 0u);
}

TEST(HugePagePoolTest, BlocksAreAlignedAndDoNotOverlap) {
  HugePagePool pool;
  const std::vector<size_t> sizes = {
      1,    63,       4095,         4096,     4097,          48 * 1024, 65536, 100 * 1000,
      kMiB, 2 * kMiB, 2 * kMiB + 1, 5 * kMiB, 3 * 4096 + 17, 12288,     0};
  std::vector<Block> blocks;
  for (size_t i = 0; i < sizes.size(); ++i) {
    blocks.push_back(AllocateFilled(&pool, sizes[i], static_cast<unsigned char>(i + 1)));
    const uintptr_t address = reinterpret_cast<uintptr_t>(blocks.back().p);
    EXPECT_EQ(address % 64, 0u) << sizes[i] << " bytes";
    if (HugePagePool::pooled() && sizes[i] >= HugePagePool::kMinBlock) {
      EXPECT_EQ(address % 4096, 0u) << sizes[i] << " bytes";
    }
    if (HugePagePool::pooled() && sizes[i] > HugePagePool::kSlabBytes) {
      EXPECT_EQ(address % HugePagePool::kSlabBytes, 0u) << sizes[i] << " bytes";
    }
  }
  for (const Block& b : blocks) EXPECT_TRUE(Intact(b)) << b.bytes << " bytes";
  for (const Block& b : blocks) pool.Free(b.p, b.bytes);
  ExpectEmptyAfterTrim(&pool);
}

TEST(HugePagePoolTest, ABlockTakesItsSizeRoundedToFourKiBAndTheTailIsFree) {
  if (!HugePagePool::pooled()) GTEST_SKIP() << "AddressSanitizer: requests go to aligned_alloc";
  HugePagePool pool;
  void* p = pool.Allocate(40 * 1024 + 1);  // 44 KiB of a 64 KiB block
  HugePagePool::Stats stats = pool.stats();
  EXPECT_EQ(stats.slab_bytes, 2 * kMiB);
  EXPECT_EQ(stats.free_bytes, 2 * kMiB - 44 * 1024);
  // The freed tail (4 + 16 KiB) serves the next requests of those sizes from the same block.
  void* q = pool.Allocate(16 * 1024);
  void* r = pool.Allocate(4 * 1024);
  EXPECT_EQ(static_cast<char*>(q), static_cast<char*>(p) + 48 * 1024);
  EXPECT_EQ(static_cast<char*>(r), static_cast<char*>(p) + 44 * 1024);
  EXPECT_EQ(pool.stats().free_bytes, 2 * kMiB - 64 * 1024);
  pool.Free(p, 40 * 1024 + 1);
  pool.Free(r, 4 * 1024);
  pool.Free(q, 16 * 1024);
  stats = pool.stats();
  EXPECT_EQ(stats.slab_bytes, 2 * kMiB) << "a wholly free slab is kept for reuse";
  EXPECT_EQ(stats.free_bytes, 2 * kMiB);
  void* again = pool.Allocate(2 * kMiB);
  EXPECT_EQ(again, p) << "the kept slab serves the next request";
  pool.Free(again, 2 * kMiB);
  pool.Trim();
  stats = pool.stats();
  EXPECT_EQ(stats.slab_bytes, 0u) << "Trim unmaps it";
  EXPECT_EQ(stats.free_bytes, 0u);
}

TEST(HugePagePoolTest, KeepsAtMostAFewFreeSlabsBeyondAnEighthOfThoseInUse) {
  if (!HugePagePool::pooled()) GTEST_SKIP() << "AddressSanitizer: requests go to aligned_alloc";
  HugePagePool pool;
  std::vector<void*> slabs;
  for (int i = 0; i < 20; ++i) slabs.push_back(pool.Allocate(2 * kMiB));
  EXPECT_EQ(pool.stats().slab_bytes, 20 * 2 * kMiB);
  for (void* slab : slabs) pool.Free(slab, 2 * kMiB);
  EXPECT_EQ(pool.stats().slab_bytes, HugePagePool::kMinKeptSlabs * 2 * kMiB);
  EXPECT_EQ(pool.stats().free_bytes, HugePagePool::kMinKeptSlabs * 2 * kMiB);
}

TEST(HugePagePoolTest, RandomAllocationsAndFreesKeepEveryBlockIntactAndEndEmpty) {
  HugePagePool pool;
  std::mt19937 rng(7);
  std::vector<Block> live;
  size_t live_bytes = 0;
  for (int step = 0; step < 3000; ++step) {
    if (!live.empty() && (rng() % 5 < 2 || live_bytes > 24 * kMiB)) {
      const size_t i = rng() % live.size();
      ASSERT_TRUE(Intact(live[i])) << "step " << step << ", " << live[i].bytes << " bytes";
      pool.Free(live[i].p, live[i].bytes);
      live_bytes -= live[i].bytes;
      live[i] = live.back();
      live.pop_back();
      continue;
    }
    // Mostly sizes a table asks for: up to 64 KiB row blocks and power-of-two indexes.
    const int kind = static_cast<int>(rng() % 4);
    size_t bytes = kind == 0   ? 1 + rng() % 4096
                   : kind == 1 ? 4096 + rng() % (64 * 1024)
                   : kind == 2 ? size_t{1} << (12 + rng() % 10)
                               : 1 + rng() % (3 * kMiB);
    live.push_back(AllocateFilled(&pool, bytes, static_cast<unsigned char>(step % 251 + 1)));
    live_bytes += bytes;
  }
  for (const Block& b : live) {
    EXPECT_TRUE(Intact(b)) << b.bytes << " bytes";
    pool.Free(b.p, b.bytes);
  }
  ExpectEmptyAfterTrim(&pool);
}

TEST(HugePagePoolTest, AllocatorServesAVector) {
  std::vector<int64_t, HugePageAllocator<int64_t>> v;
  for (int64_t i = 0; i < 100000; ++i) v.push_back(i * 3);
  for (int64_t i = 0; i < 100000; ++i) ASSERT_EQ(v[i], i * 3);
}

}  // namespace
}  // namespace pscluster
