#ifndef PSCLUSTER_EVALUATOR_EVAL_RESULT_H_
#define PSCLUSTER_EVALUATOR_EVAL_RESULT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace pscluster {

class ParameterClient;

// One evaluation of the model on the test set.
struct EvalResult {
  int64_t step = 0;
  int64_t examples = 0;
  double loss = 0;
  double accuracy = 0;
  // Binary tasks only (-1 otherwise).
  double auc = -1;
  // Seconds of training (the chief's clock since the first step report) when the parameters
  // began to be read; -1 when not known.
  double training_seconds = -1;
};

// Evaluates the model as it is on the ps tasks, read through `client`, as of global step
// `step` (evaluator/evaluation.h's TestSetEvaluation is the one the chief runs).
using EvaluateFn = std::function<absl::StatusOr<EvalResult>(int64_t step, ParameterClient* client)>;

// One line of the metrics file: {"unix_seconds":..,"step":..,"test_loss":..,...,
// "evaluated_by":"evaluator:0"[,"training_seconds":..]}; `evaluated_by` names the task that
// computed it; `training_seconds` is there when the result's is known.
std::string MetricsJsonLine(const EvalResult& result, double train_loss, double examples_per_second,
                            double elapsed_seconds, const std::string& evaluated_by);

}  // namespace pscluster

#endif  // PSCLUSTER_EVALUATOR_EVAL_RESULT_H_
