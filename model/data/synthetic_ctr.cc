#include "model/data/synthetic_ctr.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "model/data/seeded_random.h"

namespace pscluster {
namespace {

// Salts that keep the model's random streams apart from each other and from the examples'.
constexpr uint64_t kDenseWeightSalt = 0x64656e7365ULL;  // "dense"
constexpr uint64_t kIdWeightSalt = 0x69647765ULL;       // "idwe"
constexpr uint64_t kRankMapSalt = 0x72616e6bULL;        // "rank"
constexpr uint64_t kExampleSalt = 0x6578616dULL;        // "exam"

absl::Status ValidateOptions(const SyntheticCtrOptions& options) {
  auto bad = [](const char* field, auto value, const char* expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("SyntheticCtrOptions.", field, " is ", value, ", expected ", expected));
  };
  if (options.num_examples < 0) return bad("num_examples", options.num_examples, ">= 0");
  if (options.dense_dim < 0) return bad("dense_dim", options.dense_dim, ">= 0");
  if (options.num_fields < 0) return bad("num_fields", options.num_fields, ">= 0");
  if (options.num_fields > 0) {
    if (options.ids_per_field < 1) {
      return bad("ids_per_field", options.ids_per_field, ">= 1 when num_fields > 0");
    }
    if (options.ids_per_field > std::numeric_limits<int64_t>::max() / options.num_fields) {
      return bad("ids_per_field", options.ids_per_field,
                 "small enough that num_fields * ids_per_field fits in int64");
    }
  }
  if (!(options.zipf_exponent >= 0) || !std::isfinite(options.zipf_exponent)) {
    return bad("zipf_exponent", options.zipf_exponent, "finite and >= 0");
  }
  if (!(options.dense_weight_stddev >= 0) || !std::isfinite(options.dense_weight_stddev)) {
    return bad("dense_weight_stddev", options.dense_weight_stddev, "finite and >= 0");
  }
  if (!(options.id_weight_stddev >= 0) || !std::isfinite(options.id_weight_stddev)) {
    return bad("id_weight_stddev", options.id_weight_stddev, "finite and >= 0");
  }
  if (!std::isfinite(options.bias)) return bad("bias", options.bias, "finite");
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<PlantedCtrModel> PlantedCtrModel::Create(const SyntheticCtrOptions& options) {
  PS_RETURN_IF_ERROR(ValidateOptions(options));
  PlantedCtrModel model;
  model.bias_ = options.bias;
  const uint64_t dense_key = CombineSeeds(options.seed, kDenseWeightSalt);
  model.dense_weights_.resize(static_cast<size_t>(options.dense_dim));
  for (int j = 0; j < options.dense_dim; ++j) {
    model.dense_weights_[j] =
        options.dense_weight_stddev * HashedStandardNormal(CombineSeeds(dense_key, j));
  }
  model.id_weight_stddev_ = options.id_weight_stddev;
  model.id_weight_key_ = CombineSeeds(options.seed, kIdWeightSalt);
  model.num_fields_ = options.num_fields;
  model.ids_per_field_ = options.ids_per_field;
  std::mt19937_64 rng(CombineSeeds(options.seed, kRankMapSalt));
  const uint64_t n = static_cast<uint64_t>(std::max<int64_t>(options.ids_per_field, 1));
  for (int f = 0; f < options.num_fields; ++f) {
    uint64_t multiplier = UniformBelow(&rng, n);
    while (std::gcd(multiplier, n) != 1) multiplier = (multiplier + 1) % n;
    model.rank_multipliers_.push_back(multiplier);
    model.rank_shifts_.push_back(UniformBelow(&rng, n));
  }
  return model;
}

double PlantedCtrModel::IdWeight(int64_t id) const {
  DCHECK(id >= 0 && id < num_fields_ * ids_per_field_) << "id " << id;
  return id_weight_stddev_ *
         HashedStandardNormal(CombineSeeds(id_weight_key_, static_cast<uint64_t>(id)));
}

int64_t PlantedCtrModel::IdOfRank(int field, int64_t rank) const {
  CHECK(field >= 0 && field < num_fields_) << "field " << field;
  CHECK(rank >= 0 && rank < ids_per_field_) << "rank " << rank;
  const unsigned __int128 mixed =
      static_cast<unsigned __int128>(rank) * rank_multipliers_[field] + rank_shifts_[field];
  const int64_t offset = static_cast<int64_t>(mixed % static_cast<uint64_t>(ids_per_field_));
  return field * ids_per_field_ + offset;
}

double Sigmoid(double z) { return 1.0 / (1.0 + std::exp(-z)); }

double PlantedLogit(const Dataset& data, int64_t example, double bias,
                    const std::vector<double>& dense_weights,
                    const std::function<double(int64_t id)>& id_weight) {
  CHECK(example >= 0 && example < data.num_examples) << "example " << example;
  CHECK_EQ(static_cast<size_t>(data.dense_dim), dense_weights.size()) << "dense_dim";
  double logit = bias;
  const float* x = data.dense.data() + example * data.dense_dim;
  for (int j = 0; j < data.dense_dim; ++j) logit += dense_weights[j] * x[j];
  if (data.has_sparse()) {
    for (int64_t k = data.sparse_offsets[example]; k < data.sparse_offsets[example + 1]; ++k) {
      logit += id_weight(data.sparse_ids[k]);
    }
  }
  return logit;
}

double PlantedCtrModel::Logit(const Dataset& data, int64_t example) const {
  return PlantedLogit(data, example, bias_, dense_weights_,
                      [this](int64_t id) { return IdWeight(id); });
}

std::vector<float> PlantedCtrModel::PredictAll(const Dataset& data) const {
  std::vector<float> scores(static_cast<size_t>(data.num_examples));
  for (int64_t i = 0; i < data.num_examples; ++i) {
    scores[i] = static_cast<float>(Sigmoid(Logit(data, i)));
  }
  return scores;
}

absl::StatusOr<Dataset> GenerateSyntheticCtr(const SyntheticCtrOptions& options) {
  PS_ASSIGN_OR_RETURN(const PlantedCtrModel model, PlantedCtrModel::Create(options));
  const int64_t n = options.num_examples;
  const int dim = options.dense_dim;
  const int fields = options.num_fields;
  Dataset data;
  data.num_examples = n;
  data.dense_dim = dim;
  data.num_classes = 0;
  data.dense.resize(static_cast<size_t>(n) * dim);
  data.labels.resize(static_cast<size_t>(n));
  if (fields > 0) {
    data.sparse_offsets.resize(static_cast<size_t>(n) + 1);
    data.sparse_ids.resize(static_cast<size_t>(n) * fields);
  }
  // Each example draws exactly 2 * dim + fields + 1 outputs, so example i is the same whatever
  // num_examples is.
  std::mt19937_64 rng(
      CombineSeeds(CombineSeeds(options.seed, kExampleSalt), options.example_stream));
  for (int64_t i = 0; i < n; ++i) {
    float* x = data.dense.data() + i * dim;
    for (int j = 0; j < dim; ++j) x[j] = static_cast<float>(StandardNormal(&rng));
    if (fields > 0) {
      data.sparse_offsets[i] = i * fields;
      for (int f = 0; f < fields; ++f) {
        const int64_t rank =
            PowerLawRank(UniformDouble(&rng), options.ids_per_field, options.zipf_exponent);
        data.sparse_ids[i * fields + f] = model.IdOfRank(f, rank);
      }
    }
    // The label uses the float features as stored, so the planted model scores exactly the
    // data it generated.
    if (fields > 0) data.sparse_offsets[i + 1] = (i + 1) * fields;
    data.labels[i] = UniformDouble(&rng) < Sigmoid(model.Logit(data, i)) ? 1.0f : 0.0f;
  }
  return data;
}

}  // namespace pscluster
