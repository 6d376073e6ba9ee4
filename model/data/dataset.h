#ifndef PSCLUSTER_MODEL_DATA_DATASET_H_
#define PSCLUSTER_MODEL_DATA_DATASET_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace pscluster {

// The in-memory example set the trainer consumes.
//
// Dense features (float, row-major [num_examples x dense_dim]), optional sparse feature ids per
// example (CSR: sparse_offsets [num_examples+1] into sparse_ids (int64)), and a label per example
// (float: class index for classification, 0/1 for CTR).
//
// The layout of an image dataset's dense features: height x width x channels, row-major with
// channels fastest (NHWC, as ModelConfig.input_shape).
struct ImageLayout {
  int height = 0;
  int width = 0;
  int channels = 0;

  bool operator==(const ImageLayout& other) const {
    return height == other.height && width == other.width && channels == other.channels;
  }
  bool operator!=(const ImageLayout& other) const { return !(*this == other); }
};

// A plain value type: thread-compatible (concurrent const access is safe).
struct Dataset {
  int64_t num_examples = 0;
  int dense_dim = 0;
  int num_classes = 0;  // 0 for binary (sigmoid) tasks
  std::vector<float> dense;
  std::vector<int64_t> sparse_offsets;  // empty when no sparse features
  std::vector<int64_t> sparse_ids;
  std::vector<float> labels;
  // Set by the image readers (idx, CIFAR-10): how dense_dim's features lay out as an image.
  std::optional<ImageLayout> image;

  bool has_sparse() const { return !sparse_offsets.empty(); }
};

// Returns OK if the fields of `data` agree with each other: sizes match num_examples and
// dense_dim, sparse_offsets start at 0, never decrease and end at sparse_ids.size(), every
// label is a class index in [0, num_classes) (or 0/1 when num_classes == 0), and an image
// layout, if set, holds dense_dim features. Otherwise returns
// INVALID_ARGUMENT naming the first field that is wrong and its value.
absl::Status ValidateDataset(const Dataset& data);

// Overwrites *out with the examples of `src` at `positions`, in that order (a position may
// repeat). Reuses the capacity of *out's vectors, so calling it per batch does not allocate
// once the batches have reached their largest size. `out` keeps src's dense_dim, num_classes,
// image layout and whether it has sparse features.
// REQUIRES: every position is in [0, src.num_examples); out != &src; src is valid.
void SelectExamples(const Dataset& src, absl::Span<const int64_t> positions, Dataset* out);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_DATASET_H_
