#ifndef PSCLUSTER_MODEL_DATA_MNIST_H_
#define PSCLUSTER_MODEL_DATA_MNIST_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "model/data/dataset.h"

namespace pscluster {

// Readers for the MNIST idx format (MNIST, Fashion-MNIST, and anything else laid out the same).
//
// An image file is a big-endian header -- magic 0x00000803 (type byte 0x08: unsigned bytes; 3
// dimensions), image count, rows, columns -- followed by count x rows x columns pixel bytes; or,
// for images with channels, magic 0x00000804 (4 dimensions), count, rows, columns, channels,
// then count x rows x columns x channels bytes, channels fastest (NHWC). A label file is magic
// 0x00000801 (2049), label count, then one byte per label. Either file may be
// gzip-compressed: that is decided by its first two bytes (1f 8b), never by its name.
//
// The result has dense_dim = rows x columns x channels (channels = 1 for 3 dimensions) in the
// file's order, pixels scaled to [0, 1] (value / 255), image = {rows, columns, channels}, no
// sparse features, num_classes = 10 and labels 0..9.
//
// Errors:
//   NOT_FOUND / PERMISSION_DENIED (from errno) when a file cannot be opened.
//   INVALID_ARGUMENT for every malformed file, truncation included -- wrong magic (the message
//     says which part: a type byte other than 0x08, or a dimension count other than 3 or 4 for
//     images and 1 for labels, and what was expected), truncated
//     header, image size of zero or too large, image count != label count, data that ends
//     before the header says it should, bytes after that end, a label outside 0..9, a corrupt
//     gzip stream. The message names the file and the byte offset where it went wrong, e.g.
//     "/d/t10k-images-idx3-ubyte.gz: truncated pixel data: the file ends at offset 5000
//     (decompressed) of expected 7840016 bytes". Offsets in gzip files count decompressed
//     bytes and say so. A gzip file may hold several members (read as one stream); bytes after
//     the last that do not start another member are an error.
//
// All functions here are thread-safe (they share no state).

struct MnistOptions {
  // Read only the first `max_examples` examples (fewer if the files hold fewer); 0 reads all.
  // When reading all, bytes after the last image or label are an error; when reading a
  // prefix, the rest of the files is not read at all.
  int64_t max_examples = 0;
};

// Reads the images at `images_path` and the labels at `labels_path` (each gzip or plain).
absl::StatusOr<Dataset> ReadMnist(const std::string& images_path, const std::string& labels_path,
                                  const MnistOptions& options = MnistOptions());

// Reads the standard files of `dir`: "train-images-idx3-ubyte" and "train-labels-idx1-ubyte"
// when `train`, otherwise "t10k-images-idx3-ubyte" and "t10k-labels-idx1-ubyte". Each is
// looked for with a ".gz" suffix first, then without; NOT_FOUND names both paths tried when
// neither exists.
absl::StatusOr<Dataset> ReadMnistDir(const std::string& dir, bool train,
                                     const MnistOptions& options = MnistOptions());

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_MNIST_H_
