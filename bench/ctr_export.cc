// ctr_export: reads a Criteo-layout file with the same reader and options a worker uses
// (model/data/criteo.h) and writes what it produced as raw little-endian arrays, so that a
// baseline outside this repository (bench/torch_ctr.py) trains on exactly the features our
// workers see: the same dense values and the same sparse ids, not a re-implementation of the
// parsing and hashing.
//
//   ctr_export --in=FILE --out_prefix=P [--hash_buckets=N] [--num_int=13] [--num_cat=26]
//
// writes
//   P.dense    float32 [examples x num_int]  log(1 + max(count, 0)), 0 when empty
//   P.labels   float32 [examples]            0 or 1
//   P.offsets  int64   [examples + 1]        example i's ids are ids[offsets[i], offsets[i+1])
//   P.ids      int64   [offsets[examples]]   the sparse ids, in field order
// and prints one line: `EXPORT examples=N dense_dim=D ids=M distinct_ids=U`.
#include <cstdio>
#include <string>
#include <unordered_set>
#include <vector>

#include "gflags/gflags.h"
#include "model/data/criteo.h"

DEFINE_string(in, "", "The Criteo-layout file to read (plain or gzip).");
DEFINE_string(out_prefix, "", "Where to write: <out_prefix>.dense, .labels, .offsets, .ids.");
DEFINE_int64(hash_buckets, 0, "The reader's hash_buckets (the chief's --hash_buckets).");
DEFINE_int32(num_int, 13, "Integer columns (the chief's --criteo_int_columns).");
DEFINE_int32(num_cat, 26, "Categorical columns (the chief's --criteo_cat_columns).");

namespace {

template <typename T>
bool WriteArray(const std::string& path, const std::vector<T>& values) {
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) {
    std::perror(path.c_str());
    return false;
  }
  const bool ok = std::fwrite(values.data(), sizeof(T), values.size(), f) == values.size();
  if (std::fclose(f) != 0 || !ok) {
    std::fprintf(stderr, "ctr_export: writing %s failed\n", path.c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  gflags::SetUsageMessage(
      "writes a Criteo-layout file's features, as the worker's reader sees them, as raw "
      "arrays.\nusage: ctr_export --in=FILE --out_prefix=P [--hash_buckets=N]");
  gflags::ParseCommandLineFlags(&argc, &argv, true);
  if (FLAGS_in.empty() || FLAGS_out_prefix.empty()) {
    std::fprintf(stderr, "ctr_export: --in and --out_prefix are required (see --help)\n");
    return 2;
  }
  pscluster::CriteoOptions options;
  options.num_int = FLAGS_num_int;
  options.num_cat = FLAGS_num_cat;
  options.hash_buckets = FLAGS_hash_buckets;
  absl::StatusOr<pscluster::Dataset> data = pscluster::ReadCriteo(FLAGS_in, options);
  if (!data.ok()) {
    std::fprintf(stderr, "ctr_export: %s\n", data.status().ToString().c_str());
    return 1;
  }
  std::vector<int64_t> offsets = data->sparse_offsets;
  if (offsets.empty()) offsets.assign(data->num_examples + 1, 0);
  const std::string& p = FLAGS_out_prefix;
  if (!WriteArray(p + ".dense", data->dense) || !WriteArray(p + ".labels", data->labels) ||
      !WriteArray(p + ".offsets", offsets) || !WriteArray(p + ".ids", data->sparse_ids)) {
    return 1;
  }
  const std::unordered_set<int64_t> distinct(data->sparse_ids.begin(), data->sparse_ids.end());
  std::printf("EXPORT examples=%lld dense_dim=%d ids=%zu distinct_ids=%zu\n",
              static_cast<long long>(data->num_examples), data->dense_dim, data->sparse_ids.size(),
              distinct.size());
  return 0;
}
