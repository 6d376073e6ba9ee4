#include "model/data/cifar10.h"

#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "model/data/input_file.h"

namespace pscluster {
namespace {

constexpr int kNumClasses = 10;
constexpr int kPlaneBytes = kCifar10Height * kCifar10Width;
// Records read at a time.
constexpr int64_t kChunkRecords = 256;

// Appends the floats of one record's image: planes (R, G, B) of row-major 32x32 become
// height x width x channels.
void AppendImage(const unsigned char* pixels, const std::array<float, 256>& scaled,
                 std::vector<float>* dense) {
  const size_t start = dense->size();
  dense->resize(start + kCifar10ImageBytes);
  float* out = dense->data() + start;
  for (int position = 0; position < kPlaneBytes; ++position) {
    for (int c = 0; c < kCifar10Channels; ++c) {
      out[position * kCifar10Channels + c] = scaled[pixels[c * kPlaneBytes + position]];
    }
  }
}

// Reads the records of `file` into `data` until the file ends or data holds `wanted` examples.
absl::Status ReadRecords(InputFile* file, uint64_t wanted, const std::array<float, 256>& scaled,
                         Dataset* data) {
  std::vector<unsigned char> buffer(kChunkRecords * kCifar10RecordBytes);
  int64_t records = 0;  // Of this file.
  while (static_cast<uint64_t>(data->num_examples) < wanted) {
    const uint64_t want =
        std::min<uint64_t>(kChunkRecords, wanted - static_cast<uint64_t>(data->num_examples));
    PS_ASSIGN_OR_RETURN(const size_t got, file->Read(buffer.data(), want * kCifar10RecordBytes));
    const size_t whole = got / kCifar10RecordBytes;
    for (size_t r = 0; r < whole; ++r) {
      const unsigned char* record = buffer.data() + r * kCifar10RecordBytes;
      if (record[0] >= kNumClasses) {
        const int64_t index = records + static_cast<int64_t>(r);
        return absl::InvalidArgumentError(absl::StrCat(
            file->path(), ": label ", record[0], " of record ", index, " at ",
            file->Where(index * kCifar10RecordBytes), " is not a class in [0, ", kNumClasses, ")"));
      }
      data->labels.push_back(static_cast<float>(record[0]));
      AppendImage(record + 1, scaled, &data->dense);
    }
    records += static_cast<int64_t>(whole);
    data->num_examples += static_cast<int64_t>(whole);
    if (got % kCifar10RecordBytes != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          file->path(), ": the file ends at ", file->Where(file->offset()), ", ",
          got % kCifar10RecordBytes, " bytes into record ", records,
          ": its size is not a multiple of the ", kCifar10RecordBytes,
          "-byte CIFAR-10 record (1 label byte, then 3072 pixel bytes)", file->TruncationNote()));
    }
    if (got < want * kCifar10RecordBytes) {
      // The end of the file.
      if (records == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(file->path(), ": the file is empty, expected ", kCifar10RecordBytes,
                         "-byte CIFAR-10 records", file->TruncationNote()));
      }
      return file->ExpectEnd(absl::StrCat(records, " records of ", kCifar10RecordBytes, " bytes"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Dataset> ReadCifar10(const std::vector<std::string>& paths,
                                    const Cifar10Options& options) {
  if (options.max_examples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_examples must be >= 0 (0 reads all), got ", options.max_examples));
  }
  // Every file is opened first, so that a missing one fails before any is read, and the
  // plain ones' sizes say how much to reserve.
  std::vector<std::unique_ptr<InputFile>> files;
  uint64_t known_records = 0;
  for (const std::string& path : paths) {
    PS_ASSIGN_OR_RETURN(std::unique_ptr<InputFile> file, InputFile::Open(path));
    struct stat st;
    if (!file->gzipped() && stat(path.c_str(), &st) == 0) {
      known_records += static_cast<uint64_t>(st.st_size) / kCifar10RecordBytes;
    }
    files.push_back(std::move(file));
  }
  const uint64_t wanted =
      options.max_examples == 0 ? UINT64_MAX : static_cast<uint64_t>(options.max_examples);

  Dataset data;
  data.dense_dim = kCifar10ImageBytes;
  data.num_classes = kNumClasses;
  data.image = ImageLayout{kCifar10Height, kCifar10Width, kCifar10Channels};
  const uint64_t reserve = std::min(wanted, known_records);
  data.dense.reserve(reserve * kCifar10ImageBytes);
  data.labels.reserve(reserve);

  std::array<float, 256> scaled;
  for (int v = 0; v < 256; ++v) scaled[v] = static_cast<float>(v) / 255.0f;
  for (const std::unique_ptr<InputFile>& file : files) {
    if (static_cast<uint64_t>(data.num_examples) >= wanted) break;
    PS_RETURN_IF_ERROR(ReadRecords(file.get(), wanted, scaled, &data));
  }
  return data;
}

absl::StatusOr<Dataset> ReadCifar10Dir(const std::string& dir, bool train,
                                       const Cifar10Options& options) {
  std::vector<std::string> names;
  if (train) {
    for (int i = 1; i <= 5; ++i) names.push_back(absl::StrCat("data_batch_", i, ".bin"));
  } else {
    names.push_back("test_batch.bin");
  }
  std::vector<std::string> paths;
  for (const std::string& name : names) {
    PS_ASSIGN_OR_RETURN(std::string path, FindGzipOrPlain(absl::StrCat(dir, "/", name)));
    paths.push_back(std::move(path));
  }
  return ReadCifar10(paths, options);
}

}  // namespace pscluster
