#ifndef PSCLUSTER_EVALUATOR_EVALUATION_H_
#define PSCLUSTER_EVALUATOR_EVALUATION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/parameter_client.h"
#include "evaluator/eval_result.h"
#include "kernels/kernels.h"
#include "model/data/dataset.h"
#include "model/model.h"
#include "proto/model_config.pb.h"

namespace pscluster {

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

// The chief's own evaluation (CoordinatorOptions::evaluate): an Evaluator on the CPU over the
// test set of `data` (model/input.h's LoadDataset), made at the first call and kept. Calls
// must not overlap.
EvaluateFn TestSetEvaluation(v1::ModelConfig config, v1::DataConfig data);

}  // namespace pscluster

#endif  // PSCLUSTER_EVALUATOR_EVALUATION_H_
