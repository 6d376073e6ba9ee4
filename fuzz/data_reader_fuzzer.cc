// Fuzzes the file-based dataset readers of model/data/: MNIST idx (mnist.h, ReadMnist, images
// of 3 or 4 dimensions and labels), CIFAR-10 binary (cifar10.h, ReadCifar10 over 1 to 3
// files), Criteo TSV (criteo.h, ReadCriteo), CSV (csv.h, ReadCsv) and libsvm (libsvm.h,
// ReadLibsvm). The readers take paths: the input's files are written to a directory of this
// process ($TEST_TMPDIR, else $TMPDIR, else /tmp), removed after each input and at exit.
// Whether a file is gzip is decided by its first two bytes (1f 8b), never by its name, so the
// files have plain names and the fuzzer picks gzip by writing the magic.
//
// Input (fuzz/fuzz_input.h): byte 0 % 5 picks the reader, then
//   0  idx:     max_examples (byte % 4; 0 reads all), the image file's length (uint16 LE), the
//               image file, then the label file (the rest)
//   1  CIFAR:   max_examples (byte % 4), the file count (1 + byte % 3), then each file but the
//               last as a uint16 LE length and its bytes, then the last file (the rest)
//   2  Criteo:  num_int (byte % 14), num_cat (byte % 27), hash_buckets (byte % 9 into
//               kHashBuckets), max_examples (byte % 5 into kMaxExamples), then the file
//   3  CSV:     flags (bit 0: header; bits 1-3: the delimiter, kDelimiters), hash_buckets
//               (byte % 9), max_examples (byte % 5), the column count (1 + byte % 6), a byte
//               per column (bits 0-2 % 5: float, int, string, label, ignore; bit 3: has a
//               default; bits 4-5: the default, kDefaults; bit 6: named "dup" instead of
//               "c<i>"), then the file
//   4  libsvm:  dense_dim (-1 + byte % 17), then the file
//
// Invariants: a refused input is INVALID_ARGUMENT (the files always exist) with a message; an
// accepted one has dense.size() == num_examples * dense_dim, labels.size() == num_examples,
// every dense value finite, every label a class in [0, 10) for idx and CIFAR and 0 or 1 for the
// others, sparse_offsets (when present) num_examples + 1 of them, from 0, never decreasing and
// ending at sparse_ids.size(), and at most max_examples examples. Besides, per reader: idx and
// CIFAR give their image layout and, for plain files, exactly the file's pixels / 255 and
// labels, and consume whole files when reading all; Criteo gives log1p values (>= 0) and CSV
// and Criteo ids of at most one per categorical column, in their column's bucket range when
// hash_buckets > 0 (so increasing along an example) and below 2^62 otherwise; libsvm gives
// sparse ids >= dense_dim, strictly increasing along an example.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/fuzz_check.h"
#include "fuzz/fuzz_input.h"
#include "model/data/cifar10.h"
#include "model/data/criteo.h"
#include "model/data/csv.h"
#include "model/data/libsvm.h"
#include "model/data/mnist.h"

namespace pscluster {
namespace {

constexpr int64_t kHashBuckets[] = {0,
                                    1,
                                    2,
                                    10,
                                    1000,
                                    int64_t{1} << 40,
                                    std::numeric_limits<int64_t>::max() / 26,
                                    std::numeric_limits<int64_t>::max(),
                                    -1};
constexpr int64_t kMaxExamples[] = {0, 1, 2, 3, -1};
// The last two are refused by ValidateCsvOptions.
constexpr char kDelimiters[] = {',', '\t', ';', ' ', '|', ':', '"', '\0'};
const char* const kDefaults[] = {"", "0", "1", "x"};
// Ids without hash buckets are below 2^62 (kCategoricalIdLimit, model/data/feature_hash.h).
constexpr int64_t kIdLimit = int64_t{1} << 62;

// A directory of this process for the input's files, removed at exit.
const std::string& Scratch() {
  static const std::string* dir = [] {
    std::string base;
    if (const char* test_tmp = std::getenv("TEST_TMPDIR"); test_tmp != nullptr && *test_tmp) {
      base = test_tmp;
    } else {
      base = std::filesystem::temp_directory_path().string();  // $TMPDIR, else /tmp
    }
    std::string templ = base + "/data_reader_fuzzer.XXXXXX";
    FUZZ_CHECK(mkdtemp(templ.data()) != nullptr, "mkdtemp ", templ);
    auto* path = new std::string(templ);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(Scratch(), ec);
    });
    return path;
  }();
  return *dir;
}

// The files of one input: written into Scratch(), removed when it goes out of scope.
class Files {
 public:
  ~Files() {
    for (const std::string& path : paths_) unlink(path.c_str());
  }

  // Writes `contents` to a new file of this input and returns its path.
  std::string Write(const std::string& contents) {
    const std::string path = absl::StrCat(Scratch(), "/f", paths_.size());
    std::FILE* f = std::fopen(path.c_str(), "wb");
    FUZZ_CHECK(f != nullptr, "cannot create ", path);
    paths_.push_back(path);
    FUZZ_CHECK(std::fwrite(contents.data(), 1, contents.size(), f) == contents.size(),
               "cannot write ", path);
    FUZZ_CHECK(std::fclose(f) == 0, "cannot write ", path);
    return path;
  }

 private:
  std::vector<std::string> paths_;
};

bool Gzipped(const std::string& contents) {
  return contents.size() >= 2 && static_cast<unsigned char>(contents[0]) == 0x1f &&
         static_cast<unsigned char>(contents[1]) == 0x8b;
}

float Pixel(char byte) { return static_cast<float>(static_cast<unsigned char>(byte)) / 255.0f; }

void CheckRefused(const absl::Status& status, const char* reader) {
  FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument && !status.message().empty(),
             reader, " refused an input with ", status.ToString(),
             ", expected INVALID_ARGUMENT with a message");
}

// What every reader's result must satisfy.
void CheckCommon(const Dataset& data, const char* reader, int dense_dim, int num_classes,
                 int64_t max_examples) {
  const int64_t n = data.num_examples;
  FUZZ_CHECK(n >= 0, reader, ": num_examples ", n);
  FUZZ_CHECK(max_examples <= 0 || n <= max_examples, reader, ": ", n,
             " examples with max_examples ", max_examples);
  FUZZ_CHECK(data.dense_dim == dense_dim, reader, ": dense_dim ", data.dense_dim, ", expected ",
             dense_dim);
  FUZZ_CHECK(data.num_classes == num_classes, reader, ": num_classes ", data.num_classes,
             ", expected ", num_classes);
  FUZZ_CHECK(data.dense.size() == static_cast<uint64_t>(n) * static_cast<uint64_t>(dense_dim),
             reader, ": ", data.dense.size(), " dense values for ", n, " examples of ", dense_dim);
  FUZZ_CHECK(data.labels.size() == static_cast<uint64_t>(n), reader, ": ", data.labels.size(),
             " labels for ", n, " examples");
  for (size_t i = 0; i < data.dense.size(); ++i) {
    FUZZ_CHECK(std::isfinite(data.dense[i]), reader, ": dense value ", i, " is ", data.dense[i]);
  }
  for (size_t i = 0; i < data.labels.size(); ++i) {
    const float label = data.labels[i];
    const bool ok = num_classes == 0 ? (label == 0.0f || label == 1.0f)
                                     : (std::isfinite(label) && label >= 0 && label < num_classes &&
                                        std::floor(label) == label);
    FUZZ_CHECK(ok, reader, ": label ", i, " is ", label, " (num_classes ", num_classes, ")");
  }
  if (data.sparse_offsets.empty()) {
    FUZZ_CHECK(data.sparse_ids.empty(), reader, ": ", data.sparse_ids.size(),
               " sparse ids without offsets");
    return;
  }
  FUZZ_CHECK(data.sparse_offsets.size() == static_cast<uint64_t>(n) + 1, reader, ": ",
             data.sparse_offsets.size(), " sparse offsets for ", n, " examples");
  FUZZ_CHECK(data.sparse_offsets.front() == 0, reader, ": sparse_offsets[0] is ",
             data.sparse_offsets.front());
  for (int64_t i = 0; i < n; ++i) {
    FUZZ_CHECK(data.sparse_offsets[i] <= data.sparse_offsets[i + 1], reader,
               ": sparse_offsets decrease at example ", i);
  }
  FUZZ_CHECK(static_cast<uint64_t>(data.sparse_offsets.back()) == data.sparse_ids.size(), reader,
             ": sparse_offsets end at ", data.sparse_offsets.back(), " of ", data.sparse_ids.size(),
             " ids");
}

// The image readers: layout, pixels in [0, 1].
void CheckImage(const Dataset& data, const char* reader) {
  FUZZ_CHECK(data.image.has_value(), reader, ": no image layout");
  const ImageLayout& image = *data.image;
  FUZZ_CHECK(image.height > 0 && image.width > 0 && image.channels > 0 &&
                 int64_t{image.height} * image.width * image.channels == data.dense_dim,
             reader, ": image ", image.height, "x", image.width, "x", image.channels,
             " for dense_dim ", data.dense_dim);
  FUZZ_CHECK(!data.has_sparse(), reader, ": sparse features");
  for (float v : data.dense) FUZZ_CHECK(v >= 0.0f && v <= 1.0f, reader, ": pixel ", v);
}

// Criteo and CSV: each example's ids, at most one per categorical column; with hash_buckets,
// each in the range of one of `columns` (in order, so strictly increasing).
void CheckCategoricalIds(const Dataset& data, const char* reader, const std::vector<int>& columns,
                         int64_t hash_buckets) {
  FUZZ_CHECK(data.has_sparse() == !columns.empty(), reader, ": sparse features ", data.has_sparse(),
             " with ", columns.size(), " categorical columns");
  if (!data.has_sparse()) return;
  for (int64_t i = 0; i < data.num_examples; ++i) {
    const int64_t begin = data.sparse_offsets[i];
    const int64_t end = data.sparse_offsets[i + 1];
    FUZZ_CHECK(end - begin <= static_cast<int64_t>(columns.size()), reader, ": example ", i,
               " has ", end - begin, " ids from ", columns.size(), " categorical columns");
    size_t next_column = 0;  // Ids come in column order.
    for (int64_t k = begin; k < end; ++k) {
      const int64_t id = data.sparse_ids[k];
      if (hash_buckets == 0) {
        FUZZ_CHECK(id >= 0 && id < kIdLimit, reader, ": id ", id, " out of range");
        continue;
      }
      while (next_column < columns.size() &&
             id >= (int64_t{columns[next_column]} + 1) * hash_buckets) {
        ++next_column;
      }
      FUZZ_CHECK(next_column < columns.size() && id >= columns[next_column] * hash_buckets, reader,
                 ": id ", id, " of example ", i, " is in no categorical column's range of ",
                 hash_buckets, " buckets, in column order");
      ++next_column;
    }
  }
}

void FuzzIdx(FuzzInput& in) {
  MnistOptions options;
  options.max_examples = in.Int<uint8_t>() % 4;
  const std::string images = in.Bytes(in.Int<uint16_t>());
  const std::string labels = in.Rest();
  Files files;
  absl::StatusOr<Dataset> data = ReadMnist(files.Write(images), files.Write(labels), options);
  if (!data.ok()) return CheckRefused(data.status(), "idx");
  CheckCommon(*data, "idx", data->dense_dim, 10, options.max_examples);
  CheckImage(*data, "idx");
  FUZZ_CHECK(data->dense_dim > 0, "idx: dense_dim ", data->dense_dim);
  const uint64_t n = static_cast<uint64_t>(data->num_examples);
  if (!Gzipped(images)) {
    FUZZ_CHECK(images.size() >= 16, "idx: accepted a ", images.size(), "-byte image file");
    const size_t header = 4 + 4 * static_cast<size_t>(static_cast<unsigned char>(images[3]));
    FUZZ_CHECK(images.size() >= header + data->dense.size(), "idx: ", data->dense.size(),
               " pixels from a ", images.size(), "-byte image file");
    if (options.max_examples == 0) {
      FUZZ_CHECK(images.size() == header + data->dense.size(), "idx: ", data->dense.size(),
                 " pixels read all of a ", images.size(), "-byte image file");
    }
    for (size_t i = 0; i < data->dense.size(); ++i) {
      FUZZ_CHECK(data->dense[i] == Pixel(images[header + i]), "idx: pixel ", i, " is ",
                 data->dense[i]);
    }
  }
  if (!Gzipped(labels)) {
    FUZZ_CHECK(labels.size() >= 8 + n, "idx: ", n, " labels from a ", labels.size(),
               "-byte label file");
    if (options.max_examples == 0) {
      FUZZ_CHECK(labels.size() == 8 + n, "idx: ", n, " labels read all of a ", labels.size(),
                 "-byte label file");
    }
    for (uint64_t i = 0; i < n; ++i) {
      FUZZ_CHECK(data->labels[i] == static_cast<unsigned char>(labels[8 + i]), "idx: label ", i,
                 " is ", data->labels[i]);
    }
  }
}

void FuzzCifar(FuzzInput& in) {
  Cifar10Options options;
  options.max_examples = in.Int<uint8_t>() % 4;
  const int num_files = in.Small(1, 3);
  std::vector<std::string> contents;
  for (int i = 0; i + 1 < num_files; ++i) contents.push_back(in.Bytes(in.Int<uint16_t>()));
  contents.push_back(in.Rest());
  Files files;
  std::vector<std::string> paths;
  bool any_gzipped = false;
  std::string all;  // The files' bytes, one after the other.
  for (const std::string& c : contents) {
    paths.push_back(files.Write(c));
    any_gzipped = any_gzipped || Gzipped(c);
    all += c;
  }
  absl::StatusOr<Dataset> data = ReadCifar10(paths, options);
  if (!data.ok()) return CheckRefused(data.status(), "CIFAR-10");
  CheckCommon(*data, "CIFAR-10", kCifar10ImageBytes, 10, options.max_examples);
  CheckImage(*data, "CIFAR-10");
  FUZZ_CHECK(*data->image == (ImageLayout{kCifar10Height, kCifar10Width, kCifar10Channels}),
             "CIFAR-10: image ", data->image->height, "x", data->image->width, "x",
             data->image->channels);
  if (any_gzipped) return;
  const uint64_t n = static_cast<uint64_t>(data->num_examples);
  FUZZ_CHECK(all.size() >= n * kCifar10RecordBytes, "CIFAR-10: ", n, " records from ", all.size(),
             " bytes");
  if (options.max_examples == 0) {
    FUZZ_CHECK(all.size() == n * kCifar10RecordBytes, "CIFAR-10: ", n, " records read all of ",
               all.size(), " bytes");
  }
  constexpr int kPlane = kCifar10Height * kCifar10Width;
  for (uint64_t i = 0; i < n; ++i) {
    const char* record = all.data() + i * kCifar10RecordBytes;
    FUZZ_CHECK(data->labels[i] == static_cast<unsigned char>(record[0]), "CIFAR-10: label ", i,
               " is ", data->labels[i]);
    const float* image = data->dense.data() + i * kCifar10ImageBytes;
    for (int p = 0; p < kPlane; ++p) {
      for (int c = 0; c < kCifar10Channels; ++c) {
        FUZZ_CHECK(image[p * kCifar10Channels + c] == Pixel(record[1 + c * kPlane + p]),
                   "CIFAR-10: record ", i, " position ", p, " channel ", c, " is ",
                   image[p * kCifar10Channels + c]);
      }
    }
  }
}

void FuzzCriteo(FuzzInput& in) {
  CriteoOptions options;
  options.num_int = in.Int<uint8_t>() % 14;
  options.num_cat = in.Int<uint8_t>() % 27;
  options.hash_buckets = kHashBuckets[in.Int<uint8_t>() % std::size(kHashBuckets)];
  options.max_examples = kMaxExamples[in.Int<uint8_t>() % std::size(kMaxExamples)];
  Files files;
  absl::StatusOr<Dataset> data = ReadCriteo(files.Write(in.Rest()), options);
  if (!data.ok()) return CheckRefused(data.status(), "Criteo");
  FUZZ_CHECK(options.hash_buckets >= 0 && options.max_examples >= 0,
             "Criteo: accepted hash_buckets ", options.hash_buckets, ", max_examples ",
             options.max_examples);
  CheckCommon(*data, "Criteo", options.num_int, 0, options.max_examples);
  FUZZ_CHECK(!data->image.has_value(), "Criteo: an image layout");
  for (float v : data->dense) FUZZ_CHECK(v >= 0.0f, "Criteo: dense value ", v);
  std::vector<int> columns;
  for (int f = 0; f < options.num_cat; ++f) columns.push_back(f);
  CheckCategoricalIds(*data, "Criteo", columns, options.hash_buckets);
}

void FuzzCsv(FuzzInput& in) {
  CsvOptions options;
  const uint8_t flags = in.Int<uint8_t>();
  options.header = (flags & 1) != 0;
  options.delimiter = kDelimiters[(flags >> 1) & 7];
  options.hash_buckets = kHashBuckets[in.Int<uint8_t>() % std::size(kHashBuckets)];
  options.max_examples = kMaxExamples[in.Int<uint8_t>() % std::size(kMaxExamples)];
  const int num_columns = in.Small(1, 6);
  int dense_dim = 0;
  std::vector<int> string_columns;
  for (int c = 0; c < num_columns; ++c) {
    const uint8_t b = in.Int<uint8_t>();
    CsvColumn column;
    column.type = static_cast<CsvColumn::Type>((b & 7) % 5);
    if ((b & 8) != 0) column.default_value = kDefaults[(b >> 4) & 3];
    column.name = (b & 0x40) != 0 ? "dup" : absl::StrCat("c", c);
    if (column.type == CsvColumn::Type::kFloat || column.type == CsvColumn::Type::kInt) {
      ++dense_dim;
    }
    if (column.type == CsvColumn::Type::kString) string_columns.push_back(c);
    options.columns.push_back(std::move(column));
  }
  Files files;
  absl::StatusOr<Dataset> data = ReadCsv(files.Write(in.Rest()), options);
  if (!data.ok()) return CheckRefused(data.status(), "CSV");
  FUZZ_CHECK(ValidateCsvOptions(options).ok(),
             "CSV: read with options it refuses: ", ValidateCsvOptions(options).ToString());
  CheckCommon(*data, "CSV", dense_dim, 0, options.max_examples);
  FUZZ_CHECK(!data->image.has_value(), "CSV: an image layout");
  CheckCategoricalIds(*data, "CSV", string_columns, options.hash_buckets);
}

void FuzzLibsvm(FuzzInput& in) {
  const int dense_dim = in.Small(-1, 15);
  Files files;
  absl::StatusOr<Dataset> data = ReadLibsvm(files.Write(in.Rest()), dense_dim);
  if (!data.ok()) return CheckRefused(data.status(), "libsvm");
  FUZZ_CHECK(dense_dim >= 0, "libsvm: accepted dense_dim ", dense_dim);
  CheckCommon(*data, "libsvm", dense_dim, 0, 0);
  FUZZ_CHECK(!data->image.has_value(), "libsvm: an image layout");
  if (!data->has_sparse()) return;
  FUZZ_CHECK(!data->sparse_ids.empty(), "libsvm: sparse offsets without ids");
  for (int64_t i = 0; i < data->num_examples; ++i) {
    for (int64_t k = data->sparse_offsets[i]; k < data->sparse_offsets[i + 1]; ++k) {
      const int64_t id = data->sparse_ids[k];
      FUZZ_CHECK(id >= dense_dim, "libsvm: sparse id ", id, " below dense_dim ", dense_dim);
      FUZZ_CHECK(k == data->sparse_offsets[i] || id > data->sparse_ids[k - 1],
                 "libsvm: ids of example ", i, " do not increase: ", data->sparse_ids[k - 1],
                 " then ", id);
    }
  }
}

}  // namespace
}  // namespace pscluster

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  pscluster::FuzzInput in(data, size);
  switch (in.Int<uint8_t>() % 5) {
    case 0:
      pscluster::FuzzIdx(in);
      break;
    case 1:
      pscluster::FuzzCifar(in);
      break;
    case 2:
      pscluster::FuzzCriteo(in);
      break;
    case 3:
      pscluster::FuzzCsv(in);
      break;
    default:
      pscluster::FuzzLibsvm(in);
      break;
  }
  return 0;
}
