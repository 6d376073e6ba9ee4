#include "evaluator/eval_result.h"

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace pscluster {

std::string MetricsJsonLine(const EvalResult& r, double train_loss, double examples_per_second,
                            double elapsed_seconds, const std::string& evaluated_by) {
  return absl::StrFormat(
      "{\"unix_seconds\": %.3f, \"elapsed_seconds\": %.3f, \"step\": %d, \"test_examples\": %d, "
      "\"test_loss\": %.6f, \"test_accuracy\": %.6f, \"test_auc\": %.6f, \"train_loss\": %.6f, "
      "\"examples_per_second\": %.1f, \"evaluated_by\": \"%s\"%s}",
      absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()), elapsed_seconds, r.step, r.examples,
      r.loss, r.accuracy, r.auc, train_loss, examples_per_second, evaluated_by,
      r.training_seconds >= 0 ? absl::StrFormat(", \"training_seconds\": %.3f", r.training_seconds)
                              : "");
}

}  // namespace pscluster
