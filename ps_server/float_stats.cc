#include "ps_server/float_stats.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "common/thread_pool.h"

namespace pscluster {

int64_t FindNonFinite(const float* v, int64_t n) {
  constexpr uint32_t kExponentMask = 0x7f800000u;
  constexpr int64_t kBlock = 4096;
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    const int64_t end = std::min(n, begin + kBlock);
    uint32_t any = 0;
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, &v[i], sizeof(bits));
      any |= static_cast<uint32_t>((bits & kExponentMask) == kExponentMask);
    }
    if (any == 0) continue;
    for (int64_t i = begin; i < end; ++i) {
      if (!std::isfinite(v[i])) return i;
    }
  }
  return -1;
}

int64_t FindNonFinite(const float* v, int64_t n, ThreadPool* pool) {
  if (pool == nullptr || pool->num_threads() == 0 || n < 2 * kParallelScanBlock) {
    return FindNonFinite(v, n);
  }
  // The first hit over all blocks: each block lowers `first` to its own first hit.
  std::atomic<int64_t> first{n};
  pool->ParallelFor(n, kParallelScanBlock, [&](int64_t begin, int64_t end) {
    const int64_t bad = FindNonFinite(v + begin, end - begin);
    if (bad < 0) return;
    int64_t seen = first.load(std::memory_order_relaxed);
    while (begin + bad < seen && !first.compare_exchange_weak(seen, begin + bad)) {
    }
  });
  const int64_t bad = first.load();
  return bad == n ? -1 : bad;
}

void FloatStats::Add(const float* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double v = values[i];
    if (std::isnan(v)) {
      ++nan_;
    } else if (std::isinf(v)) {
      ++inf_;
    } else {
      ++count_;
      min_ = std::min(min_, v);
      max_ = std::max(max_, v);
      sum_ += v;
      sum_sq_ += v * v;
    }
  }
}

void FloatStats::Fill(v1::ValueStats* stats) const {
  stats->Clear();
  stats->set_count(count_);
  stats->set_nan_count(nan_);
  stats->set_inf_count(inf_);
  if (count_ == 0) return;
  const double mean = sum_ / static_cast<double>(count_);
  stats->set_min(min_);
  stats->set_max(max_);
  stats->set_mean(mean);
  stats->set_std(std::sqrt(std::max(0.0, sum_sq_ / static_cast<double>(count_) - mean * mean)));
  stats->set_l2_norm(std::sqrt(sum_sq_));
}

void ComputeFloatStats(const float* values, int64_t n, v1::ValueStats* stats) {
  FloatStats s;
  s.Add(values, n);
  s.Fill(stats);
}

}  // namespace pscluster
