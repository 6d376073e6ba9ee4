#ifndef PSCLUSTER_MODEL_DATA_SYNTHETIC_CTR_H_
#define PSCLUSTER_MODEL_DATA_SYNTHETIC_CTR_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "model/data/dataset.h"

namespace pscluster {

// A synthetic click-through-rate data set drawn from a planted logistic model, so that a
// trained model's AUC can be compared with the best one possible (the planted model's own).
//
// Example i has dense features x ~ N(0, 1)^dense_dim and one sparse id per field; the id of
// field f is drawn with Zipf-like skew (popularity rank r has probability roughly proportional
// to (r + 1)^-zipf_exponent), so a few ids per field are hot and most are rare. Its label is
// Bernoulli(sigmoid(w . x + sum over its ids of v[id] + bias)), where the planted weights w
// (dense) and v (per id) are normal draws fixed by `seed`.
//
// Everything is deterministic: the planted model depends only on `seed` and the shape
// options, the examples also on `example_stream` -- the same on every run and platform.
// Example i does not depend on num_examples, so a smaller data set is a prefix of a bigger one.
struct SyntheticCtrOptions {
  // Examples to generate.
  int64_t num_examples = 10000;
  // Dense features per example.
  int dense_dim = 13;
  // Categorical fields, one id each per example; 0 generates no sparse features.
  int num_fields = 8;
  // Distinct ids per field; field f owns the ids [f * ids_per_field, (f + 1) * ids_per_field).
  int64_t ids_per_field = 10000;
  // Skew of id popularity (the Zipf exponent s; 0 is uniform, ~1 is web-like).
  double zipf_exponent = 1.05;
  // Standard deviation of each planted dense weight.
  double dense_weight_stddev = 0.3;
  // Standard deviation of each planted per-id weight.
  double id_weight_stddev = 0.5;
  // Planted bias, in logits; sets the base click rate (-1.0 gives about 30%).
  double bias = -1.0;
  // Fixes the planted model (weights and which ids are hot) and, with example_stream, the
  // examples.
  uint64_t seed = 1;
  // Selects an independent stream of examples from the same planted model, e.g. 0 for
  // training and 1 for a held-out test set.
  uint64_t example_stream = 0;
};

// What both planted models (this one and synthetic_criteo.h's) compute: the logit
// bias + w . x + the sum of id_weight(id) over the example's sparse ids, and the logistic
// function of it.
// REQUIRES: example is in [0, data.num_examples); dense_weights has data.dense_dim weights.
double PlantedLogit(const Dataset& data, int64_t example, double bias,
                    const std::vector<double>& dense_weights,
                    const std::function<double(int64_t id)>& id_weight);
double Sigmoid(double z);

// The planted ground truth of GenerateSyntheticCtr for some options. Immutable: thread-safe.
class PlantedCtrModel {
 public:
  // INVALID_ARGUMENT naming the field and its value if `options` is out of range: negative
  // counts, ids_per_field < 1 with fields, num_fields * ids_per_field overflowing int64,
  // negative or non-finite zipf_exponent / stddevs / bias.
  static absl::StatusOr<PlantedCtrModel> Create(const SyntheticCtrOptions& options);

  double bias() const { return bias_; }
  // The planted dense weights w, [dense_dim].
  const std::vector<double>& dense_weights() const { return dense_weights_; }
  // The planted weight v[id] of a sparse id (computed, not stored: O(1) memory in the id space).
  // REQUIRES: 0 <= id < num_fields * ids_per_field.
  double IdWeight(int64_t id) const;
  // The id of field `field` whose popularity rank is `rank` (0 is the hottest). The ranks are
  // scattered over the field's id range rather than in id order.
  // REQUIRES: 0 <= field < num_fields, 0 <= rank < ids_per_field.
  int64_t IdOfRank(int field, int64_t rank) const;

  // The planted logit of example `example` of `data`.
  // REQUIRES: data was generated with the same shape options (dense_dim, num_fields,
  // ids_per_field); 0 <= example < data.num_examples.
  double Logit(const Dataset& data, int64_t example) const;
  // The planted click probability sigmoid(Logit) of every example of `data`: the scores of the
  // best possible model, e.g. for Auc(PredictAll(data), data.labels).
  std::vector<float> PredictAll(const Dataset& data) const;

 private:
  PlantedCtrModel() = default;

  double bias_ = 0;
  std::vector<double> dense_weights_;
  double id_weight_stddev_ = 0;
  uint64_t id_weight_key_ = 0;
  int num_fields_ = 0;
  int64_t ids_per_field_ = 0;
  // Per field, rank r maps to id offset (r * multiplier + shift) mod ids_per_field, a bijection
  // because the multiplier is coprime with ids_per_field.
  std::vector<uint64_t> rank_multipliers_;
  std::vector<uint64_t> rank_shifts_;
};

// Generates options.num_examples examples (see above): dense_dim dense features, num_classes 0,
// labels 0/1, and num_fields sparse ids per example in field order (no sparse features when
// num_fields is 0). Errors: those of PlantedCtrModel::Create. Thread-safe.
absl::StatusOr<Dataset> GenerateSyntheticCtr(const SyntheticCtrOptions& options);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_SYNTHETIC_CTR_H_
