#ifndef PSCLUSTER_MODEL_INPUT_H_
#define PSCLUSTER_MODEL_INPUT_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/data/dataset.h"
#include "proto/model_config.pb.h"

namespace pscluster {

// The training (train = true) or test examples a DataConfig names: Fashion-MNIST idx files,
// libsvm text, Criteo TSV or CSV (from `path` when training, `test_path` when testing), or
// synthetic CTR data (the test set is generated past the training examples, from the same
// planted model). At most max_train_examples / max_test_examples of them (0: all). Errors name
// the file and what was wrong; INVALID_ARGUMENT also if the data's dense features are not
// `dense_dim` (the model's input_dim) for CRITEO or CSV, as CheckDataConfig says.
absl::StatusOr<Dataset> LoadDataset(const v1::DataConfig& config, int dense_dim, bool train);

// OK if the options of `config` are usable for a model of `dense_dim` dense features, checked
// without reading any file: for CRITEO, field counts >= 0, hash_buckets >= 0 and the integer
// columns equal to dense_dim; for CSV, columns as model/data/csv.h's ValidateCsvOptions wants
// them, a one-character delimiter, and as many FLOAT and INT columns as dense_dim. Other kinds
// are always OK here. Otherwise INVALID_ARGUMENT saying what is wrong.
absl::Status CheckDataConfig(const v1::DataConfig& config, int dense_dim);

// The DataConfig columns of the command-line form "name:type[:default],..." (model/data/csv.h's
// ParseCsvColumns; e.g. "click:label,age:float:0,city:string:"). Errors: INVALID_ARGUMENT naming
// the entry and what is wrong.
absl::StatusOr<std::vector<v1::CsvColumn>> CsvColumnsFromSpec(absl::string_view spec);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_INPUT_H_
