#ifndef PSCLUSTER_MODEL_INPUT_H_
#define PSCLUSTER_MODEL_INPUT_H_

#include "absl/status/statusor.h"
#include "model/data/dataset.h"
#include "proto/model_config.pb.h"

namespace pscluster {

// The training (train = true) or test examples a DataConfig names: Fashion-MNIST idx files,
// libsvm text, or synthetic CTR data (the test set is generated past the training examples,
// from the same planted model). Errors name the file and what was wrong.
absl::StatusOr<Dataset> LoadDataset(const v1::DataConfig& config, int dense_dim, bool train);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_INPUT_H_
