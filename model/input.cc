#include "model/input.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/data/cifar10.h"
#include "model/data/criteo.h"
#include "model/data/csv.h"
#include "model/data/libsvm.h"
#include "model/data/mnist.h"
#include "model/data/shard.h"
#include "model/data/synthetic_ctr.h"

namespace pscluster {
namespace {

constexpr char kDefaultFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

// What the model takes: dense features per example and, if it has one, its input_shape.
struct ModelInput {
  int dense_dim = 0;
  const v1::ImageShape* shape = nullptr;  // Not owned; null: no input_shape.
};

ModelInput ModelInputOf(const v1::ModelConfig& model) {
  ModelInput input;
  input.dense_dim = model.input_dim();
  if (model.has_input_shape()) input.shape = &model.input_shape();
  return input;
}

std::string LayoutString(int height, int width, int channels) {
  return absl::StrCat(height, "x", width, "x", channels);
}

// OK if data of `features` per example, laid out as `image` if that is set, fits `model`;
// otherwise INVALID_ARGUMENT naming `source` (e.g. "CIFAR-10") and both numbers.
absl::Status CheckFits(const std::string& source, int features,
                       const std::optional<ImageLayout>& image, const ModelInput& model) {
  const std::string layout =
      image.has_value()
          ? absl::StrCat(" (", LayoutString(image->height, image->width, image->channels), ")")
          : "";
  if (features != model.dense_dim) {
    return absl::InvalidArgumentError(absl::StrCat(source, " gives ", features,
                                                   " features per example", layout,
                                                   "; the model's input_dim is ", model.dense_dim));
  }
  if (image.has_value() && model.shape != nullptr &&
      (image->height != model.shape->height() || image->width != model.shape->width() ||
       image->channels != model.shape->channels())) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, " gives ", LayoutString(image->height, image->width, image->channels),
        " images (height x width x channels); the model's input_shape is ",
        LayoutString(model.shape->height(), model.shape->width(), model.shape->channels())));
  }
  return absl::OkStatus();
}

CriteoOptions CriteoOptionsOf(const v1::DataConfig& config, int64_t limit) {
  CriteoOptions options;
  if (config.has_criteo_int_columns()) options.num_int = config.criteo_int_columns();
  if (config.has_criteo_cat_columns()) options.num_cat = config.criteo_cat_columns();
  options.hash_buckets = config.hash_buckets();
  options.max_examples = limit;
  return options;
}

CsvColumn::Type CsvTypeOf(v1::CsvColumn::Type type) {
  switch (type) {
    case v1::CsvColumn::FLOAT:
      return CsvColumn::Type::kFloat;
    case v1::CsvColumn::INT:
      return CsvColumn::Type::kInt;
    case v1::CsvColumn::STRING:
      return CsvColumn::Type::kString;
    case v1::CsvColumn::LABEL:
      return CsvColumn::Type::kLabel;
    default:
      return CsvColumn::Type::kIgnore;
  }
}

absl::StatusOr<CsvOptions> CsvOptionsOf(const v1::DataConfig& config, int64_t limit) {
  CsvOptions options;
  for (const v1::CsvColumn& c : config.csv_columns()) {
    if (!v1::CsvColumn::Type_IsValid(c.type())) {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV column ", c.name(), ": unknown type ", static_cast<int>(c.type())));
    }
    CsvColumn column;
    column.name = c.name();
    column.type = CsvTypeOf(c.type());
    if (c.has_default_value()) column.default_value = c.default_value();
    options.columns.push_back(std::move(column));
  }
  options.header = config.csv_header();
  if (config.csv_delimiter().size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat("CSV delimiter '", config.csv_delimiter(),
                                                   "' is ", config.csv_delimiter().size(),
                                                   " characters, expected one"));
  }
  if (!config.csv_delimiter().empty()) options.delimiter = config.csv_delimiter()[0];
  options.hash_buckets = config.hash_buckets();
  options.max_examples = limit;
  PS_RETURN_IF_ERROR(ValidateCsvOptions(options));
  return options;
}

int DenseColumns(const CsvOptions& options) {
  int dense = 0;
  for (const CsvColumn& c : options.columns) {
    if (c.type == CsvColumn::Type::kFloat || c.type == CsvColumn::Type::kInt) ++dense;
  }
  return dense;
}

// The first `limit` examples of `data` (all of them if limit is 0).
Dataset Prefix(Dataset data, int64_t limit) {
  if (limit == 0 || data.num_examples <= limit) return data;
  std::vector<int64_t> first(limit);
  for (int64_t i = 0; i < limit; ++i) first[i] = i;
  Dataset cut;
  SelectExamples(data, first, &cut);
  return cut;
}

absl::Status CheckDataConfigFor(const v1::DataConfig& config, const ModelInput& model) {
  const int dense_dim = model.dense_dim;
  switch (config.kind()) {
    case v1::DataConfig::CRITEO: {
      const CriteoOptions options = CriteoOptionsOf(config, 0);
      if (options.num_int < 0 || options.num_cat < 0 || options.hash_buckets < 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "CRITEO data: criteo_int_columns (", options.num_int, "), criteo_cat_columns (",
            options.num_cat, ") and hash_buckets (", options.hash_buckets, ") must be >= 0"));
      }
      if (options.num_int != dense_dim) {
        return absl::InvalidArgumentError(
            absl::StrCat("CRITEO data has ", options.num_int,
                         " integer columns (dense features) but the model's "
                         "input_dim is ",
                         dense_dim, ": set criteo_int_columns or the model's input_dim"));
      }
      return absl::OkStatus();
    }
    case v1::DataConfig::CSV: {
      PS_ASSIGN_OR_RETURN(const CsvOptions options, CsvOptionsOf(config, 0));
      const int dense = DenseColumns(options);
      if (dense != dense_dim) {
        return absl::InvalidArgumentError(
            absl::StrCat("CSV data has ", dense,
                         " float and int columns (dense features) but the model's "
                         "input_dim is ",
                         dense_dim));
      }
      return absl::OkStatus();
    }
    case v1::DataConfig::CIFAR10: {
      if (config.path().empty()) {
        return absl::InvalidArgumentError(
            "CIFAR10 data needs a path: the folder of data_batch_1.bin .. data_batch_5.bin and "
            "test_batch.bin (CIFAR-10 binary version)");
      }
      return CheckFits("CIFAR-10", kCifar10ImageBytes,
                       ImageLayout{kCifar10Height, kCifar10Width, kCifar10Channels}, model);
    }
    default:
      return absl::OkStatus();
  }
}

absl::StatusOr<Dataset> LoadDatasetFor(const v1::DataConfig& config, const ModelInput& model,
                                       bool train) {
  const int dense_dim = model.dense_dim;
  const int64_t limit = train ? config.max_train_examples() : config.max_test_examples();
  switch (config.kind()) {
    case v1::DataConfig::FASHION_MNIST: {
      const std::string dir = config.path().empty() ? kDefaultFashionMnistDir : config.path();
      MnistOptions options;
      options.max_examples = limit;
      PS_ASSIGN_OR_RETURN(Dataset data, ReadMnistDir(dir, train, options));
      PS_RETURN_IF_ERROR(
          CheckFits(absl::StrCat("the idx data in ", dir), data.dense_dim, data.image, model));
      return data;
    }
    case v1::DataConfig::CIFAR10: {
      PS_RETURN_IF_ERROR(CheckDataConfigFor(config, model));
      Cifar10Options options;
      options.max_examples = limit;
      return ReadCifar10Dir(config.path(), train, options);
    }
    case v1::DataConfig::LIBSVM: {
      const std::string& path = train ? config.path() : config.test_path();
      PS_ASSIGN_OR_RETURN(Dataset data, ReadLibsvm(path, dense_dim));
      return Prefix(std::move(data), limit);
    }
    case v1::DataConfig::CRITEO: {
      PS_RETURN_IF_ERROR(CheckDataConfigFor(config, model));
      return ReadCriteo(train ? config.path() : config.test_path(), CriteoOptionsOf(config, limit));
    }
    case v1::DataConfig::CSV: {
      PS_RETURN_IF_ERROR(CheckDataConfigFor(config, model));
      PS_ASSIGN_OR_RETURN(const CsvOptions options, CsvOptionsOf(config, limit));
      return ReadCsv(train ? config.path() : config.test_path(), options);
    }
    case v1::DataConfig::SYNTHETIC_CTR: {
      // Training and test examples are independent streams from the same planted model.
      SyntheticCtrOptions options;
      const int64_t n_train =
          config.synthetic_examples() > 0 ? config.synthetic_examples() : 100000;
      options.num_examples = train ? (limit > 0 ? std::min(limit, n_train) : n_train)
                                   : (limit > 0 ? limit : std::max<int64_t>(1, n_train / 5));
      options.dense_dim = dense_dim;
      if (config.synthetic_fields() > 0) options.num_fields = config.synthetic_fields();
      if (config.synthetic_ids_per_field() > 0) {
        options.ids_per_field = config.synthetic_ids_per_field();
      }
      options.seed = config.seed();
      options.example_stream = train ? 0 : 1;
      return GenerateSyntheticCtr(options);
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown data kind ", static_cast<int>(config.kind())));
  }
}

}  // namespace

absl::Status CheckDataConfig(const v1::DataConfig& config, int dense_dim) {
  ModelInput model;
  model.dense_dim = dense_dim;
  return CheckDataConfigFor(config, model);
}

absl::Status CheckDataConfig(const v1::DataConfig& config, const v1::ModelConfig& model) {
  return CheckDataConfigFor(config, ModelInputOf(model));
}

absl::StatusOr<std::vector<v1::CsvColumn>> CsvColumnsFromSpec(absl::string_view spec) {
  PS_ASSIGN_OR_RETURN(const std::vector<CsvColumn> parsed, ParseCsvColumns(spec));
  std::vector<v1::CsvColumn> columns;
  for (const CsvColumn& c : parsed) {
    v1::CsvColumn column;
    column.set_name(c.name);
    switch (c.type) {
      case CsvColumn::Type::kFloat:
        column.set_type(v1::CsvColumn::FLOAT);
        break;
      case CsvColumn::Type::kInt:
        column.set_type(v1::CsvColumn::INT);
        break;
      case CsvColumn::Type::kString:
        column.set_type(v1::CsvColumn::STRING);
        break;
      case CsvColumn::Type::kLabel:
        column.set_type(v1::CsvColumn::LABEL);
        break;
      case CsvColumn::Type::kIgnore:
        column.set_type(v1::CsvColumn::IGNORE);
        break;
    }
    if (c.default_value.has_value()) column.set_default_value(*c.default_value);
    columns.push_back(std::move(column));
  }
  return columns;
}

absl::StatusOr<Dataset> LoadDataset(const v1::DataConfig& config, int dense_dim, bool train) {
  ModelInput model;
  model.dense_dim = dense_dim;
  return LoadDatasetFor(config, model, train);
}

absl::StatusOr<Dataset> LoadDataset(const v1::DataConfig& config, const v1::ModelConfig& model,
                                    bool train) {
  return LoadDatasetFor(config, ModelInputOf(model), train);
}

}  // namespace pscluster
