#include "model/data/dataset.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace pscluster {

absl::Status ValidateDataset(const Dataset& data) {
  if (data.num_examples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_examples is negative: ", data.num_examples));
  }
  if (data.dense_dim < 0) {
    return absl::InvalidArgumentError(absl::StrCat("dense_dim is negative: ", data.dense_dim));
  }
  if (data.num_classes < 0 || data.num_classes == 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_classes must be 0 (binary) or at least 2, got ", data.num_classes));
  }
  if (data.image.has_value()) {
    const ImageLayout& image = *data.image;
    if (image.height < 1 || image.width < 1 || image.channels < 1 ||
        int64_t{image.height} * image.width * image.channels != data.dense_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "image layout ", image.height, "x", image.width, "x", image.channels,
          " (height x width x channels) does not hold dense_dim = ", data.dense_dim, " features"));
    }
  }
  const uint64_t n = static_cast<uint64_t>(data.num_examples);
  if (data.dense.size() != n * static_cast<uint64_t>(data.dense_dim)) {
    return absl::InvalidArgumentError(absl::StrCat("dense has ", data.dense.size(),
                                                   " values, expected num_examples (", n,
                                                   ") x dense_dim (", data.dense_dim, ")"));
  }
  if (data.labels.size() != n) {
    return absl::InvalidArgumentError(absl::StrCat("labels has ", data.labels.size(),
                                                   " values, expected num_examples (", n, ")"));
  }
  if (data.sparse_offsets.empty()) {
    if (!data.sparse_ids.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sparse_offsets is empty but sparse_ids has ",
                                                     data.sparse_ids.size(), " ids"));
    }
  } else {
    if (data.sparse_offsets.size() != n + 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse_offsets has ", data.sparse_offsets.size(),
                       " entries, expected num_examples + 1 (", n + 1, ")"));
    }
    if (data.sparse_offsets.front() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse_offsets[0] is ", data.sparse_offsets.front(), ", expected 0"));
    }
    for (uint64_t i = 1; i <= n; ++i) {
      if (data.sparse_offsets[i] < data.sparse_offsets[i - 1]) {
        return absl::InvalidArgumentError(absl::StrCat("sparse_offsets decreases at example ",
                                                       i - 1, ": ", data.sparse_offsets[i - 1],
                                                       " then ", data.sparse_offsets[i]));
      }
    }
    if (static_cast<uint64_t>(data.sparse_offsets.back()) != data.sparse_ids.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse_offsets ends at ", data.sparse_offsets.back(),
                       " but sparse_ids has ", data.sparse_ids.size(), " ids"));
    }
  }
  for (uint64_t i = 0; i < n; ++i) {
    const float label = data.labels[i];
    const bool ok = data.num_classes == 0
                        ? (label == 0.0f || label == 1.0f)
                        : (label >= 0 && label < data.num_classes && std::floor(label) == label);
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "label of example ", i, " is ", label,
          data.num_classes == 0
              ? ", expected 0 or 1"
              : absl::StrCat(", expected a class index in [0, ", data.num_classes, ")")));
    }
  }
  return absl::OkStatus();
}

void SelectExamples(const Dataset& src, absl::Span<const int64_t> positions, Dataset* out) {
  CHECK(out != nullptr);
  CHECK(out != &src) << "SelectExamples cannot select in place";
  const size_t dim = static_cast<size_t>(src.dense_dim);
  out->num_examples = static_cast<int64_t>(positions.size());
  out->dense_dim = src.dense_dim;
  out->num_classes = src.num_classes;
  out->image = src.image;
  out->dense.resize(positions.size() * dim);
  out->labels.resize(positions.size());
  out->sparse_offsets.clear();
  out->sparse_ids.clear();
  if (src.has_sparse()) {
    out->sparse_offsets.reserve(positions.size() + 1);
    out->sparse_offsets.push_back(0);
  }
  for (size_t i = 0; i < positions.size(); ++i) {
    const int64_t p = positions[i];
    CHECK(p >= 0 && p < src.num_examples)
        << "position " << p << " out of range [0, " << src.num_examples << ")";
    std::copy_n(src.dense.begin() + p * dim, dim, out->dense.begin() + i * dim);
    out->labels[i] = src.labels[p];
    if (src.has_sparse()) {
      out->sparse_ids.insert(out->sparse_ids.end(), src.sparse_ids.begin() + src.sparse_offsets[p],
                             src.sparse_ids.begin() + src.sparse_offsets[p + 1]);
      out->sparse_offsets.push_back(static_cast<int64_t>(out->sparse_ids.size()));
    }
  }
}

}  // namespace pscluster
