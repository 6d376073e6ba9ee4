#include "ps_server/admission_filter.h"

#include <algorithm>

#include "ps_server/row_index.h"

namespace pscluster {

constexpr int AdmissionFilter::kRows;

AdmissionFilter::AdmissionFilter(int64_t width, uint32_t min_count, double probability)
    : width_(width),
      min_count_(min_count),
      probability_(probability),
      counters_(static_cast<size_t>(kRows * width), 0) {}

bool AdmissionFilter::Admit(int64_t key, std::vector<Bump>* bumps) const {
  // A hash unlike the stripe's and the index's (both MixKey of the key itself).
  const uint64_t h = MixKey(key ^ static_cast<int64_t>(0x9e3779b97f4a7c15ULL));
  const uint64_t h1 = h & 0xffffffffu, h2 = (h >> 32) | 1;
  const uint64_t mask = static_cast<uint64_t>(width_) - 1;
  uint32_t counters[kRows];
  uint32_t estimate = 0xffff;
  for (int r = 0; r < kRows; ++r) {
    counters[r] = static_cast<uint32_t>(r * width_ + ((h1 + r * h2) & mask));
    estimate = std::min<uint32_t>(estimate, counters_[counters[r]]);
  }
  const uint32_t count = std::min<uint32_t>(estimate + 1, 0xffff);
  for (uint32_t c : counters) bumps->push_back({c, static_cast<uint16_t>(count)});
  if (count >= min_count_) return true;
  if (probability_ <= 0) return false;
  const uint64_t draw = MixKey(key ^ static_cast<int64_t>(count * 0xd6e8feb86659fd93ULL));
  return static_cast<double>(draw >> 11) * 0x1.0p-53 < probability_;
}

void AdmissionFilter::Apply(const std::vector<Bump>& bumps) {
  for (const Bump& b : bumps) {
    uint16_t& c = counters_[b.counter];
    c = std::max(c, b.value);
  }
}

void AdmissionFilter::Merge(const uint16_t* counters) {
  for (size_t i = 0; i < counters_.size(); ++i) {
    counters_[i] =
        static_cast<uint16_t>(std::min<uint32_t>(uint32_t{counters_[i]} + counters[i], 0xffff));
  }
}

void AdmissionFilter::Clear() { std::fill(counters_.begin(), counters_.end(), 0); }

}  // namespace pscluster
