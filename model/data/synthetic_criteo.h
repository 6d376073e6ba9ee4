#ifndef PSCLUSTER_MODEL_DATA_SYNTHETIC_CRITEO_H_
#define PSCLUSTER_MODEL_DATA_SYNTHETIC_CRITEO_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/data/dataset.h"

namespace pscluster {

// Synthetic click logs in the Criteo layout (model/data/criteo.h), drawn from a planted
// logistic model that is defined on exactly what ReadCriteo yields -- the log1p-transformed
// counts and the hashed categorical ids -- so that the planted model's AUC on a file read back
// is the best a trained model can reach there, and computable.
//
// Example i of a stream:
//   - integer field j: empty with probability missing_rate; otherwise the count
//     floor(exp(mu_j + count_log_stddev * z)) - 1 with z ~ N(0, 1), so counts are >= -1 and
//     heavy-tailed like Criteo's (mu_j, uniform in [0.5, 4], is planted per field);
//   - categorical field f: empty with probability missing_rate; otherwise the value of a
//     popularity rank r drawn from a power law over ids_per_field ranks (PowerLawRank), an
//     8-digit hex string fixed by (seed, f, r) (CategoricalValue);
//   - label: Bernoulli(sigmoid(Logit)), with
//       Logit = bias + sum_j w_j * (x_j - mu_j) + sum over its ids of v[id]
//     where x_j = CriteoDenseValue(count) (0 when empty) and id = CategoricalId(f, value,
//     hash_buckets) -- what ReadCriteo with the same num_int, num_cat and hash_buckets reads.
//     w_j ~ N(0, dense_weight_stddev^2) and v[id] ~ N(0, id_weight_stddev^2) are hashed from
//     the seed (v is a function of the id, so values that hash_buckets merges share it).
//
// Deterministic: the planted model depends only on `seed` and the shape options; the
// examples also on `example_stream`. Each example consumes a fixed number of draws, so a
// smaller file is a prefix of a bigger one.
struct SyntheticCriteoOptions {
  // Lines to write.
  int64_t num_examples = 10000;
  // Integer columns (dense features) and categorical columns.
  int num_int = 13;
  int num_cat = 26;
  // Distinct values per categorical field.
  int64_t ids_per_field = 1000;
  // Skew of value popularity (the power-law exponent; 0 is uniform).
  double zipf_exponent = 1.05;
  // Chance that a field is empty, for integer and categorical fields alike.
  double missing_rate = 0.05;
  // Standard deviation of log(count + 1) around its per-field mean.
  double count_log_stddev = 1.0;
  // Standard deviations of the planted weights: per dense feature, per sparse id.
  double dense_weight_stddev = 0.3;
  double id_weight_stddev = 0.2;
  // Planted bias, in logits; sets the base click rate (-1.5: about 30% with the other
  // defaults).
  double bias = -1.5;
  // As the reader's CriteoOptions::hash_buckets (the planted weights are per id).
  int64_t hash_buckets = 0;
  // Fixes the planted model and, with example_stream, the examples.
  uint64_t seed = 1;
  // Selects an independent stream of examples, e.g. 0 for training and 1 for testing.
  uint64_t example_stream = 0;
};

// The planted ground truth for some options. Immutable: thread-safe.
class PlantedCriteoModel {
 public:
  // INVALID_ARGUMENT naming the field and its value if `options` is out of range: negative
  // counts, ids_per_field < 1 with categorical fields, missing_rate outside [0, 1], negative or
  // non-finite stddevs, exponent or bias, negative hash_buckets or num_cat * hash_buckets
  // overflowing int64.
  static absl::StatusOr<PlantedCriteoModel> Create(const SyntheticCriteoOptions& options);

  // The categorical value of field `field` with popularity rank `rank`, as written.
  // REQUIRES: 0 <= field < num_cat, 0 <= rank < ids_per_field.
  std::string CategoricalValue(int field, int64_t rank) const;
  // The planted weight of a sparse id.
  double IdWeight(int64_t id) const;
  // The planted dense weights w_j and per-field mean log counts mu_j, [num_int] each.
  const std::vector<double>& dense_weights() const { return dense_weights_; }
  const std::vector<double>& log_count_means() const { return log_count_means_; }

  // The planted logit of example `example` of `data`, as ReadCriteo returns it.
  // REQUIRES: data.dense_dim == num_int; 0 <= example < data.num_examples.
  double Logit(const Dataset& data, int64_t example) const;
  // The planted click probability sigmoid(Logit) of every example: the scores of the best
  // possible model, e.g. for Auc(PredictAll(data), data.labels).
  std::vector<float> PredictAll(const Dataset& data) const;

 private:
  PlantedCriteoModel() = default;

  SyntheticCriteoOptions options_;
  std::vector<double> dense_weights_;    // w_j
  std::vector<double> log_count_means_;  // mu_j
  double centered_bias_ = 0;             // bias - sum_j w_j mu_j
  uint64_t id_weight_key_ = 0;
  uint64_t value_key_ = 0;
};

// What WriteSyntheticCriteo wrote, with the planted model's scores of it.
struct SyntheticCriteoSummary {
  int64_t num_examples = 0;
  int64_t positives = 0;
  // AUC and mean log loss of the planted model's probabilities on the written examples, as
  // computed while writing them (equal to those of PredictAll on the file read back).
  double planted_auc = 0;
  double planted_log_loss = 0;
};

// Writes options.num_examples examples in the Criteo layout to `path`, gzip-compressed if the
// name ends in ".gz". Errors: those of PlantedCriteoModel::Create; the errno of a file that
// cannot be written, naming it. Thread-safe.
absl::StatusOr<SyntheticCriteoSummary> WriteSyntheticCriteo(const SyntheticCriteoOptions& options,
                                                            const std::string& path);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_SYNTHETIC_CRITEO_H_
