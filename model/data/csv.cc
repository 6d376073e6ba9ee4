#include "model/data/csv.h"

#include <cmath>
#include <limits>
#include <memory>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "model/data/feature_hash.h"
#include "model/data/input_file.h"

namespace pscluster {
namespace {

using Type = CsvColumn::Type;

bool ParseFloat(absl::string_view text, float* value) {
  return absl::SimpleAtof(text, value) && std::isfinite(*value);
}

bool ParseInt(absl::string_view text, float* value) {
  int64_t parsed;
  if (!absl::SimpleAtoi(text, &parsed)) return false;
  *value = static_cast<float>(parsed);
  return true;
}

bool ParseLabel(absl::string_view text, float* value) {
  double parsed;
  if (!absl::SimpleAtod(text, &parsed) || (parsed != 0.0 && parsed != 1.0)) return false;
  *value = static_cast<float>(parsed);
  return true;
}

// What a field of `type` must look like, for error messages.
const char* Expected(Type type) {
  switch (type) {
    case Type::kFloat:
      return "expected a finite decimal number";
    case Type::kInt:
      return "expected a decimal integer";
    case Type::kLabel:
      return "expected 0 or 1";
    default:
      return "";
  }
}

// Parses a numeric field (kFloat, kInt, kLabel) into *value.
bool ParseNumber(Type type, absl::string_view text, float* value) {
  switch (type) {
    case Type::kFloat:
      return ParseFloat(text, value);
    case Type::kInt:
      return ParseInt(text, value);
    case Type::kLabel:
      return ParseLabel(text, value);
    default:
      return false;
  }
}

std::string DelimiterName(char delimiter) {
  if (delimiter == '\t') return "tab";
  if (delimiter == ' ') return "space";
  return absl::StrCat("'", std::string(1, delimiter), "'");
}

// Splits `line` into *fields (RFC 4180 quoting, see csv.h). On a malformed field returns
// false with its 0-based index in *bad_field and the reason in *error.
bool SplitRecord(absl::string_view line, char delimiter, std::vector<std::string>* fields,
                 size_t* bad_field, std::string* error) {
  fields->clear();
  const size_t n = line.size();
  size_t i = 0;
  while (true) {
    std::string field;
    if (i < n && line[i] == '"') {
      ++i;
      while (true) {
        if (i >= n) {
          *bad_field = fields->size();
          *error = "unterminated quoted field (a quoted field cannot span lines)";
          return false;
        }
        if (line[i] == '"') {
          if (i + 1 < n && line[i + 1] == '"') {
            field += '"';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        field += line[i++];
      }
      if (i < n && line[i] != delimiter) {
        *bad_field = fields->size();
        *error = absl::StrCat("'", std::string(1, line[i]),
                              "' after the closing quote: expected the delimiter ",
                              DelimiterName(delimiter), " or the end of the line");
        return false;
      }
    } else {
      size_t end = line.find(delimiter, i);
      if (end == absl::string_view::npos) end = n;
      field = std::string(line.substr(i, end - i));
      if (field.find('"') != std::string::npos) {
        *bad_field = fields->size();
        *error = absl::StrCat("'\"' inside the unquoted field '", field,
                              "': quote the whole field and double the quotes inside it");
        return false;
      }
      i = end;
    }
    fields->push_back(std::move(field));
    if (i >= n) return true;
    ++i;  // The delimiter.
  }
}

}  // namespace

const char* CsvColumnTypeName(CsvColumn::Type type) {
  switch (type) {
    case Type::kFloat:
      return "float";
    case Type::kInt:
      return "int";
    case Type::kString:
      return "string";
    case Type::kLabel:
      return "label";
    case Type::kIgnore:
      return "ignore";
  }
  return "?";
}

absl::Status ValidateCsvOptions(const CsvOptions& options) {
  if (options.columns.empty()) {
    return absl::InvalidArgumentError("CSV: no columns: at least the label column is needed");
  }
  int labels = 0;
  std::set<std::string> names;
  for (size_t c = 0; c < options.columns.size(); ++c) {
    const CsvColumn& column = options.columns[c];
    const std::string which = absl::StrCat("CSV column ", c + 1, " (", column.name, ")");
    if (column.name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("CSV column ", c + 1, " has no name"));
    }
    if (!names.insert(column.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, ": the name is used by an earlier column too"));
    }
    if (column.type == Type::kLabel) ++labels;
    float unused;
    if (column.default_value.has_value() &&
        (column.type == Type::kFloat || column.type == Type::kInt || column.type == Type::kLabel) &&
        !ParseNumber(column.type, *column.default_value, &unused)) {
      return absl::InvalidArgumentError(
          absl::StrCat(which, ": bad default '", *column.default_value, "' for a ",
                       CsvColumnTypeName(column.type), " column: ", Expected(column.type)));
    }
  }
  if (labels != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CSV: ", labels, " label columns, expected exactly 1"));
  }
  const char d = options.delimiter;
  if (d == '"' || d == '\r' || d == '\n' || d == '\0') {
    return absl::InvalidArgumentError(absl::StrCat(
        "CSV: bad delimiter (character ", static_cast<int>(static_cast<unsigned char>(d)),
        "): expected a single character other than '\"', '\\r', '\\n' and NUL"));
  }
  if (options.hash_buckets < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CSV: hash_buckets is ", options.hash_buckets, ", expected >= 0"));
  }
  if (options.hash_buckets > 0 &&
      options.hash_buckets >
          std::numeric_limits<int64_t>::max() / static_cast<int64_t>(options.columns.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("CSV: hash_buckets is ", options.hash_buckets,
                     ", expected small enough that columns * hash_buckets fits in int64"));
  }
  if (options.max_examples < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CSV: max_examples is ", options.max_examples,
                                                   ", expected >= 0 (0 reads all)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Dataset> ReadCsv(const std::string& path, const CsvOptions& options) {
  PS_RETURN_IF_ERROR(ValidateCsvOptions(options));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<LineReader> lines, LineReader::Open(path));
  const std::vector<CsvColumn>& columns = options.columns;

  Dataset data;
  data.num_classes = 0;
  bool sparse = false;
  for (const CsvColumn& column : columns) {
    if (column.type == Type::kFloat || column.type == Type::kInt) ++data.dense_dim;
    if (column.type == Type::kString) sparse = true;
  }
  if (sparse) data.sparse_offsets.push_back(0);

  std::string line;
  std::vector<std::string> fields;
  bool header_pending = options.header;
  while (options.max_examples == 0 || data.num_examples < options.max_examples) {
    PS_ASSIGN_OR_RETURN(const bool more, lines->Next(&line));
    if (!more) break;
    if (line.empty()) continue;
    const int64_t line_number = lines->line_number();
    auto error = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line_number, ": ", what));
    };
    auto column_error = [&](size_t c, const std::string& what) {
      return error(absl::StrCat("column ", c + 1, " (", columns[c].name, ")", what));
    };
    size_t bad_field = 0;
    std::string why;
    if (!SplitRecord(line, options.delimiter, &fields, &bad_field, &why)) {
      if (bad_field < columns.size()) return column_error(bad_field, ": " + why);
      return error(absl::StrCat("column ", bad_field + 1, ": ", why));
    }
    if (fields.size() != columns.size()) {
      const std::string delimiter = DelimiterName(options.delimiter);
      if (header_pending) {
        return error(absl::StrCat("the header has ", fields.size(), " columns separated by ",
                                  delimiter, ", expected ", columns.size()));
      }
      return error(absl::StrCat("expected ", columns.size(), " columns separated by ", delimiter,
                                ", got ", fields.size()));
    }
    if (header_pending) {
      header_pending = false;
      continue;
    }
    float label = 0;
    for (size_t c = 0; c < columns.size(); ++c) {
      const CsvColumn& column = columns[c];
      if (column.type == Type::kIgnore) continue;
      absl::string_view text = fields[c];
      if (text.empty()) {
        if (!column.default_value.has_value()) {
          return column_error(c, " is empty and has no default");
        }
        text = *column.default_value;
      }
      if (column.type == Type::kString) {
        if (!text.empty()) {
          data.sparse_ids.push_back(CategoricalId(static_cast<int>(c), text, options.hash_buckets));
        }
        continue;
      }
      float value;
      if (!ParseNumber(column.type, text, &value)) {
        return column_error(c, absl::StrCat(": bad ", CsvColumnTypeName(column.type), " '", text,
                                            "': ", Expected(column.type)));
      }
      if (column.type == Type::kLabel) {
        label = value;
      } else {
        data.dense.push_back(value);
      }
    }
    data.labels.push_back(label);
    if (sparse) data.sparse_offsets.push_back(static_cast<int64_t>(data.sparse_ids.size()));
    ++data.num_examples;
  }
  return data;
}

absl::StatusOr<std::vector<CsvColumn>> ParseCsvColumns(absl::string_view spec) {
  std::vector<CsvColumn> columns;
  const std::vector<absl::string_view> entries = absl::StrSplit(spec, ',');
  for (size_t e = 0; e < entries.size(); ++e) {
    const absl::string_view entry = entries[e];
    auto bad = [&](const std::string& what) {
      return absl::InvalidArgumentError(absl::StrCat(
          "entry ", e + 1, " '", entry, "': ", what,
          " (expected name:type or name:type:default, type float, int, string, label or "
          "ignore)"));
    };
    const std::vector<absl::string_view> parts = absl::StrSplit(entry, absl::MaxSplits(':', 2));
    if (parts.size() < 2) return bad("no type");
    CsvColumn column;
    column.name = std::string(parts[0]);
    if (column.name.empty()) return bad("no name");
    const absl::string_view type = parts[1];
    if (type == "float") {
      column.type = Type::kFloat;
    } else if (type == "int") {
      column.type = Type::kInt;
    } else if (type == "string") {
      column.type = Type::kString;
    } else if (type == "label") {
      column.type = Type::kLabel;
    } else if (type == "ignore") {
      column.type = Type::kIgnore;
    } else {
      return bad(absl::StrCat("unknown type '", type, "'"));
    }
    if (parts.size() == 3) column.default_value = std::string(parts[2]);
    columns.push_back(std::move(column));
  }
  CsvOptions options;
  options.columns = columns;
  PS_RETURN_IF_ERROR(ValidateCsvOptions(options));
  return columns;
}

}  // namespace pscluster
