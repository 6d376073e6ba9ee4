#include "model/data/criteo.h"

#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "model/data/feature_hash.h"
#include "model/data/input_file.h"

namespace pscluster {
namespace {

absl::Status ValidateOptions(const CriteoOptions& options) {
  auto bad = [](const char* field, int64_t value, const char* expected) {
    return absl::InvalidArgumentError(
        absl::StrCat("CriteoOptions.", field, " is ", value, ", expected ", expected));
  };
  if (options.num_int < 0) return bad("num_int", options.num_int, ">= 0");
  if (options.num_cat < 0) return bad("num_cat", options.num_cat, ">= 0");
  if (options.hash_buckets < 0) return bad("hash_buckets", options.hash_buckets, ">= 0");
  if (options.max_examples < 0) {
    return bad("max_examples", options.max_examples, ">= 0 (0 reads all)");
  }
  if (options.hash_buckets > 0 && options.num_cat > 0 &&
      options.hash_buckets > std::numeric_limits<int64_t>::max() / options.num_cat) {
    return bad("hash_buckets", options.hash_buckets,
               "small enough that num_cat * hash_buckets fits in int64");
  }
  return absl::OkStatus();
}

// "label, 13 integer, 26 categorical": what the columns should be, for error messages.
std::string Layout(const CriteoOptions& options) {
  return absl::StrCat("label, ", options.num_int, " integer, ", options.num_cat, " categorical");
}

}  // namespace

float CriteoDenseValue(int64_t value) {
  return value <= 0 ? 0.0f : static_cast<float>(std::log1p(static_cast<double>(value)));
}

absl::StatusOr<Dataset> ReadCriteo(const std::string& path, const CriteoOptions& options) {
  PS_RETURN_IF_ERROR(ValidateOptions(options));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, LineReader::Open(path));
  const size_t num_columns = 1 + static_cast<size_t>(options.num_int) + options.num_cat;

  Dataset data;
  data.dense_dim = options.num_int;
  data.num_classes = 0;
  if (options.num_cat > 0) data.sparse_offsets.push_back(0);

  std::string line;
  std::vector<absl::string_view> columns;
  columns.reserve(num_columns);
  while (options.max_examples == 0 || data.num_examples < options.max_examples) {
    PS_ASSIGN_OR_RETURN(const bool more, lines->Next(&line));
    if (!more) break;
    if (line.empty()) continue;
    const int64_t line_number = lines->line_number();
    auto error = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_number, ": ", what));
    };
    columns = absl::StrSplit(line, '\t');
    if (columns.size() != num_columns) {
      std::string hint;
      if (columns.size() + 1 == num_columns) {
        hint = " (no label column? Criteo's unlabelled test.txt cannot be trained on)";
      } else if (columns.size() == 1) {
        hint = " (the columns must be separated by tabs)";
      }
      return error(absl::StrCat("expected ", num_columns, " tab-separated columns (",
                                Layout(options), "), got ", columns.size(), hint));
    }
    if (columns[0] == "0") {
      data.labels.push_back(0.0f);
    } else if (columns[0] == "1") {
      data.labels.push_back(1.0f);
    } else {
      return error(absl::StrCat("bad label '", columns[0], "': expected 0 or 1"));
    }
    for (int j = 0; j < options.num_int; ++j) {
      const absl::string_view field = columns[1 + j];
      int64_t value = 0;
      if (!field.empty() && !absl::SimpleAtoi(field, &value)) {
        return error(absl::StrCat("column ", 2 + j, " (I", 1 + j, "): bad integer '", field,
                                  "': expected a decimal integer or nothing"));
      }
      data.dense.push_back(CriteoDenseValue(value));
    }
    for (int f = 0; f < options.num_cat; ++f) {
      const absl::string_view field = columns[1 + options.num_int + f];
      if (!field.empty()) {
        data.sparse_ids.push_back(CategoricalId(f, field, options.hash_buckets));
      }
    }
    if (options.num_cat > 0) {
      data.sparse_offsets.push_back(static_cast<int64_t>(data.sparse_ids.size()));
    }
    ++data.num_examples;
  }
  return data;
}

}  // namespace pscluster
