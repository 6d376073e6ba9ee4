#ifndef PSCLUSTER_EVALUATOR_EVALUATION_H_
#define PSCLUSTER_EVALUATOR_EVALUATION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/parameter_client.h"
#include "kernels/kernels.h"
#include "model/data/dataset.h"
#include "model/model.h"
#include "proto/model_config.pb.h"

namespace pscluster {

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

// Computes the test loss and accuracy (AUC for binary tasks) of the model's current parameters,
// pulled from the ps tasks, on the CPU or a GPU. Forward passes only. Embedding rows of test ids
// that training never touched are created by the pull, with their initial values.
// Thread-compatible.
class Evaluator {
 public:
  // `client` is not owned and must outlive the evaluator. `kernels` computes (null: the
  // evaluator's own CPU kernels); not owned, it must outlive the evaluator.
  static absl::StatusOr<std::unique_ptr<Evaluator>> Create(const v1::ModelConfig& config,
                                                           ParameterClient* client, Dataset test,
                                                           int batch_size = 1000,
                                                           Kernels* kernels = nullptr);

  absl::StatusOr<EvalResult> Evaluate(int64_t step);

 private:
  Evaluator(ParameterClient* client, Dataset test, int batch_size);

  ParameterClient* const client_;  // Not owned.
  const Dataset test_;
  const int batch_size_;
  std::unique_ptr<Kernels> own_kernels_;  // the CPU's, when not given one
  std::unique_ptr<Model> model_;
};

// One line of the metrics file: {"unix_seconds":..,"step":..,"test_loss":..,...,
// "evaluated_by":"evaluator:0"[,"training_seconds":..]}; `evaluated_by` names the task that
// computed it; `training_seconds` is there when the result's is known.
std::string MetricsJsonLine(const EvalResult& result, double train_loss, double examples_per_second,
                            double elapsed_seconds, const std::string& evaluated_by);

}  // namespace pscluster

#endif  // PSCLUSTER_EVALUATOR_EVALUATION_H_
