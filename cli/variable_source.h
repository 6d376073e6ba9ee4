#ifndef PSCLUSTER_CLI_VARIABLE_SOURCE_H_
#define PSCLUSTER_CLI_VARIABLE_SOURCE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cli/live_cluster.h"
#include "proto/model.pb.h"

namespace pscluster {

// Where whole dense variables are read from: a live cluster or a checkpoint on disk.
// Implementations are thread-compatible.
class DenseVariableSource {
 public:
  virtual ~DenseVariableSource() = default;

  // "cluster at HOST:PORT", or the checkpoint's path: for reports and messages.
  virtual std::string Describe() const = 0;

  // The model's variables and tables.
  virtual const v1::ModelSpec& model() const = 0;

  // The whole variable (its partitions joined), row-major, product(shape) floats. NOT_FOUND
  // naming the variable when the model has none; INVALID_ARGUMENT when it names a table.
  virtual absl::StatusOr<std::vector<float>> Read(const std::string& variable) = 0;
};

// The variable's spec, or NOT_FOUND / INVALID_ARGUMENT (a table) naming it, listing what the
// model has.
absl::StatusOr<const v1::VariableSpec*> FindDenseVariable(const v1::ModelSpec& model,
                                                          const std::string& variable);

// Reads through a live cluster's ParameterClient (PullDense from every ps task holding a
// partition; nothing is changed).
class LiveVariableSource : public DenseVariableSource {
 public:
  // `cluster` is not owned and must outlive this object.
  explicit LiveVariableSource(LiveCluster* cluster) : cluster_(cluster) {}

  std::string Describe() const override;
  const v1::ModelSpec& model() const override { return cluster_->model.model(); }
  absl::StatusOr<std::vector<float>> Read(const std::string& variable) override;

 private:
  LiveCluster* const cluster_;  // Not owned.
};

}  // namespace pscluster

#endif  // PSCLUSTER_CLI_VARIABLE_SOURCE_H_
