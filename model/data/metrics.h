#ifndef PSCLUSTER_MODEL_DATA_METRICS_H_
#define PSCLUSTER_MODEL_DATA_METRICS_H_

#include <vector>

namespace pscluster {

// Evaluation metrics over whole score vectors. Pure functions: thread-safe.

// Area under the ROC curve: the probability that a random positive example scores above a
// random negative one, with tied scores counted as half. Exact, O(n log n) (one sort).
// A label > 0.5 is positive, any other label negative.
// Returns NaN when it is undefined: no positive or no negative example, or a NaN score.
// REQUIRES: scores.size() == labels.size().
double Auc(const std::vector<float>& scores, const std::vector<float>& labels);

// The fraction of examples predicted right, with the Dataset convention for num_classes:
//   num_classes == 0 (binary): scores[i] is the predicted probability of label 1; the
//     prediction is 1 iff scores[i] >= 0.5, right iff it equals labels[i] (0/1).
//   num_classes >= 2: scores is row-major [n x num_classes] (logits or probabilities); the
//     prediction is the argmax (the first on ties), right iff it equals labels[i].
// Returns NaN for n == 0.
// REQUIRES: num_classes == 0 or >= 2; scores.size() == labels.size() * max(1, num_classes).
double Accuracy(const std::vector<float>& scores, const std::vector<float>& labels,
                int num_classes);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_METRICS_H_
