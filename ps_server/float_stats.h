#ifndef PSCLUSTER_PS_SERVER_FLOAT_STATS_H_
#define PSCLUSTER_PS_SERVER_FLOAT_STATS_H_

#include <cstdint>
#include <limits>

#include "proto/ps_service.pb.h"

namespace pscluster {

class ThreadPool;

// Returns the index of the first NaN or Inf of v[0..n), or -1 if every value is finite. A
// branch-free scan that vectorizes; only a block with a hit is searched element by element.
int64_t FindNonFinite(const float* v, int64_t n);

// The same answer, with blocks of a large array scanned on `pool`'s threads too (null, or an
// array under 2 * kParallelScanBlock floats: the calling thread alone).
inline constexpr int64_t kParallelScanBlock = 32768;
int64_t FindNonFinite(const float* v, int64_t n, ThreadPool* pool);

// Statistics of float values fed in any number of pieces: count, min, max, mean, std
// (population), L2 norm over the finite values, accumulated in double; NaN and Inf are counted
// apart and left out of the rest. Thread-compatible.
class FloatStats {
 public:
  void Add(const float* values, int64_t n);
  // Overwrites *stats; min/max/mean/std/l2_norm stay 0 when no value is finite.
  void Fill(v1::ValueStats* stats) const;

 private:
  int64_t count_ = 0, nan_ = 0, inf_ = 0;
  double min_ = std::numeric_limits<double>::infinity();
  double max_ = -std::numeric_limits<double>::infinity();
  double sum_ = 0, sum_sq_ = 0;
};

// FloatStats of one array.
void ComputeFloatStats(const float* values, int64_t n, v1::ValueStats* stats);

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_FLOAT_STATS_H_
