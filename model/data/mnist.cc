#include "model/data/mnist.h"

#include <zlib.h>

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

namespace pscluster {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;
constexpr uint32_t kLabelsMagic = 0x00000801;
constexpr int kNumClasses = 10;
constexpr size_t kChunkBytes = 1 << 20;
// Reserve at most this many floats up front: a corrupt header must not make us allocate much
// more than the file really holds (the vector still grows past it as real data arrives).
constexpr uint64_t kMaxReservedFloats = uint64_t{64} << 20;

// A file read front to back, gunzipped on the fly when it starts with the gzip magic. Tracks
// the offset in the (decompressed) stream for error messages. Thread-compatible.
class IdxFile {
 public:
  static absl::StatusOr<std::unique_ptr<IdxFile>> Open(const std::string& path) {
    std::FILE* file = std::fopen(path.c_str(), "rb");
    if (file == nullptr) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
    }
    unsigned char magic[2] = {0, 0};
    const size_t got = std::fread(magic, 1, 2, file);
    const bool gzipped = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    std::unique_ptr<IdxFile> idx(new IdxFile(path, gzipped));
    if (!gzipped) {
      std::rewind(file);
      idx->file_ = file;
      return idx;
    }
    std::fclose(file);
    idx->gz_ = gzopen(path.c_str(), "rb");
    if (idx->gz_ == nullptr) {
      return absl::ErrnoToStatus(errno, absl::StrCat("cannot open ", path));
    }
    gzbuffer(idx->gz_, 1 << 17);
    return idx;
  }

  ~IdxFile() {
    if (file_ != nullptr) std::fclose(file_);
    if (gz_ != nullptr) gzclose(gz_);
  }
  IdxFile(const IdxFile&) = delete;
  IdxFile& operator=(const IdxFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t offset() const { return offset_; }

  // "offset N", marked as decompressed for gzip files.
  std::string Where(int64_t offset) const {
    return absl::StrCat("offset ", offset, gzipped_ ? " (decompressed)" : "");
  }

  // Reads up to `size` bytes; fewer only where the data ends. Advances offset().
  absl::StatusOr<size_t> Read(unsigned char* buffer, size_t size) {
    size_t total = 0;
    if (file_ != nullptr) {
      total = std::fread(buffer, 1, size, file_);
      if (total < size && std::ferror(file_)) {
        return absl::ErrnoToStatus(errno,
                                   absl::StrCat(path_, ": read error at ", Where(offset_ + total)));
      }
    } else {
      while (total < size) {
        const unsigned request = static_cast<unsigned>(std::min<size_t>(size - total, kChunkBytes));
        const int got = gzread(gz_, buffer + total, request);
        if (got < 0) {
          int zerr = Z_OK;
          const char* message = gzerror(gz_, &zerr);
          if (zerr == Z_ERRNO) {
            return absl::ErrnoToStatus(
                errno, absl::StrCat(path_, ": read error at ", Where(offset_ + total)));
          }
          return absl::InvalidArgumentError(absl::StrCat(path_, ": corrupt gzip stream at ",
                                                         Where(offset_ + total), ": ", message));
        }
        total += static_cast<size_t>(got);
        if (static_cast<unsigned>(got) < request) {
          // The end of the stream. zlib reports a member cut off before its trailer as
          // Z_BUF_ERROR but still returns the bytes it could decompress.
          int zerr = Z_OK;
          gzerror(gz_, &zerr);
          gzip_cut_short_ = zerr == Z_BUF_ERROR;
          break;
        }
      }
    }
    offset_ += static_cast<int64_t>(total);
    return total;
  }

  // Appended to a truncation message: whether the gzip stream itself was cut short.
  const char* TruncationNote() const {
    return gzip_cut_short_ ? " (the gzip stream is cut short)" : "";
  }

  // Reads exactly `size` bytes of `what`; if the data ends first, INVALID_ARGUMENT saying
  // where, against `expected_end`, the offset at which the file should end.
  absl::Status ReadExactly(unsigned char* buffer, size_t size, const char* what,
                           int64_t expected_end) {
    PS_ASSIGN_OR_RETURN(const size_t got, Read(buffer, size));
    if (got < size) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": truncated ", what, ": the file ends at ", Where(offset_),
                       " of expected ", expected_end, " bytes", TruncationNote()));
    }
    return absl::OkStatus();
  }

  // OK if nothing follows the current offset; otherwise INVALID_ARGUMENT.
  absl::Status ExpectEnd(const std::string& layout) {
    unsigned char extra;
    const int64_t end = offset_;
    PS_ASSIGN_OR_RETURN(const size_t got, Read(&extra, 1));
    if (got != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": unexpected data after ", Where(end), ", where ", layout, " end"));
    }
    if (gzip_cut_short_) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": truncated gzip stream: it is cut short after ", Where(end),
                       ", before its trailer (the data is complete but its checksum is missing)"));
    }
    return absl::OkStatus();
  }

 private:
  IdxFile(std::string path, bool gzipped) : path_(std::move(path)), gzipped_(gzipped) {}

  const std::string path_;
  const bool gzipped_;
  std::FILE* file_ = nullptr;  // Owned; set for plain files.
  gzFile gz_ = nullptr;        // Owned; set for gzip files.
  int64_t offset_ = 0;
  bool gzip_cut_short_ = false;  // The gzip stream ended without its trailer.
};

uint32_t BigEndian32(const unsigned char* bytes) {
  return (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) | (uint32_t{bytes[2]} << 8) |
         uint32_t{bytes[3]};
}

// Reads the header of an idx file with `num_dims` dimensions and returns the dimensions.
absl::StatusOr<std::vector<uint32_t>> ReadIdxHeader(IdxFile* file, uint32_t magic, int num_dims,
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
  PS_ASSIGN_OR_RETURN(std::unique_ptr<IdxFile> images, IdxFile::Open(images_path));
  PS_ASSIGN_OR_RETURN(const std::vector<uint32_t> image_dims,
                      ReadIdxHeader(images.get(), kImagesMagic, 3, "idx3 image file"));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<IdxFile> labels, IdxFile::Open(labels_path));
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
