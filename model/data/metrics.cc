#include "model/data/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>

#include "glog/logging.h"

namespace pscluster {

double Auc(const std::vector<float>& scores, const std::vector<float>& labels) {
  CHECK_EQ(scores.size(), labels.size()) << "Auc needs one label per score";
  constexpr double kUndefined = std::numeric_limits<double>::quiet_NaN();
  for (const float s : scores) {
    if (std::isnan(s)) return kUndefined;
  }
  std::vector<size_t> order(scores.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [&scores](size_t a, size_t b) { return scores[a] < scores[b]; });

  // Walk groups of equal score from the lowest up: each positive in a group beats every
  // negative below the group and ties with each negative inside it.
  double wins = 0;
  int64_t negatives_below = 0;
  int64_t positives = 0;
  for (size_t begin = 0; begin < order.size();) {
    size_t end = begin;
    int64_t group_positives = 0;
    int64_t group_negatives = 0;
    while (end < order.size() && scores[order[end]] == scores[order[begin]]) {
      if (labels[order[end]] > 0.5f) {
        ++group_positives;
      } else {
        ++group_negatives;
      }
      ++end;
    }
    wins += static_cast<double>(group_positives) *
            (static_cast<double>(negatives_below) + 0.5 * static_cast<double>(group_negatives));
    negatives_below += group_negatives;
    positives += group_positives;
    begin = end;
  }
  if (positives == 0 || negatives_below == 0) return kUndefined;
  return wins / (static_cast<double>(positives) * static_cast<double>(negatives_below));
}

double Accuracy(const std::vector<float>& scores, const std::vector<float>& labels,
                int num_classes) {
  CHECK(num_classes == 0 || num_classes >= 2) << "num_classes " << num_classes;
  const size_t width = num_classes == 0 ? 1 : static_cast<size_t>(num_classes);
  CHECK_EQ(scores.size(), labels.size() * width)
      << "Accuracy needs " << width << " score(s) per label";
  if (labels.empty()) return std::numeric_limits<double>::quiet_NaN();
  int64_t right = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    float predicted;
    if (num_classes == 0) {
      predicted = scores[i] >= 0.5f ? 1.0f : 0.0f;
    } else {
      const auto row = scores.begin() + i * width;
      predicted = static_cast<float>(std::max_element(row, row + width) - row);
    }
    if (predicted == labels[i]) ++right;
  }
  return static_cast<double>(right) / static_cast<double>(labels.size());
}

}  // namespace pscluster
