#include "model/data/synthetic_criteo.h"

#include <zlib.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "model/data/criteo.h"
#include "model/data/feature_hash.h"
#include "model/data/metrics.h"
#include "model/data/seeded_random.h"
#include "model/data/synthetic_ctr.h"

namespace pscluster {
namespace {

// Salts that keep the model's random streams apart from each other and from the examples'.
constexpr uint64_t kDenseWeightSalt = 0x6372647773ULL;  // "crdws"
constexpr uint64_t kCountMeanSalt = 0x6372636dULL;      // "crcm"
constexpr uint64_t kIdWeightSalt = 0x63726977ULL;       // "criw"
constexpr uint64_t kValueSalt = 0x63727661ULL;          // "crva"
constexpr uint64_t kExampleSalt = 0x63726578ULL;        // "crex"

constexpr size_t kFlushBytes = 1 << 20;

absl::Status ValidateOptions(const SyntheticCriteoOptions& options) {
  auto bad = [](const char* field, auto value, const char* expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("SyntheticCriteoOptions.", field, " is ", value, ", expected ", expected));
  };
  auto finite_non_negative = [](double v) { return v >= 0 && std::isfinite(v); };
  if (options.num_examples < 0) return bad("num_examples", options.num_examples, ">= 0");
  if (options.num_int < 0) return bad("num_int", options.num_int, ">= 0");
  if (options.num_cat < 0) return bad("num_cat", options.num_cat, ">= 0");
  if (options.num_cat > 0 && options.ids_per_field < 1) {
    return bad("ids_per_field", options.ids_per_field, ">= 1 when num_cat > 0");
  }
  if (!finite_non_negative(options.zipf_exponent)) {
    return bad("zipf_exponent", options.zipf_exponent, "finite and >= 0");
  }
  if (!(options.missing_rate >= 0 && options.missing_rate <= 1)) {
    return bad("missing_rate", options.missing_rate, "in [0, 1]");
  }
  if (!finite_non_negative(options.count_log_stddev)) {
    return bad("count_log_stddev", options.count_log_stddev, "finite and >= 0");
  }
  if (!finite_non_negative(options.dense_weight_stddev)) {
    return bad("dense_weight_stddev", options.dense_weight_stddev, "finite and >= 0");
  }
  if (!finite_non_negative(options.id_weight_stddev)) {
    return bad("id_weight_stddev", options.id_weight_stddev, "finite and >= 0");
  }
  if (!std::isfinite(options.bias)) return bad("bias", options.bias, "finite");
  if (options.hash_buckets < 0) return bad("hash_buckets", options.hash_buckets, ">= 0");
  if (options.hash_buckets > 0 && options.num_cat > 0 &&
      options.hash_buckets > std::numeric_limits<int64_t>::max() / options.num_cat) {
    return bad("hash_buckets", options.hash_buckets,
               "small enough that num_cat * hash_buckets fits in int64");
  }
  return absl::OkStatus();
}

// A text file written front to back, gzip-compressed or plain. Thread-compatible.
class TextWriter {
 public:
  static absl::StatusOr<std::unique_ptr<TextWriter>> Open(const std::string& path) {
    std::unique_ptr<TextWriter> writer(new TextWriter(path));
    if (absl::EndsWith(path, ".gz")) {
      writer->gz_ = gzopen(path.c_str(), "wb1");
      if (writer->gz_ == nullptr) {
        return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
      }
    } else {
      writer->file_ = std::fopen(path.c_str(), "wb");
      if (writer->file_ == nullptr) {
        return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path));
      }
    }
    return writer;
  }

  ~TextWriter() {
    if (file_ != nullptr) std::fclose(file_);
    if (gz_ != nullptr) gzclose(gz_);
  }

  // Appends to the pending text, written out in large pieces.
  std::string* pending() { return &pending_; }

  absl::Status FlushIfLarge() {
    return pending_.size() >= kFlushBytes ? Flush() : absl::OkStatus();
  }

  // Writes everything out and closes the file.
  absl::Status Close() {
    PS_RETURN_IF_ERROR(Flush());
    if (file_ != nullptr) {
      const int closed = std::fclose(file_);
      file_ = nullptr;
      if (closed != 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path_));
    }
    if (gz_ != nullptr) {
      const int closed = gzclose(gz_);
      gz_ = nullptr;
      if (closed != Z_OK) return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path_));
    }
    return absl::OkStatus();
  }

 private:
  explicit TextWriter(std::string path) : path_(std::move(path)) {}

  absl::Status Flush() {
    if (pending_.empty()) return absl::OkStatus();
    bool ok;
    if (file_ != nullptr) {
      ok = std::fwrite(pending_.data(), 1, pending_.size(), file_) == pending_.size();
    } else {
      ok = gzwrite(gz_, pending_.data(), static_cast<unsigned>(pending_.size())) ==
           static_cast<int>(pending_.size());
    }
    if (!ok) return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path_));
    pending_.clear();
    return absl::OkStatus();
  }

  const std::string path_;
  std::FILE* file_ = nullptr;  // Owned; set for plain files.
  gzFile gz_ = nullptr;        // Owned; set for gzip files.
  std::string pending_;
};

}  // namespace

absl::StatusOr<PlantedCriteoModel> PlantedCriteoModel::Create(
    const SyntheticCriteoOptions& options) {
  PS_RETURN_IF_ERROR(ValidateOptions(options));
  PlantedCriteoModel model;
  model.options_ = options;
  const uint64_t dense_key = CombineSeeds(options.seed, kDenseWeightSalt);
  const uint64_t mean_key = CombineSeeds(options.seed, kCountMeanSalt);
  model.centered_bias_ = options.bias;
  for (int j = 0; j < options.num_int; ++j) {
    const double w = options.dense_weight_stddev * HashedStandardNormal(CombineSeeds(dense_key, j));
    const double mu =
        0.5 + 3.5 * static_cast<double>(SplitMix64(CombineSeeds(mean_key, j)) >> 11) * 0x1.0p-53;
    model.dense_weights_.push_back(w);
    model.log_count_means_.push_back(mu);
    model.centered_bias_ -= w * mu;
  }
  model.id_weight_key_ = CombineSeeds(options.seed, kIdWeightSalt);
  model.value_key_ = CombineSeeds(options.seed, kValueSalt);
  return model;
}

std::string PlantedCriteoModel::CategoricalValue(int field, int64_t rank) const {
  DCHECK(field >= 0 && field < options_.num_cat) << "field " << field;
  DCHECK(rank >= 0 && rank < options_.ids_per_field) << "rank " << rank;
  const uint64_t bits =
      SplitMix64(CombineSeeds(CombineSeeds(value_key_, static_cast<uint64_t>(field)), rank));
  return absl::StrFormat("%08x", static_cast<uint32_t>(bits >> 32));
}

double PlantedCriteoModel::IdWeight(int64_t id) const {
  return options_.id_weight_stddev *
         HashedStandardNormal(CombineSeeds(id_weight_key_, static_cast<uint64_t>(id)));
}

double PlantedCriteoModel::Logit(const Dataset& data, int64_t example) const {
  return PlantedLogit(data, example, centered_bias_, dense_weights_,
                      [this](int64_t id) { return IdWeight(id); });
}

std::vector<float> PlantedCriteoModel::PredictAll(const Dataset& data) const {
  std::vector<float> scores(static_cast<size_t>(data.num_examples));
  for (int64_t i = 0; i < data.num_examples; ++i) {
    scores[i] = static_cast<float>(Sigmoid(Logit(data, i)));
  }
  return scores;
}

absl::StatusOr<SyntheticCriteoSummary> WriteSyntheticCriteo(const SyntheticCriteoOptions& options,
                                                            const std::string& path) {
  PS_ASSIGN_OR_RETURN(const PlantedCriteoModel model, PlantedCriteoModel::Create(options));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<TextWriter> writer, TextWriter::Open(path));
  std::mt19937_64 rng(
      CombineSeeds(CombineSeeds(options.seed, kExampleSalt), options.example_stream));

  // One example at a time, as ReadCriteo will return it, to score it with the planted model.
  Dataset row;
  row.num_examples = 1;
  row.dense_dim = options.num_int;
  row.dense.resize(static_cast<size_t>(options.num_int));
  if (options.num_cat > 0) row.sparse_offsets = {0, 0};

  SyntheticCriteoSummary summary;
  std::vector<float> scores;
  std::vector<float> labels;
  scores.reserve(static_cast<size_t>(options.num_examples));
  labels.reserve(static_cast<size_t>(options.num_examples));
  double log_loss = 0;
  std::string* out = writer->pending();
  // Every example consumes exactly 3 * num_int + 2 * num_cat + 1 draws (StandardNormal takes
  // two), whatever is missing, so example i does not depend on num_examples.
  for (int64_t i = 0; i < options.num_examples; ++i) {
    std::string line;
    for (int j = 0; j < options.num_int; ++j) {
      const bool missing = UniformDouble(&rng) < options.missing_rate;
      const double z = StandardNormal(&rng);
      int64_t count = 0;
      if (!missing) {
        const double log_count = model.log_count_means()[j] + options.count_log_stddev * z;
        count = static_cast<int64_t>(std::floor(std::exp(std::min(log_count, 40.0)))) - 1;
        absl::StrAppend(&line, "\t", count);
      } else {
        line += '\t';
      }
      row.dense[j] = CriteoDenseValue(count);
    }
    row.sparse_ids.clear();
    for (int f = 0; f < options.num_cat; ++f) {
      const bool missing = UniformDouble(&rng) < options.missing_rate;
      const int64_t rank =
          PowerLawRank(UniformDouble(&rng), options.ids_per_field, options.zipf_exponent);
      line += '\t';
      if (missing) continue;
      const std::string value = model.CategoricalValue(f, rank);
      line += value;
      row.sparse_ids.push_back(CategoricalId(f, value, options.hash_buckets));
    }
    if (options.num_cat > 0) row.sparse_offsets[1] = static_cast<int64_t>(row.sparse_ids.size());
    const double p = Sigmoid(model.Logit(row, 0));
    const bool click = UniformDouble(&rng) < p;
    absl::StrAppend(out, click ? "1" : "0", line, "\n");
    PS_RETURN_IF_ERROR(writer->FlushIfLarge());
    // As PredictAll would score the example read back: the probability as a float.
    const float score = static_cast<float>(p);
    scores.push_back(score);
    labels.push_back(click ? 1.0f : 0.0f);
    summary.positives += click ? 1 : 0;
    log_loss -= std::log(std::max(1e-12, click ? p : 1 - p));
  }
  PS_RETURN_IF_ERROR(writer->Close());
  summary.num_examples = options.num_examples;
  summary.planted_auc = Auc(scores, labels);
  summary.planted_log_loss =
      options.num_examples > 0 ? log_loss / static_cast<double>(options.num_examples) : 0;
  return summary;
}

}  // namespace pscluster
