#include "cli/checkpoint_source.h"

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "sharding/partitioner.h"

namespace pscluster {

absl::StatusOr<std::string> ResolveCheckpointPath(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) {
    return absl::NotFoundError(absl::StrCat("no checkpoint at ", path, ": not a directory"));
  }
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifest(path);
  if (manifest.ok()) return path;
  if (manifest.status().code() != absl::StatusCode::kNotFound) return manifest.status();
  absl::StatusOr<std::vector<std::string>> list = ListCheckpoints(path);
  if (!list.ok()) {
    return absl::NotFoundError(absl::StrCat(path,
                                            " is neither a committed checkpoint nor a "
                                            "directory of checkpoints: ",
                                            list.status().message()));
  }
  if (list->empty()) {
    return absl::NotFoundError(absl::StrCat("no committed checkpoint in ", path));
  }
  return list->front();
}

absl::StatusOr<std::unique_ptr<CheckpointVariableSource>> CheckpointVariableSource::Open(
    const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::string resolved, ResolveCheckpointPath(path));
  PS_ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, ReadManifest(resolved));
  return std::unique_ptr<CheckpointVariableSource>(
      new CheckpointVariableSource(std::move(resolved), std::move(manifest)));
}

absl::StatusOr<CheckpointReader*> CheckpointVariableSource::ReaderFor(const std::string& file) {
  auto it = readers_.find(file);
  if (it != readers_.end()) return it->second.get();
  PS_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader,
                      CheckpointReader::Open(absl::StrCat(path_, "/", file)));
  CheckpointReader* out = reader.get();
  readers_.emplace(file, std::move(reader));
  return out;
}

absl::StatusOr<std::vector<float>> CheckpointVariableSource::Read(const std::string& variable) {
  PS_ASSIGN_OR_RETURN(const v1::VariableSpec* spec, FindDenseVariable(model(), variable));
  int64_t rows = 1, row_elements = 1;
  for (int i = 0; i < spec->shape().dims_size(); ++i) {
    (i == 0 ? rows : row_elements) *= spec->shape().dims(i);
  }
  std::vector<float> out(static_cast<size_t>(rows * row_elements));
  std::vector<std::pair<int64_t, int64_t>> covered;
  for (const v1::SavedShard& saved : manifest_.shards()) {
    if (saved.is_table() || saved.name() != variable) continue;
    const v1::DensePartition& p = saved.dense().partition();
    const int64_t begin = spec->shape().dims_size() == 0 ? 0 : p.row_begin();
    const int64_t end = spec->shape().dims_size() == 0 ? 1 : p.row_end();
    if (begin < 0 || end > rows || begin > end) {
      return absl::DataLossError(absl::StrCat("checkpoint ", path_, ": ", variable, "/",
                                              saved.partition(), " in ", saved.file(),
                                              " claims rows [", begin, ", ", end, ") of ", rows));
    }
    PS_ASSIGN_OR_RETURN(CheckpointReader * reader, ReaderFor(saved.file()));
    PS_ASSIGN_OR_RETURN(DenseRecord record, reader->ReadDense(saved));
    const int64_t n = (end - begin) * row_elements;
    if (static_cast<int64_t>(record.values_and_slots.size()) < n) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", path_, ": ", variable, "/", saved.partition(), " in ", saved.file(),
          " holds ", record.values_and_slots.size(), " floats, its rows need ", n));
    }
    CopyOverlappingRows(record.values_and_slots.data(), RowRange{begin, end}, out.data(),
                        RowRange{0, rows}, row_elements, /*planes=*/1);
    covered.emplace_back(begin, end);
  }
  std::sort(covered.begin(), covered.end());
  int64_t next = 0;
  for (const auto& [begin, end] : covered) {
    if (begin > next) break;
    next = std::max(next, end);
  }
  if (next < rows || (rows > 0 && covered.empty())) {
    return absl::DataLossError(absl::StrCat("checkpoint ", path_, " lacks rows [", next, ", ", rows,
                                            ") of variable ", variable));
  }
  return out;
}

}  // namespace pscluster
