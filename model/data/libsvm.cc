#include "model/data/libsvm.h"

#include <cerrno>
#include <cmath>
#include <fstream>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace pscluster {
namespace {

// Parses one label token; -1 maps to 0.
bool ParseLabel(absl::string_view token, float* label) {
  double value;
  if (!absl::SimpleAtod(token, &value)) return false;
  if (value == 1.0) {
    *label = 1.0f;
  } else if (value == 0.0 || value == -1.0) {
    *label = 0.0f;
  } else {
    return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<Dataset> ReadLibsvm(const std::string& path, int dense_dim) {
  if (dense_dim < 0) {
    return absl::InvalidArgumentError(absl::StrCat("dense_dim must be >= 0, got ", dense_dim));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
  }

  Dataset data;
  data.dense_dim = dense_dim;
  data.num_classes = 0;
  // Built for every line; kept only if some line has a sparse id.
  std::vector<int64_t> offsets = {0};

  std::string line;
  int64_t line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    auto error = [&](absl::string_view what, absl::string_view token, absl::string_view expected) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_number, ": bad ", what, " '", token, "': ", expected));
    };
    absl::string_view text = line;
    const size_t comment = text.find('#');
    if (comment != absl::string_view::npos) text = text.substr(0, comment);
    std::vector<absl::string_view> tokens =
        absl::StrSplit(text, absl::ByAnyChar(" \t\r\v\f"), absl::SkipEmpty());
    if (tokens.empty()) continue;

    float label;
    if (!ParseLabel(tokens[0], &label)) {
      return error("label", tokens[0], "expected 0, 1, -1 or +1");
    }
    const size_t row = data.dense.size();
    data.dense.resize(row + static_cast<size_t>(dense_dim), 0.0f);
    int64_t previous_index = -1;
    for (size_t t = 1; t < tokens.size(); ++t) {
      const absl::string_view token = tokens[t];
      const size_t colon = token.find(':');
      if (colon == absl::string_view::npos) {
        return error("feature", token, "expected <index>:<value>");
      }
      int64_t index;
      if (!absl::SimpleAtoi(token.substr(0, colon), &index) || index < 0) {
        return error("feature", token, "the index is not a non-negative integer");
      }
      if (index <= previous_index) {
        return error("feature", token,
                     absl::StrCat("indices must increase strictly along a line; the previous was ",
                                  previous_index));
      }
      previous_index = index;
      float value;
      if (!absl::SimpleAtof(token.substr(colon + 1), &value) || !std::isfinite(value)) {
        return error("feature", token, "the value is not a finite number");
      }
      if (index < dense_dim) {
        data.dense[row + static_cast<size_t>(index)] = value;
      } else {
        if (value != 1.0f) {
          return error("feature", token,
                       absl::StrCat("index >= dense_dim (", dense_dim,
                                    ") makes it a sparse id, whose value must be 1"));
        }
        data.sparse_ids.push_back(index);
      }
    }
    data.labels.push_back(label);
    offsets.push_back(static_cast<int64_t>(data.sparse_ids.size()));
  }
  if (in.bad()) {
    return absl::ErrnoToStatus(errno, absl::StrCat(path, ": read error after line ", line_number));
  }
  data.num_examples = static_cast<int64_t>(data.labels.size());
  if (!data.sparse_ids.empty()) data.sparse_offsets = std::move(offsets);
  return data;
}

}  // namespace pscluster
