#ifndef PSCLUSTER_CLI_CHECKPOINT_SOURCE_H_
#define PSCLUSTER_CLI_CHECKPOINT_SOURCE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/variable_source.h"
#include "proto/coordinator_service.pb.h"
#include "storage/checkpoint.h"

namespace pscluster {

// Resolves a checkpoint named on the command line: a committed checkpoint (a directory with
// MANIFEST.json, e.g. DIR/ckpt-0000000120) is taken as is; a directory of checkpoints gives
// its newest committed one. NOT_FOUND naming the path when it is neither; DATA_LOSS when its
// manifest does not parse.
absl::StatusOr<std::string> ResolveCheckpointPath(const std::string& path);

// Reads dense variables from a committed checkpoint, offline: each partition's values (the
// first part of its record; the optimizer slots follow) are checked against the manifest's
// checksum and put at their rows. Thread-compatible.
class CheckpointVariableSource : public DenseVariableSource {
 public:
  // `path` as for ResolveCheckpointPath.
  static absl::StatusOr<std::unique_ptr<CheckpointVariableSource>> Open(const std::string& path);

  std::string Describe() const override { return path_; }
  const v1::ModelSpec& model() const override { return manifest_.model(); }
  // Also DATA_LOSS naming the checkpoint's file and shard when a partition is missing, short
  // or fails its checksum.
  absl::StatusOr<std::vector<float>> Read(const std::string& variable) override;

  const std::string& path() const { return path_; }
  const v1::CheckpointManifest& manifest() const { return manifest_; }

 private:
  CheckpointVariableSource(std::string path, v1::CheckpointManifest manifest)
      : path_(std::move(path)), manifest_(std::move(manifest)) {}
  absl::StatusOr<CheckpointReader*> ReaderFor(const std::string& file);

  const std::string path_;
  const v1::CheckpointManifest manifest_;
  std::map<std::string, std::unique_ptr<CheckpointReader>> readers_;  // by SavedShard.file
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_CHECKPOINT_SOURCE_H_
