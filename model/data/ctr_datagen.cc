// ctr_datagen: writes synthetic click logs in the Criteo layout (a training and a test file)
// from a planted logistic model, reads the test file back with the Criteo reader and prints
// the planted model's test AUC: the best a model trained on the files can reach.
#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "gflags/gflags.h"
#include "model/data/criteo.h"
#include "model/data/metrics.h"
#include "model/data/synthetic_criteo.h"

DEFINE_string(train_out, "", "Path of the training file to write (gzip if it ends in .gz).");
DEFINE_string(test_out, "", "Path of the test file to write (gzip if it ends in .gz).");
DEFINE_int64(train_examples, 100000, "Lines of the training file.");
DEFINE_int64(test_examples, 20000, "Lines of the test file.");
DEFINE_uint64(seed, 1, "Seed of the planted model and of the examples.");
DEFINE_int32(num_int, 13, "Integer (count) columns; the reader's --criteo_int_columns.");
DEFINE_int32(num_cat, 26, "Categorical columns; the reader's --criteo_cat_columns.");
DEFINE_int64(ids_per_field, 1000, "Distinct values per categorical column.");
DEFINE_int64(hash_buckets, 0,
             "The reader's --hash_buckets (the planted weights are per id, so values it "
             "merges share one).");
DEFINE_double(zipf_exponent, 1.05, "Skew of value popularity (0: uniform).");
DEFINE_double(missing_rate, 0.05, "Chance that a field is empty.");
DEFINE_double(dense_weight_stddev, 0.3, "Standard deviation of a planted dense weight.");
DEFINE_double(id_weight_stddev, 0.2, "Standard deviation of a planted per-value weight.");
DEFINE_double(bias, -1.5, "Planted bias in logits (-1.5: about 30% clicks).");

namespace {

int Fail(const std::string& message) {
  std::fprintf(stderr, "ctr_datagen: %s\n", message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "writes synthetic Criteo-layout click logs from a planted logistic model and prints the "
      "planted model's test AUC.\nusage: ctr_datagen --train_out=F --test_out=F "
      "[--train_examples=N] [--test_examples=N] [--seed=N] [--num_int=N] [--num_cat=N] "
      "[--ids_per_field=N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_train_out.empty() || FLAGS_test_out.empty()) {
    std::fprintf(stderr, "ctr_datagen: --train_out and --test_out are required (see --help)\n");
    return 2;
  }
  pscluster::SyntheticCriteoOptions options;
  options.num_int = FLAGS_num_int;
  options.num_cat = FLAGS_num_cat;
  options.ids_per_field = FLAGS_ids_per_field;
  options.hash_buckets = FLAGS_hash_buckets;
  options.zipf_exponent = FLAGS_zipf_exponent;
  options.missing_rate = FLAGS_missing_rate;
  options.dense_weight_stddev = FLAGS_dense_weight_stddev;
  options.id_weight_stddev = FLAGS_id_weight_stddev;
  options.bias = FLAGS_bias;
  options.seed = FLAGS_seed;
  auto model = pscluster::PlantedCriteoModel::Create(options);
  if (!model.ok()) return Fail(std::string(model.status().message()));

  for (const bool train : {true, false}) {
    options.num_examples = train ? FLAGS_train_examples : FLAGS_test_examples;
    options.example_stream = train ? 0 : 1;
    const std::string& path = train ? FLAGS_train_out : FLAGS_test_out;
    auto summary = pscluster::WriteSyntheticCriteo(options, path);
    if (!summary.ok()) return Fail(std::string(summary.status().message()));
    std::printf("%s: %s: %lld examples, %.1f%% clicks, planted model AUC %.4f, log loss %.4f\n",
                train ? "train" : "test", path.c_str(),
                static_cast<long long>(summary->num_examples),
                100.0 * static_cast<double>(summary->positives) /
                    std::max<double>(1.0, static_cast<double>(summary->num_examples)),
                summary->planted_auc, summary->planted_log_loss);
    if (train) continue;
    // What a trained model is measured against: the planted model's AUC on the test file as the
    // Criteo reader reads it back.
    pscluster::CriteoOptions read;
    read.num_int = options.num_int;
    read.num_cat = options.num_cat;
    read.hash_buckets = options.hash_buckets;
    auto back = pscluster::ReadCriteo(path, read);
    if (!back.ok()) return Fail(std::string(back.status().message()));
    const double auc = pscluster::Auc(model->PredictAll(*back), back->labels);
    if (back->num_examples != summary->num_examples || !(auc == summary->planted_auc)) {
      return Fail(absl::StrFormat(
          "%s read back gives %d examples and planted AUC %.6f; it was written with %d and %.6f",
          path, back->num_examples, auc, summary->num_examples, summary->planted_auc));
    }
    std::printf("planted_test_auc=%.4f\n", auc);
    std::printf("planted_test_log_loss=%.4f\n", summary->planted_log_loss);
  }
  return 0;
}
