#include "evaluator/evaluation.h"

#include "common/status_macros.h"
#include "model/data/metrics.h"
#include "model/data/shard.h"
#include "model/input.h"

namespace pscluster {

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(const v1::ModelConfig& config,
                                                             ParameterClient* client, Dataset test,
                                                             int batch_size, Kernels* kernels) {
  auto e = std::unique_ptr<Evaluator>(new Evaluator(client, std::move(test), batch_size));
  if (kernels == nullptr) {
    e->own_kernels_ = NewCpuKernels();
    kernels = e->own_kernels_.get();
  }
  PS_ASSIGN_OR_RETURN(e->model_, Model::Create(config, kernels, batch_size));
  return e;
}

Evaluator::Evaluator(ParameterClient* client, Dataset test, int batch_size)
    : client_(client), test_(std::move(test)), batch_size_(batch_size) {}

absl::StatusOr<EvalResult> Evaluator::Evaluate(int64_t step) {
  std::vector<std::vector<float>> params;
  // Sync: the model as of `step` (complete later steps stay pending; see PullDenseRequest.step).
  PS_RETURN_IF_ERROR(client_->Pull(model_->dense_variables(), &params, step));
  std::vector<const float*> param_ptrs;
  for (const auto& p : params) param_ptrs.push_back(p.data());
  EvalResult r;
  r.step = step;
  double loss_sum = 0;
  int64_t correct = 0;
  std::vector<float> scores, labels;
  Dataset batch;
  SparseInput sparse;
  StepResult out;
  std::vector<std::vector<float>> rows(model_->tables().size());
  for (int64_t begin = 0; begin < test_.num_examples; begin += batch_size_) {
    std::vector<int64_t> positions;
    for (int64_t i = begin; i < std::min(test_.num_examples, begin + batch_size_); ++i) {
      positions.push_back(i);
    }
    SelectExamples(test_, positions, &batch);
    Batch b;
    b.size = static_cast<int>(batch.num_examples);
    b.dense = batch.dense.data();
    if (!batch.sparse_offsets.empty()) {
      b.sparse_offsets = batch.sparse_offsets.data();
      b.sparse_ids = batch.sparse_ids.data();
    }
    b.labels = batch.labels.data();
    Model::PrepareSparse(b, &sparse);
    std::vector<const float*> row_ptrs;
    for (size_t t = 0; t < rows.size(); ++t) {
      rows[t].resize(sparse.unique_ids.size() * model_->table_dims()[t]);
      PS_RETURN_IF_ERROR(client_->PullRows(model_->tables()[t], sparse.unique_ids.data(),
                                           sparse.unique_ids.size(), rows[t].data(), step));
      row_ptrs.push_back(rows[t].data());
    }
    PS_RETURN_IF_ERROR(model_->Compute(b, sparse, param_ptrs, row_ptrs, /*backward=*/false, &out));
    loss_sum += out.loss * b.size;
    correct += out.correct;
    scores.insert(scores.end(), out.scores.begin(), out.scores.end());
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.end());
  }
  r.examples = test_.num_examples;
  if (r.examples > 0) {
    r.loss = loss_sum / r.examples;
    r.accuracy = static_cast<double>(correct) / r.examples;
  }
  if (!scores.empty()) r.auc = Auc(scores, labels);
  return r;
}

EvaluateFn TestSetEvaluation(v1::ModelConfig config, v1::DataConfig data) {
  auto evaluator = std::make_shared<std::unique_ptr<Evaluator>>();
  return [config = std::move(config), data = std::move(data), evaluator](
             int64_t step, ParameterClient* client) -> absl::StatusOr<EvalResult> {
    if (*evaluator == nullptr) {
      PS_ASSIGN_OR_RETURN(Dataset test, LoadDataset(data, config, /*train=*/false));
      PS_ASSIGN_OR_RETURN(*evaluator, Evaluator::Create(config, client, std::move(test)));
    }
    return (*evaluator)->Evaluate(step);
  };
}

}  // namespace pscluster
