#ifndef PSCLUSTER_PS_SERVER_HOT_KEY_SKETCH_H_
#define PSCLUSTER_PS_SERVER_HOT_KEY_SKETCH_H_

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "proto/ps_service.pb.h"

namespace pscluster {

// The most pushed keys of a table, approximately: a Space-Saving sketch (Metwally, Agrawal,
// El Abbadi 2005) of kCounters counters, fed by each push an evenly spaced sample of at most
// kSamplesPerPush of its key positions, each weighted by the sampling stride (duplicates within
// a push count once per occurrence). Counts estimate occurrences in pushes and may over-count
// (a new key inherits the count of the smallest counter it replaces); a key pushed much more
// than the others is reliably found. The sample's offset changes from push to push, so a
// periodic key layout is not always sampled at the same phase; it depends only on the number
// of pushes sampled before, so the same pushes give the same sketch.
//
// Thread-safe: one small lock, taken once per push.
class HotKeySketch {
 public:
  static constexpr int kCounters = 64;
  static constexpr int kSamplesPerPush = 128;

  // Counts a sample of keys[0, n). REQUIRES: keys holds n keys (may be null when n <= 0).
  void SamplePush(const int64_t* keys, int64_t n);

  // The keys with the highest counts, highest first (ties by key), at most min(k, kCounters)
  // of them; empty for k <= 0.
  std::vector<v1::HotKey> Top(int k) const;

 private:
  // One weighted Space-Saving update.
  void CountLocked(int64_t key, int64_t weight) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  // keys_[i] has the estimated count counts_[i], for i < size_. Plain arrays, which every sample
  // of every push scans: 64 keys side by side cost less to scan than a hash map's probe and its
  // slots (and nothing to allocate).
  int64_t keys_[kCounters] ABSL_GUARDED_BY(mu_) = {};
  int64_t counts_[kCounters] ABSL_GUARDED_BY(mu_) = {};
  int size_ ABSL_GUARDED_BY(mu_) = 0;
  // Pushes sampled so far; varies the sampling offset from push to push.
  uint64_t pushes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pscluster

#endif  // PSCLUSTER_PS_SERVER_HOT_KEY_SKETCH_H_
