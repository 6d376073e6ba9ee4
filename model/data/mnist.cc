#include "model/data/mnist.h"

#include <algorithm>
#include <array>
#include <climits>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "model/data/input_file.h"

namespace pscluster {
namespace {

constexpr int kNumClasses = 10;
constexpr size_t kChunkBytes = 1 << 20;
// Reserve at most this many floats up front: a corrupt header must not make us allocate much
// more than the file really holds (the vector still grows past it as real data arrives).
constexpr uint64_t kMaxReservedFloats = uint64_t{64} << 20;
// The idx type byte of unsigned bytes, the only element type read here.
constexpr unsigned char kUnsignedByteType = 0x08;

uint32_t BigEndian32(const unsigned char* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

const char* IdxTypeName(unsigned char type) {
  switch (type) {
    case 0x08:
      return "unsigned byte";
    case 0x09:
      return "signed byte";
    case 0x0b:
      return "short";
    case 0x0c:
      return "int";
    case 0x0d:
      return "float";
    case 0x0e:
      return "double";
    default:
      return "not an idx type";
  }
}

// What an idx file must hold: unsigned bytes with min_dims..max_dims dimensions.
struct IdxFormat {
  int min_dims;
  int max_dims;
  const char* kind;               // "image file"
  const char* dims_text;          // the dimension counts accepted, e.g. "3 (N, rows, columns)"
  const char* magic_text;         // the magic numbers accepted
  const char* short_header_text;  // the header, while its dimension count is unknown
};

const IdxFormat kImageFormat = {
    3,
    4,
    "image file",
    "3 (N, rows, columns) or 4 (N, rows, columns, channels)",
    "0x00000803 (idx3: unsigned bytes, N x rows x columns) or 0x00000804 (idx4: unsigned "
    "bytes, N x rows x columns x channels)",
    "16-byte idx3 (or 20-byte idx4) image file header"};
const IdxFormat kLabelFormat = {1,
                                1,
                                "label file",
                                "1 (N)",
                                "0x00000801 (idx1 label file: unsigned bytes, N labels)",
                                "8-byte idx1 label file header"};

// Reads the header of an idx file of `format` and returns its dimensions.
absl::StatusOr<std::vector<uint32_t>> ReadIdxHeader(InputFile* file, const IdxFormat& format) {
  unsigned char magic[4];
  PS_ASSIGN_OR_RETURN(const size_t got_magic, file->Read(magic, sizeof(magic)));
  if (got_magic < sizeof(magic)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file->path(), ": truncated header: the file ends at ", file->Where(got_magic),
                     " of the ", format.short_header_text, file->TruncationNote()));
  }
  const int num_dims = magic[3];
  std::string why;
  if (magic[0] != 0 || magic[1] != 0) {
    why = "not an idx file (its first two bytes are not zero)";
  } else if (magic[2] != kUnsignedByteType) {
    why = absl::StrFormat("type byte 0x%02x (%s) at offset 2, expected 0x%02x (unsigned byte)",
                          magic[2], IdxTypeName(magic[2]), kUnsignedByteType);
  } else if (num_dims < format.min_dims || num_dims > format.max_dims) {
    std::string hint;
    if (num_dims == 1) hint = ", that of an idx1 label file";
    if (num_dims == 3) hint = ", that of an idx3 image file";
    why = absl::StrFormat("%d dimension%s (byte at offset 3%s), expected %s", num_dims,
                          num_dims == 1 ? "" : "s", hint, format.dims_text);
  }
  if (!why.empty()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: wrong magic number 0x%08x at offset 0: %s; expected %s", file->path(),
                        BigEndian32(magic), why, format.magic_text));
  }
  const int header_bytes = 4 + 4 * num_dims;
  unsigned char dims_bytes[16];
  CHECK_LE(4 * num_dims, static_cast<int>(sizeof(dims_bytes)));
  PS_ASSIGN_OR_RETURN(const size_t got, file->Read(dims_bytes, 4 * num_dims));
  if (got < static_cast<size_t>(4 * num_dims)) {
    return absl::InvalidArgumentError(absl::StrCat(
        file->path(), ": truncated header: the file ends at ", file->Where(4 + got), " of the ",
        header_bytes, "-byte idx", num_dims, " ", format.kind, " header", file->TruncationNote()));
  }
  std::vector<uint32_t> dims(num_dims);
  for (int i = 0; i < num_dims; ++i) dims[i] = BigEndian32(dims_bytes + 4 * i);
  return dims;
}

}  // namespace

absl::StatusOr<Dataset> ReadMnist(const std::string& images_path, const std::string& labels_path,
                                  const MnistOptions& options) {
  if (options.max_examples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_examples must be >= 0 (0 reads all), got ", options.max_examples));
  }
  PS_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> images, InputFile::Open(images_path));
  PS_ASSIGN_OR_RETURN(const std::vector<uint32_t> image_dims,
                      ReadIdxHeader(images.get(), kImageFormat));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> labels, InputFile::Open(labels_path));
  PS_ASSIGN_OR_RETURN(const std::vector<uint32_t> label_dims,
                      ReadIdxHeader(labels.get(), kLabelFormat));

  const bool has_channels = image_dims.size() == 4;
  const uint64_t header_bytes = 4 + 4 * image_dims.size();
  const uint64_t count = image_dims[0];
  const uint64_t rows = image_dims[1];
  const uint64_t cols = image_dims[2];
  const uint64_t channels = has_channels ? image_dims[3] : 1;
  const std::string image_size =
      has_channels ? absl::StrCat(rows, "x", cols, "x", channels) : absl::StrCat(rows, "x", cols);
  // rows x cols fits in 64 bits, and so does that times channels once it is at most INT_MAX.
  const uint64_t positions = rows * cols;
  const bool too_large = positions > static_cast<uint64_t>(INT_MAX) ||
                         positions * channels > static_cast<uint64_t>(INT_MAX);
  if (too_large || positions * channels == 0) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, ": image size ", image_size, " at ",
                                                   images->Where(8),
                                                   too_large ? " is too large" : " is empty"));
  }
  const uint64_t pixels_per_image = positions * channels;
  if (label_dims[0] != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("image count ", count, " in ", images_path, " (", images->Where(4),
                     ") does not match label count ", label_dims[0], " in ", labels_path, " (",
                     labels->Where(4), ")"));
  }
  const uint64_t wanted =
      options.max_examples == 0
          ? count
          : std::min<uint64_t>(count, static_cast<uint64_t>(options.max_examples));

  Dataset data;
  data.num_examples = static_cast<int64_t>(wanted);
  data.dense_dim = static_cast<int>(pixels_per_image);
  data.num_classes = kNumClasses;
  data.image =
      ImageLayout{static_cast<int>(rows), static_cast<int>(cols), static_cast<int>(channels)};

  std::array<float, 256> scaled;
  for (int v = 0; v < 256; ++v) scaled[v] = static_cast<float>(v) / 255.0f;

  const int64_t images_end = static_cast<int64_t>(header_bytes + count * pixels_per_image);
  const uint64_t wanted_pixels = wanted * pixels_per_image;
  data.dense.reserve(std::min(wanted_pixels, kMaxReservedFloats));
  std::vector<unsigned char> buffer(std::min<uint64_t>(kChunkBytes, wanted_pixels));
  for (uint64_t done = 0; done < wanted_pixels;) {
    const size_t chunk =
        static_cast<size_t>(std::min<uint64_t>(buffer.size(), wanted_pixels - done));
    PS_RETURN_IF_ERROR(images->ReadExactly(buffer.data(), chunk, "pixel data", images_end));
    for (size_t i = 0; i < chunk; ++i) data.dense.push_back(scaled[buffer[i]]);
    done += chunk;
  }

  const int64_t labels_end = static_cast<int64_t>(8 + count);
  std::vector<unsigned char> label_bytes(wanted);
  PS_RETURN_IF_ERROR(
      labels->ReadExactly(label_bytes.data(), label_bytes.size(), "label data", labels_end));
  data.labels.resize(wanted);
  for (uint64_t i = 0; i < wanted; ++i) {
    if (label_bytes[i] >= kNumClasses) {
      return absl::InvalidArgumentError(absl::StrCat(labels_path, ": label ", label_bytes[i],
                                                     " at ", labels->Where(8 + i),
                                                     " is not a class in [0, ", kNumClasses, ")"));
    }
    data.labels[i] = static_cast<float>(label_bytes[i]);
  }

  if (wanted == count) {
    PS_RETURN_IF_ERROR(
        images->ExpectEnd(absl::StrCat("the header's ", count, " images of ", image_size)));
    PS_RETURN_IF_ERROR(labels->ExpectEnd(absl::StrCat("the header's ", count, " labels")));
  }
  return data;
}

absl::StatusOr<Dataset> ReadMnistDir(const std::string& dir, bool train,
                                     const MnistOptions& options) {
  const std::string prefix = absl::StrCat(dir, "/", train ? "train" : "t10k");
  PS_ASSIGN_OR_RETURN(const std::string images, FindGzipOrPlain(prefix + "-images-idx3-ubyte"));
  PS_ASSIGN_OR_RETURN(const std::string labels, FindGzipOrPlain(prefix + "-labels-idx1-ubyte"));
  return ReadMnist(images, labels, options);
}

}  // namespace pscluster
