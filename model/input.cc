#include "model/input.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/data/libsvm.h"
#include "model/data/mnist.h"
#include "model/data/shard.h"
#include "model/data/synthetic_ctr.h"

namespace pscluster {

absl::StatusOr<Dataset> LoadDataset(const v1::DataConfig& config, int dense_dim, bool train) {
  const int64_t limit = train ? config.max_train_examples() : config.max_test_examples();
  switch (config.kind()) {
    case v1::DataConfig::FASHION_MNIST: {
      const std::string dir =
          config.path().empty() ? "/usr/share/datasets/fashion-mnist" : config.path();
      MnistOptions options;
      options.max_examples = limit;
      return ReadMnistDir(dir, train, options);
    }
    case v1::DataConfig::LIBSVM: {
      const std::string& path = train ? config.path() : config.test_path();
      PS_ASSIGN_OR_RETURN(Dataset data, ReadLibsvm(path, dense_dim));
      if (limit > 0 && data.num_examples > limit) {
        std::vector<int64_t> first(limit);
        for (int64_t i = 0; i < limit; ++i) first[i] = i;
        Dataset cut;
        SelectExamples(data, first, &cut);
        return cut;
      }
      return data;
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

}  // namespace pscluster
