#ifndef PSCLUSTER_MODEL_DATA_CSV_H_
#define PSCLUSTER_MODEL_DATA_CSV_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "model/data/dataset.h"

namespace pscluster {

// A reader for delimited text (CSV), reading records as TensorFlow's tf.io.decode_csv does
// over the lines of a file: every record has one field per declared column, a column has a
// type and optionally a default for empty fields (decode_csv's record_defaults: a column
// without one makes an empty field an error).
//
// Records:
//   - One per line (plain or gzip, as model/data/input_file.h); '\r\n' line ends are
//     accepted; empty lines are skipped. A quoted field cannot span lines.
//   - Fields are separated by `delimiter`. A field that starts with '"' is quoted (RFC 4180):
//     it ends at the next lone '"', may hold delimiters, and "" inside it stands for one '"';
//     the closing quote must be followed by the delimiter or the end of the line. A '"' inside
//     an unquoted field is an error. Nothing is trimmed. A quoted empty field ("") is empty.
// Columns, by type:
//   - kFloat: a finite decimal float; kInt: a decimal integer (int64). Both become dense
//     features, in column order, the value as it is (no scaling).
//   - kString: a categorical value; a non-empty value of column c (0-based) becomes the sparse
//     id CategoricalId(c, value, hash_buckets) (model/data/feature_hash.h); an empty value
//     (an empty field whose default is "") gives no id.
//   - kLabel: exactly one column; 0 or 1 as a number ("1", "1.0", "0e0").
//   - kIgnore: not parsed at all.
//
// The result has dense_dim = the number of kFloat and kInt columns, num_classes = 0, labels
// 0/1, and sparse features iff some column is kString (each example's ids in column order).
struct CsvColumn {
  enum class Type { kFloat, kInt, kString, kLabel, kIgnore };
  // Named in error messages.
  std::string name;
  Type type = Type::kFloat;
  // The value of an empty field; none: an empty field is an error.
  std::optional<std::string> default_value;
};

struct CsvOptions {
  // One per field of a record, in order.
  std::vector<CsvColumn> columns;
  // The first line is a header: it is skipped (its field count must still match).
  bool header = false;
  // Separates the fields: any single character but '"', '\r' and '\n'.
  char delimiter = ',';
  // As CriteoOptions::hash_buckets: 0 for 62-bit ids; > 0 puts column c's ids in
  // [c * hash_buckets, (c + 1) * hash_buckets).
  int64_t hash_buckets = 0;
  // Read only the first `max_examples` records (fewer if the file holds fewer); 0 reads all.
  int64_t max_examples = 0;
};

// OK if `options` can read a file; otherwise INVALID_ARGUMENT naming what is wrong: no columns,
// not exactly one kLabel column, an empty or repeated column name, a default that does not
// parse as its column's type, a bad delimiter, negative hash_buckets or max_examples, or
// columns * hash_buckets overflowing int64.
absl::Status ValidateCsvOptions(const CsvOptions& options);

// Reads the CSV file at `path` (see above).
// Errors:
//   INVALID_ARGUMENT from ValidateCsvOptions; or for a bad record, naming the file, the
//     1-based line, the 1-based column and its name, and what was expected, e.g.
//     "/d/train.csv:7: expected 5 columns separated by ',', got 4",
//     "/d/train.csv:7: column 2 (age): bad float 'abc'",
//     "/d/train.csv:7: column 3 (city) is empty and has no default",
//     "/d/train.csv:7: column 3 (city): unterminated quoted field"; also a corrupt or cut-short
//     gzip stream.
//   NOT_FOUND / PERMISSION_DENIED etc. (from errno) if the file cannot be opened.
// Thread-safe (shares no state).
absl::StatusOr<Dataset> ReadCsv(const std::string& path, const CsvOptions& options);

// Parses the command-line form of a column list, as the chief's --csv_columns takes it:
// comma-separated entries "name:type" (no default: an empty field is an error) or
// "name:type:default" (everything after the second ':' is the default, possibly empty), with
// type one of float, int, string, label, ignore. E.g.
//   "click:label,age:float:0,clicks:int:0,city:string:,id:ignore"
// (a default cannot hold ','). The result is checked as ValidateCsvOptions checks columns.
// Errors: INVALID_ARGUMENT naming the entry (1-based) and what is wrong in it.
absl::StatusOr<std::vector<CsvColumn>> ParseCsvColumns(absl::string_view spec);

// "float", "int", "string", "label" or "ignore".
const char* CsvColumnTypeName(CsvColumn::Type type);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_CSV_H_
