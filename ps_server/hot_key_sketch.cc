#include "ps_server/hot_key_sketch.h"

#include <algorithm>
#include <utility>

#include "ps_server/row_index.h"

namespace pscluster {

constexpr int HotKeySketch::kCounters;
constexpr int HotKeySketch::kSamplesPerPush;

void HotKeySketch::SamplePush(const int64_t* keys, int64_t n) {
  if (n <= 0) return;
  // Each sampled key stands for `step` positions, so a 100k-key push costs the sketch at most
  // kSamplesPerPush updates.
  const int64_t step = (n + kSamplesPerPush - 1) / kSamplesPerPush;
  absl::MutexLock lock(&mu_);
  const int64_t offset = step == 1 ? 0
                                   : static_cast<int64_t>(MixKey(static_cast<int64_t>(pushes_)) %
                                                          static_cast<uint64_t>(step));
  ++pushes_;
  for (int64_t pos = offset; pos < n; pos += step) CountLocked(keys[pos], step);
}

void HotKeySketch::CountLocked(int64_t key, int64_t weight) {
  for (int i = 0; i < size_; ++i) {
    if (keys_[i] == key) {
      counts_[i] += weight;
      return;
    }
  }
  if (size_ < kCounters) {
    keys_[size_] = key;
    counts_[size_++] = weight;
    return;
  }
  // The new key replaces the smallest counter (the smallest key among equal ones) and inherits
  // its count, so a count over-estimates by at most that inherited amount.
  int min = 0;
  for (int i = 1; i < kCounters; ++i) {
    if (counts_[i] < counts_[min] || (counts_[i] == counts_[min] && keys_[i] < keys_[min])) {
      min = i;
    }
  }
  keys_[min] = key;
  counts_[min] += weight;
}

std::vector<v1::HotKey> HotKeySketch::Top(int k) const {
  if (k <= 0) return {};
  std::vector<std::pair<int64_t, int64_t>> counts;  // (key, count)
  {
    absl::MutexLock lock(&mu_);
    for (int i = 0; i < size_; ++i) counts.emplace_back(keys_[i], counts_[i]);
  }
  std::sort(counts.begin(), counts.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (counts.size() > static_cast<size_t>(k)) counts.resize(static_cast<size_t>(k));
  std::vector<v1::HotKey> hot(counts.size());
  for (size_t i = 0; i < counts.size(); ++i) {
    hot[i].set_key(counts[i].first);
    hot[i].set_count(counts[i].second);
  }
  return hot;
}

}  // namespace pscluster
