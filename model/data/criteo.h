#ifndef PSCLUSTER_MODEL_DATA_CRITEO_H_
#define PSCLUSTER_MODEL_DATA_CRITEO_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/data/dataset.h"

namespace pscluster {

// A reader for the Criteo display-advertising click logs (the Kaggle challenge's train.txt,
// the Terabyte logs' day_N), plain or gzip-compressed (decided by the first two bytes, as
// model/data/input_file.h), one example per line:
//
//   <label> \t I1 \t ... \t I13 \t C1 \t ... \t C26
//
// 1 + num_int + num_cat tab-separated columns (40 with the Criteo counts):
//   - label: 0 or 1 (no other spelling);
//   - I1..I<num_int>: integer features (counts), each a decimal integer, possibly negative,
//     or empty. Dense feature j is log(1 + max(I_j, 0)) -- the log1p transform of the DLRM and
//     DeepFM reference pipelines, which tames counts that span many orders of magnitude --
//     and 0 for an empty field (CriteoDenseValue);
//   - C1..C<num_cat>: categorical features, any string (hex hashes of 8 characters in the real
//     logs), or empty. Each non-empty one of field f (0-based: C1 is field 0) becomes the
//     sparse id CategoricalId(f, string, hash_buckets) (model/data/feature_hash.h); an empty
//     one gives no id.
// Windows line ends are accepted; empty lines are skipped.
//
// The result has dense_dim = num_int, num_classes = 0, labels 0/1, and (when num_cat > 0)
// sparse features: the ids of each example in field order, at most num_cat of them.
struct CriteoOptions {
  // Integer columns after the label.
  int num_int = 13;
  // Categorical columns after the integer ones.
  int num_cat = 26;
  // 0: sparse ids are 62-bit hashes. > 0: field f's ids are in [f * hash_buckets,
  // (f + 1) * hash_buckets) (see CategoricalId).
  int64_t hash_buckets = 0;
  // Read only the first `max_examples` examples (fewer if the file holds fewer); 0 reads all.
  int64_t max_examples = 0;
};

// Reads the Criteo-layout file at `path`.
//
// Errors:
//   NOT_FOUND / PERMISSION_DENIED etc. (from errno) if the file cannot be opened.
//   INVALID_ARGUMENT for negative options or num_cat * hash_buckets overflowing int64, and for
//     a malformed line, naming the file, the 1-based line number, what was wrong and what was
//     expected, e.g. "/d/train.txt:7: expected 40 tab-separated columns (label, 13 integer,
//     26 categorical), got 39", "/d/train.txt:7: bad label 'x': expected 0 or 1",
//     "/d/train.txt:7: column 3 (I2): bad integer '1.5': expected a decimal integer or
//     nothing"; also a corrupt or cut-short gzip stream.
//
// Thread-safe (shares no state).
absl::StatusOr<Dataset> ReadCriteo(const std::string& path,
                                   const CriteoOptions& options = CriteoOptions());

// The dense feature of integer value `value`: log(1 + max(value, 0)), as a float. An empty
// field reads as 0, the same as a value of 0 or below.
float CriteoDenseValue(int64_t value);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_CRITEO_H_
