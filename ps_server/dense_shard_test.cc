#include "ps_server/dense_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "ps_server/initializer.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

v1::DenseShardSpec Spec(std::vector<int64_t> dims, int64_t row_begin, int64_t row_end,
                        float lr = 0.5f) {
  v1::DenseShardSpec spec;
  v1::VariableSpec* var = spec.mutable_variable();
  var->set_name("w");
  for (int64_t d : dims) var->mutable_shape()->add_dims(d);
  var->set_dtype(v1::DT_FLOAT32);
  var->mutable_initializer()->set_kind(v1::InitializerSpec::NORMAL);
  var->mutable_initializer()->set_stddev(1.0f);
  var->mutable_initializer()->set_seed(42);
  var->mutable_optimizer()->mutable_sgd()->set_learning_rate(lr);
  v1::DensePartition* part = spec.mutable_partition();
  part->set_variable("w");
  part->set_partition(1);
  part->set_row_begin(row_begin);
  part->set_row_end(row_end);
  return spec;
}

TEST(DenseShardTest, ValuesAreThoseOfTheWholeVariable) {
  auto shard = DenseShard::Create(Spec({6, 3}, 2, 5));
  ASSERT_TRUE(shard.ok()) << shard.status();
  EXPECT_EQ((*shard)->num_elements(), 9);
  EXPECT_EQ((*shard)->shape().dims(0), 3);
  std::vector<float> whole(18), mine(9);
  ASSERT_TRUE(InitializeDense(Spec({6, 3}, 0, 6).variable().initializer(), "w",
                              Spec({6, 3}, 0, 6).variable().shape(), 0, whole.data(), 18)
                  .ok());
  (*shard)->ReadValues(mine.data());
  for (int i = 0; i < 9; ++i) EXPECT_EQ(mine[i], whole[6 + i]) << i;
}

TEST(DenseShardTest, ApplyRunsTheOptimizerAndCounts) {
  auto shard = DenseShard::Create(Spec({4}, 0, 4, /*lr=*/0.5f));
  ASSERT_TRUE(shard.ok());
  std::vector<float> before(4), after(4);
  (*shard)->ReadValues(before.data());
  const std::vector<float> grad = {1, -2, 0, 4};
  (*shard)->Apply(grad.data());
  (*shard)->ReadValues(after.data());
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(after[i], before[i] - 0.5f * grad[i]);
  EXPECT_EQ((*shard)->updates(), 1);
}

TEST(DenseShardTest, ApplyAllEqualsOneShardAtATimeBitForBit) {
  // Shards of sizes around the parallel block (8K elements), so that blocks of the fused loop
  // start and end inside shards, with Adam (whose slots and count must follow each shard), on
  // a pool and without one.
  const std::vector<int64_t> sizes = {20000, 3, 8192, 1, 17000};
  ThreadPool pool(3);
  std::vector<std::unique_ptr<DenseShard>> fused, single;
  for (int64_t size : sizes) {
    v1::DenseShardSpec spec = Spec({size}, 0, size);
    spec.mutable_variable()->mutable_optimizer()->mutable_adam()->set_learning_rate(0.01f);
    for (auto* set : {&fused, &single}) {
      auto shard = DenseShard::Create(spec);
      ASSERT_TRUE(shard.ok()) << shard.status();
      set->push_back(*std::move(shard));
    }
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0, 1);
  for (int step = 0; step < 3; ++step) {
    std::vector<std::vector<float>> grads;
    std::vector<DenseShard*> shards;
    std::vector<const float*> grad_ptrs;
    // Every step but the first leaves a shard out: its count must not move.
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (step > 0 && i == static_cast<size_t>(step)) continue;
      grads.emplace_back(sizes[i]);
      for (float& g : grads.back()) g = dist(rng);
      shards.push_back(fused[i].get());
      grad_ptrs.push_back(grads.back().data());
      single[i]->Apply(grads.back().data());
    }
    // Reversed: the order of the list must not matter either.
    std::reverse(shards.begin(), shards.end());
    std::reverse(grad_ptrs.begin(), grad_ptrs.end());
    DenseShard::ApplyAll(shards, grad_ptrs, step == 2 ? nullptr : &pool);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<float> a, b;
    int64_t updates_a = 0, updates_b = 0;
    fused[i]->Snapshot(&a, &updates_a);
    single[i]->Snapshot(&b, &updates_b);
    EXPECT_EQ(updates_a, updates_b) << "shard " << i;
    EXPECT_EQ(updates_a, i == 1 || i == 2 ? 2 : 3) << "shard " << i;
    ASSERT_EQ(a.size(), b.size());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0)
        << "shard " << i << " (values and slots) differs";
  }
}

TEST(DenseShardTest, SnapshotRestoreRoundTrip) {
  auto a = DenseShard::Create(Spec({5, 2}, 0, 5));
  auto b = DenseShard::Create(Spec({5, 2}, 0, 5));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> g(10, 0.25f);
  (*a)->Apply(g.data());
  std::vector<float> data;
  int64_t updates = 0;
  (*a)->Snapshot(&data, &updates);
  ASSERT_TRUE((*b)->Restore(data, updates).ok());
  std::vector<float> va(10), vb(10);
  (*a)->ReadValues(va.data());
  (*b)->ReadValues(vb.data());
  EXPECT_EQ(va, vb);
  EXPECT_EQ((*b)->updates(), 1);
  data.pop_back();
  absl::Status s = (*b)->Restore(data, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("restoring 9 floats"));
}

TEST(DenseShardTest, RefusesBadSpecsNamingTheVariable) {
  auto bad_rows = DenseShard::Create(Spec({4, 2}, 3, 6));
  EXPECT_EQ(bad_rows.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad_rows.status().message()),
              HasSubstr("variable w partition 1: rows [3, 6) are not within the variable's 4"));
  v1::DenseShardSpec no_opt = Spec({4}, 0, 4);
  no_opt.mutable_variable()->clear_optimizer();
  auto s = DenseShard::Create(no_opt);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("variable w: "));
  v1::DenseShardSpec int_var = Spec({4}, 0, 4);
  int_var.mutable_variable()->set_dtype(v1::DT_INT64);
  EXPECT_THAT(std::string(DenseShard::Create(int_var).status().message()),
              HasSubstr("only DT_FLOAT32"));
}

// Found by fuzz/parameter_store_fuzzer: partition -1 was created, then listed as a dense
// shard that Inspect (where -1 selects a table) could not find.
TEST(DenseShardTest, RefusesANegativePartitionIndex) {
  v1::DenseShardSpec spec = Spec({4}, 0, 4);
  spec.mutable_partition()->set_partition(-1);
  for (const absl::Status& s :
       {DenseShard::Create(spec).status(), DenseShard::BytesFor(spec).status()}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()),
                HasSubstr("variable w partition -1: a partition index must be >= 0"));
  }
}

TEST(DenseShardTest, FloatStatsSkipNonFinite) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> v = {1, 2, 3, nan, -inf, -4};
  v1::ValueStats stats;
  ComputeFloatStats(v.data(), v.size(), &stats);
  EXPECT_EQ(stats.count(), 4);
  EXPECT_EQ(stats.nan_count(), 1);
  EXPECT_EQ(stats.inf_count(), 1);
  EXPECT_DOUBLE_EQ(stats.min(), -4);
  EXPECT_DOUBLE_EQ(stats.max(), 3);
  EXPECT_DOUBLE_EQ(stats.mean(), 0.5);
  EXPECT_DOUBLE_EQ(stats.l2_norm(), std::sqrt(30.0));
  EXPECT_DOUBLE_EQ(stats.std(), std::sqrt(30.0 / 4 - 0.25));
  EXPECT_EQ(FindNonFinite(v.data(), v.size()), 3);
  EXPECT_EQ(FindNonFinite(v.data(), 3), -1);
}

// A product of two floats computed where the compiler cannot fold it: the thread's own mode.
float Multiply(float a, float b) {
  volatile float x = a;
  volatile float y = b;
  return x * y;
}

// Updates flush denormals to zero, as TensorFlow's kernels do (optimizer.h), on the calling
// thread and on the pool's threads alike, and leave the caller's floating-point mode as it was.
TEST(DenseShardTest, UpdatesFlushDenormalsToZero) {
  ThreadPool pool(3);
  for (int64_t n : {int64_t{5}, int64_t{100000}}) {  // one thread; blocks on the pool
    v1::DenseShardSpec spec = Spec({n}, 0, n, /*lr=*/1.0f);
    spec.mutable_variable()->mutable_initializer()->set_kind(v1::InitializerSpec::CONSTANT);
    spec.mutable_variable()->mutable_initializer()->set_value(2e-38f);  // normal: >= 2^-126
    auto shard = DenseShard::Create(spec);
    ASSERT_TRUE(shard.ok());
    // 2e-38 - 1.5e-38 = 5e-39 is denormal: it becomes 0.
    std::vector<float> grad(static_cast<size_t>(n), 1.5e-38f);
    (*shard)->Apply(grad.data(), &pool);
    std::vector<float> values(static_cast<size_t>(n), -1.0f);
    (*shard)->ReadValues(values.data());
    EXPECT_THAT(values, ::testing::Each(0.0f)) << n;
  }
  EXPECT_GT(Multiply(2e-38f, 0.25f), 0.0f);  // this thread still computes denormals
}

// The pool's scan gives the serial scan's answer: the first hit, wherever the blocks split.
TEST(DenseShardTest, ParallelFindNonFiniteFindsTheFirstHit) {
  ThreadPool pool(3);
  const int64_t n = 9 * kParallelScanBlock + 123;
  std::vector<float> v(static_cast<size_t>(n), 1.0f);
  EXPECT_EQ(FindNonFinite(v.data(), n, &pool), -1);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  v[n - 1] = inf;
  EXPECT_EQ(FindNonFinite(v.data(), n, &pool), n - 1);
  v[5 * kParallelScanBlock + 7] = nan;  // in a later block than the next one
  v[2 * kParallelScanBlock + 1] = -inf;
  for (int round = 0; round < 20; ++round) {
    ASSERT_EQ(FindNonFinite(v.data(), n, &pool), 2 * kParallelScanBlock + 1);
  }
  EXPECT_EQ(FindNonFinite(v.data(), n, nullptr), 2 * kParallelScanBlock + 1);
  v[0] = nan;
  EXPECT_EQ(FindNonFinite(v.data(), n, &pool), 0);
  // Too small to split: the calling thread scans it.
  EXPECT_EQ(FindNonFinite(v.data() + 1, 100, &pool), -1);
}

// Many writers and readers on one shard: no update is lost, no read is torn.
TEST(DenseShardTest, ConcurrentPushesAndPullsAreAtomic) {
  v1::DenseShardSpec spec = Spec({1000}, 0, 1000, /*lr=*/1.0f);
  spec.mutable_variable()->mutable_initializer()->set_kind(v1::InitializerSpec::CONSTANT);
  spec.mutable_variable()->mutable_initializer()->set_value(0.0f);
  auto shard = DenseShard::Create(spec);
  ASSERT_TRUE(shard.ok());
  constexpr int kWriters = 8, kPushes = 200;
  std::vector<float> grad(1000, -1.0f);  // every push adds exactly 1 to every element
  std::atomic<bool> torn{false};
  std::atomic<bool> done{false};
  std::vector<std::thread> threads;
  for (int w = 0; w < kWriters; ++w) {
    threads.emplace_back([&] {
      for (int i = 0; i < kPushes; ++i) (*shard)->Apply(grad.data());
    });
  }
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([&] {
      std::vector<float> v(1000);
      while (!done.load()) {
        (*shard)->ReadValues(v.data());
        for (float x : v) {
          if (x != v[0]) torn = true;
        }
      }
    });
  }
  for (int w = 0; w < kWriters; ++w) threads[w].join();
  done = true;
  for (size_t i = kWriters; i < threads.size(); ++i) threads[i].join();
  EXPECT_FALSE(torn.load());
  std::vector<float> v(1000);
  (*shard)->ReadValues(v.data());
  for (float x : v) ASSERT_EQ(x, kWriters * kPushes);
  EXPECT_EQ((*shard)->updates(), kWriters * kPushes);
}

}  // namespace
}  // namespace pscluster
