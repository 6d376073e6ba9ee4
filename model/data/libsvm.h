#ifndef PSCLUSTER_MODEL_DATA_LIBSVM_H_
#define PSCLUSTER_MODEL_DATA_LIBSVM_H_

#include <string>

#include "absl/status/statusor.h"
#include "model/data/dataset.h"

namespace pscluster {

// Reads a binary-classification file in libsvm / svmlight text format:
//
//   <label> <index>:<value> <index>:<value> ...   # optional comment
//
// one example per line, tokens separated by spaces or tabs.
//   - The label is 0 or 1, or -1 or +1 (-1 maps to 0); "1.0"-style spellings are accepted.
//   - Indices are non-negative integers in strictly increasing order within a line, used as
//     they are (no 1-based shift): index i < dense_dim sets dense feature i to the value
//     (features a line leaves out are 0); index i >= dense_dim adds sparse id i (the index
//     itself, not i - dense_dim), and its value must be 1 -- any other value is an error, as
//     it usually means dense_dim is too small for the file.
//   - Values are finite decimal floats.
//   - Empty lines, whitespace-only lines and everything from '#' to the end of a line are
//     skipped. Windows line ends are accepted.
//
// The result has num_classes = 0 and labels 0/1. It has sparse features (sparse_offsets of
// num_examples + 1 entries) iff some line of the file has an index >= dense_dim.
//
// Errors: NOT_FOUND / PERMISSION_DENIED (from errno) if the file cannot be opened;
// INVALID_ARGUMENT if dense_dim < 0, or for a malformed line, naming the file, the 1-based line
// number and the bad token, e.g. "/d/train.svm:7: bad label 'yes': expected 0, 1, -1 or +1".
//
// Thread-safe (shares no state).
absl::StatusOr<Dataset> ReadLibsvm(const std::string& path, int dense_dim);

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_LIBSVM_H_
