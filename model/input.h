#ifndef PSCLUSTER_MODEL_INPUT_H_
#define PSCLUSTER_MODEL_INPUT_H_

#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/data/dataset.h"
#include "proto/model_config.pb.h"

namespace pscluster {

// The training (train = true) or test examples a DataConfig names: idx files (Fashion-MNIST by
// default), the CIFAR-10 binary batches, libsvm text, Criteo TSV or CSV (from `path` when
// training, `test_path` when testing), or synthetic CTR data (the test set is generated past the
// training examples, from the same planted model). At most max_train_examples /
// max_test_examples of them (0: all). Errors name the file and what was wrong; INVALID_ARGUMENT
// also if the data's dense features per example are not the model's input_dim (CRITEO, CSV and
// CIFAR10 before reading any file, as CheckDataConfig; FASHION_MNIST once the idx header gives
// the image size), e.g. "CIFAR-10 gives 3072 features per example (32x32x3); the model's
// input_dim is 784", and, for the image kinds (FASHION_MNIST, CIFAR10) when the model has an
// input_shape, if the images' height, width and channels are not the input_shape's.
absl::StatusOr<Dataset> LoadDataset(const v1::DataConfig& config, const v1::ModelConfig& model,
                                    bool train);

// As above for a model of `dense_dim` (its input_dim) dense features and no input_shape: the
// image layout is not checked.
absl::StatusOr<Dataset> LoadDataset(const v1::DataConfig& config, int dense_dim, bool train);

// OK if the options of `config` are usable for `model`, checked without reading any file: for
// CRITEO, field counts >= 0, hash_buckets >= 0 and the integer columns equal to the input_dim;
// for CSV, columns as model/data/csv.h's ValidateCsvOptions wants them, a one-character
// delimiter, and as many FLOAT and INT columns as the input_dim; for CIFAR10, a path, an
// input_dim of 3072 and, if the model has an input_shape, [32, 32, 3]. Other kinds are always OK
// here. Otherwise INVALID_ARGUMENT saying what is wrong.
absl::Status CheckDataConfig(const v1::DataConfig& config, const v1::ModelConfig& model);

// As above for a model of `dense_dim` dense features and no input_shape.
absl::Status CheckDataConfig(const v1::DataConfig& config, int dense_dim);

// The DataConfig columns of the command-line form "name:type[:default],..." (model/data/csv.h's
// ParseCsvColumns; e.g. "click:label,age:float:0,city:string:"). Errors: INVALID_ARGUMENT naming
// the entry and what is wrong.
absl::StatusOr<std::vector<v1::CsvColumn>> CsvColumnsFromSpec(absl::string_view spec);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_INPUT_H_
