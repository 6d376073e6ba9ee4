#include "model/data/mnist.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdio>
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

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr int kNumClasses = 10;
constexpr size_t kChunkBytes = 1 << 20;
// Reserve at most this many floats up front: a corrupt header must not make us allocate much
// more than the file really holds (the vector still grows past it as real data arrives).
constexpr uint64_t kMaxReservedFloats = uint64_t{64} << 20;

uint32_t BigEndian32(const unsigned char* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

// Reads the header of an idx file with `num_dims` dimensions and returns the dimensions.
absl::StatusOr<std::vector<uint32_t>> ReadIdxHeader(InputFile* file, uint32_t magic, int num_dims,
                                                    const char* kind) {
  const int header_bytes = 4 + 4 * num_dims;
  unsigned char header[16];
  CHECK_LE(header_bytes, static_cast<int>(sizeof(header)));
  PS_ASSIGN_OR_RETURN(const size_t got, file->Read(header, header_bytes));
  if (got >= 4 && BigEndian32(header) != magic) {
    const uint32_t found = BigEndian32(header);
    std::string hint;
    if (found == kImagesMagic) hint = " (that is an idx3 image file)";
    if (found == kLabelsMagic) hint = " (that is an idx1 label file)";
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: wrong magic number 0x%08x at offset 0%s, expected 0x%08x (%s)",
                        file->path(), found, hint, magic, kind));
  }
  if (got < static_cast<size_t>(header_bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file->path(), ": truncated header: the file ends at ", file->Where(got),
                     " of the ", header_bytes, "-byte ", kind, " header", file->TruncationNote()));
  }
  std::vector<uint32_t> dims(num_dims);
  for (int i = 0; i < num_dims; ++i) dims[i] = BigEndian32(header + 4 + 4 * i);
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
                      ReadIdxHeader(images.get(), kImagesMagic, 3, "idx3 image file"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> labels, InputFile::Open(labels_path));
  PS_ASSIGN_OR_RETURN(const std::vector<uint32_t> label_dims,
                      ReadIdxHeader(labels.get(), kLabelsMagic, 1, "idx1 label file"));

  const uint64_t count = image_dims[0];
  const uint64_t rows = image_dims[1];
  const uint64_t cols = image_dims[2];
  const uint64_t pixels_per_image = rows * cols;
  if (pixels_per_image == 0 || pixels_per_image > static_cast<uint64_t>(INT_MAX)) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, ": image size ", rows, "x", cols, " at ", images->Where(8),
                     pixels_per_image == 0 ? " is empty" : " is too large"));
  }
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

  std::array<float, 256> scaled;
  for (int v = 0; v < 256; ++v) scaled[v] = static_cast<float>(v) / 255.0f;

  const int64_t images_end = static_cast<int64_t>(16 + count * pixels_per_image);
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
        images->ExpectEnd(absl::StrCat("the header's ", count, " images of ", rows, "x", cols)));
    PS_RETURN_IF_ERROR(labels->ExpectEnd(absl::StrCat("the header's ", count, " labels")));
  }
  return data;
}

absl::StatusOr<Dataset> ReadMnistDir(const std::string& dir, bool train,
                                     const MnistOptions& options) {
  const std::string prefix = absl::StrCat(dir, "/", train ? "train" : "t10k");
  auto find = [](const std::string& base) -> absl::StatusOr<std::string> {
    for (const std::string& candidate : {base + ".gz", base}) {
      std::FILE* file = std::fopen(candidate.c_str(), "rb");
      if (file != nullptr) {
        std::fclose(file);
        return candidate;
      }
      if (errno != ENOENT) {
        return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", candidate));
      }
    }
    return absl::NotFoundError(absl::StrCat("neither ", base, ".gz nor ", base, " exists"));
  };
  PS_ASSIGN_OR_RETURN(const std::string images, find(prefix + "-images-idx3-ubyte"));
  PS_ASSIGN_OR_RETURN(const std::string labels, find(prefix + "-labels-idx1-ubyte"));
  return ReadMnist(images, labels, options);
}

}  // namespace pscluster
