#ifndef PSCLUSTER_MODEL_DATA_CIFAR10_H_
#define PSCLUSTER_MODEL_DATA_CIFAR10_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/data/dataset.h"

namespace pscluster {

// A reader for the "CIFAR-10 binary version" (cifar-10-binary.tar.gz, the folder
// cifar-10-batches-bin): files of fixed 3073-byte records, each one label byte (0..9) then
// 3072 pixel bytes, the 1024 red values of the 32x32 image in row-major order, then the 1024
// green, then the 1024 blue. A file may be gzip-compressed: that is decided by its first two
// bytes (1f 8b), never by its name.
//
// The result has dense_dim = 3072: each image in height x width x channels order (channels
// fastest, NHWC, as ModelConfig.input_shape [32, 32, 3]), pixels scaled to [0, 1]
// (value / 255); image = {32, 32, 3}, no sparse features, num_classes = 10.
//
// Errors:
//   NOT_FOUND / PERMISSION_DENIED (from errno) when a file cannot be opened.
//   INVALID_ARGUMENT for a malformed file -- an empty file, a size that is not a multiple of
//     3073 bytes (a record cut short), a label above 9, a corrupt gzip stream -- naming the
//     file and the byte offset, e.g. "/d/data_batch_2.bin: label 12 of record 5 at offset
//     15365 is not a class in [0, 10)". Offsets in gzip files count decompressed bytes and say
//     so. A gzip file may hold several members (read as one stream); bytes after the last
//     that do not start another member are an error.
//
// All functions here are thread-safe (they share no state).

inline constexpr int kCifar10Height = 32;
inline constexpr int kCifar10Width = 32;
inline constexpr int kCifar10Channels = 3;
inline constexpr int kCifar10ImageBytes = kCifar10Height * kCifar10Width * kCifar10Channels;
inline constexpr int kCifar10RecordBytes = 1 + kCifar10ImageBytes;

struct Cifar10Options {
  // Read only the first `max_examples` records (over the files in order; fewer if they hold
  // fewer); 0 reads all. Files after the one that completes the prefix are opened (so a missing
  // one is still an error) but not read.
  int64_t max_examples = 0;
};

// Reads the records of `paths`, in order, into one dataset.
absl::StatusOr<Dataset> ReadCifar10(const std::vector<std::string>& paths,
                                    const Cifar10Options& options = Cifar10Options());

// Reads the standard files of `dir`: "data_batch_1.bin" .. "data_batch_5.bin" (50,000 images)
// when `train`, otherwise "test_batch.bin" (10,000). Each is looked for with a ".gz" suffix
// first, then without; NOT_FOUND names both paths tried when neither exists.
absl::StatusOr<Dataset> ReadCifar10Dir(const std::string& dir, bool train,
                                       const Cifar10Options& options = Cifar10Options());

}  // namespace pscluster

#endif  // PSCLUSTER_MODEL_DATA_CIFAR10_H_
