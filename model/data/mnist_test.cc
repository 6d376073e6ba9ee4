#include "model/data/mnist.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string BigEndian32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string ImageFile(uint32_t count, uint32_t rows, uint32_t cols, const std::string& pixels) {
  return BigEndian32(2051) + BigEndian32(count) + BigEndian32(rows) + BigEndian32(cols) + pixels;
}

// An idx4 image file: magic 0x00000804, count, rows, columns, channels, then the pixel bytes.
std::string ImageFile4(uint32_t count, uint32_t rows, uint32_t cols, uint32_t channels,
                       const std::string& pixels) {
  return BigEndian32(2052) + BigEndian32(count) + BigEndian32(rows) + BigEndian32(cols) +
         BigEndian32(channels) + pixels;
}

std::string LabelFile(uint32_t count, const std::string& labels) {
  return BigEndian32(2049) + BigEndian32(count) + labels;
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/mnist_test_", name);
}

std::string WritePlain(const std::string& name, const std::string& contents) {
  const std::string path = TempPath(name);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  std::fwrite(contents.data(), 1, contents.size(), f);
  std::fclose(f);
  return path;
}

std::string Gzip(const std::string& contents) {
  const std::string path = TempPath("gzip_scratch");
  gzFile gz = gzopen(path.c_str(), "wb");
  EXPECT_NE(gz, nullptr);
  EXPECT_EQ(gzwrite(gz, contents.data(), contents.size()), static_cast<int>(contents.size()));
  EXPECT_EQ(gzclose(gz), Z_OK);
  std::string compressed;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), f)) > 0) compressed.append(buffer, got);
  std::fclose(f);
  return compressed;
}

std::string WriteGzip(const std::string& name, const std::string& contents) {
  return WritePlain(name, Gzip(contents));
}

// Three 2x3 images; the pixel bytes cover 0, 255 and values between.
const std::string& TinyPixels() {
  static const std::string* pixels = new std::string{
      0,
      1,
      2,
      3,
      4,
      5,  // image 0
      static_cast<char>(255),
      static_cast<char>(128),
      127,
      64,
      32,
      16,  // image 1
      10,
      20,
      30,
      40,
      50,
      static_cast<char>(200),  // image 2
  };
  return *pixels;
}
const std::string kTinyLabels = {9, 0, 4};

std::vector<float> Scaled(const std::string& bytes) {
  std::vector<float> out;
  for (const char c : bytes) out.push_back(static_cast<unsigned char>(c) / 255.0f);
  return out;
}

void ExpectTinyDataset(const Dataset& data) {
  EXPECT_EQ(data.num_examples, 3);
  EXPECT_EQ(data.dense_dim, 6);
  EXPECT_EQ(data.num_classes, 10);
  EXPECT_EQ(data.dense, Scaled(TinyPixels()));
  EXPECT_THAT(data.labels, ElementsAre(9, 0, 4));
  EXPECT_FALSE(data.has_sparse());
  ASSERT_TRUE(data.image.has_value());
  EXPECT_EQ(*data.image, (ImageLayout{2, 3, 1}));
  EXPECT_TRUE(ValidateDataset(data).ok());
}

TEST(ReadMnistTest, ReadsPlainFilesExactly) {
  const std::string images = WritePlain("plain_images", ImageFile(3, 2, 3, TinyPixels()));
  const std::string labels = WritePlain("plain_labels", LabelFile(3, kTinyLabels));
  absl::StatusOr<Dataset> data = ReadMnist(images, labels);
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectTinyDataset(*data);
  EXPECT_EQ(data->dense[6], 1.0f);
  EXPECT_EQ(data->dense[0], 0.0f);
}

TEST(ReadMnistTest, ReadsGzipFilesExactlyWhateverTheirNames) {
  // Compression is detected from the content: a gzip file without ".gz", and a mix.
  const std::string images = WriteGzip("gz_images", ImageFile(3, 2, 3, TinyPixels()));
  const std::string labels = WriteGzip("gz_labels.bin", LabelFile(3, kTinyLabels));
  absl::StatusOr<Dataset> data = ReadMnist(images, labels);
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectTinyDataset(*data);

  const std::string plain_labels = WritePlain("plain_labels.gz", LabelFile(3, kTinyLabels));
  data = ReadMnist(images, plain_labels);
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectTinyDataset(*data);
}

TEST(ReadMnistTest, MaxExamplesReadsAPrefixOnly) {
  // The prefix is read even though the rest of the file is truncated.
  const std::string pixels = TinyPixels().substr(0, 6 * 2 + 1);
  const std::string images = WriteGzip("prefix_images", ImageFile(3, 2, 3, pixels));
  const std::string labels = WritePlain("prefix_labels", LabelFile(3, kTinyLabels));
  MnistOptions options;
  options.max_examples = 2;
  absl::StatusOr<Dataset> data = ReadMnist(images, labels, options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 2);
  EXPECT_EQ(data->dense, Scaled(TinyPixels().substr(0, 12)));
  EXPECT_THAT(data->labels, ElementsAre(9, 0));

  options.max_examples = 100;
  const std::string full = WritePlain("prefix_full_images", ImageFile(3, 2, 3, TinyPixels()));
  data = ReadMnist(full, labels, options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 3);

  options.max_examples = -1;
  data = ReadMnist(full, labels, options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("max_examples must be >= 0"));
}

TEST(ReadMnistTest, WrongMagicNamesFileOffsetAndBothNumbers) {
  const std::string labels = WritePlain("magic_labels", LabelFile(3, kTinyLabels));
  // The label file given as the image file.
  absl::StatusOr<Dataset> data = ReadMnist(labels, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(labels), HasSubstr("wrong magic number 0x00000801 at offset 0"),
                    HasSubstr("idx1 label file"), HasSubstr("expected 0x00000803")));

  const std::string images = WritePlain("magic_images", ImageFile(3, 2, 3, TinyPixels()));
  data = ReadMnist(images, images);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(images), HasSubstr("wrong magic number 0x00000803 at offset 0"),
                    HasSubstr("expected 0x00000801")));
}

TEST(ReadMnistTest, GarbageThatIsNotGzipIsAWrongMagic) {
  const std::string garbage = WritePlain("garbage", "hello, this is not an idx file at all");
  const std::string labels = WritePlain("garbage_labels", LabelFile(3, kTinyLabels));
  absl::StatusOr<Dataset> data = ReadMnist(garbage, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(garbage), HasSubstr("wrong magic number 0x68656c6c at offset 0")));
}

TEST(ReadMnistTest, GzipMagicFollowedByGarbageIsACorruptGzipStream) {
  const std::string bad = WritePlain("bad_gzip", "\x1f\x8bthis is not deflate data");
  const std::string labels = WritePlain("bad_gzip_labels", LabelFile(3, kTinyLabels));
  absl::StatusOr<Dataset> data = ReadMnist(bad, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(bad), HasSubstr("corrupt gzip stream at offset 0 (decompressed)")));
}

TEST(ReadMnistTest, TruncatedHeaderNamesWhereTheFileEnds) {
  const std::string labels = WritePlain("th_labels", LabelFile(3, kTinyLabels));
  const std::string full = ImageFile(3, 2, 3, TinyPixels());
  for (const size_t length : {size_t{0}, size_t{2}}) {
    // Before the magic number says how many dimensions follow.
    const std::string images = WritePlain("th_images", full.substr(0, length));
    absl::StatusOr<Dataset> data = ReadMnist(images, labels);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(data.status().message(),
                AllOf(HasSubstr(images),
                      HasSubstr(absl::StrCat("truncated header: the file ends at offset ", length,
                                             " of the 16-byte idx3 (or 20-byte idx4) image file "
                                             "header"))));
  }
  {
    const std::string images = WritePlain("th_images", full.substr(0, 10));
    absl::StatusOr<Dataset> data = ReadMnist(images, labels);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(data.status().message(),
                AllOf(HasSubstr(images), HasSubstr("truncated header: the file ends at offset 10 "
                                                   "of the 16-byte idx3 image file header")));
    const std::string images4 =
        WritePlain("th_images4", ImageFile4(3, 2, 3, 1, TinyPixels()).substr(0, 18));
    data = ReadMnist(images4, labels);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(data.status().message(),
                AllOf(HasSubstr(images4), HasSubstr("truncated header: the file ends at offset 18 "
                                                    "of the 20-byte idx4 image file header")));
  }
  const std::string short_labels = WritePlain("th_short_labels", LabelFile(3, "").substr(0, 6));
  const std::string images = WritePlain("th_full_images", full);
  absl::StatusOr<Dataset> data = ReadMnist(images, short_labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(short_labels),
                    HasSubstr("ends at offset 6 of the 8-byte idx1 label file header")));
}

TEST(ReadMnistTest, TruncatedPixelsNameOffsetAndExpectedSize) {
  // 3 images of 2x3: the file should end at 16 + 18 = 34.
  const std::string labels = WritePlain("tp_labels", LabelFile(3, kTinyLabels));
  const std::string cut = ImageFile(3, 2, 3, TinyPixels().substr(0, 10));
  const std::string plain = WritePlain("tp_images", cut);
  absl::StatusOr<Dataset> data = ReadMnist(plain, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(plain), HasSubstr("truncated pixel data: the file ends at offset "
                                                "26 of expected 34 bytes")));

  const std::string gz = WriteGzip("tp_images.gz", cut);
  data = ReadMnist(gz, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(gz), HasSubstr("truncated pixel data: the file ends at offset 26 "
                                             "(decompressed) of expected 34 bytes")));
}

TEST(ReadMnistTest, TruncatedLabelsNameOffsetAndExpectedSize) {
  const std::string images = WritePlain("tl_images", ImageFile(3, 2, 3, TinyPixels()));
  const std::string labels = WritePlain("tl_labels", LabelFile(3, kTinyLabels.substr(0, 1)));
  absl::StatusOr<Dataset> data = ReadMnist(images, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(labels),
                    HasSubstr("truncated label data: the file ends at offset 9 of expected 11")));
}

TEST(ReadMnistTest, CutGzipStreamIsTruncation) {
  const std::string labels = WritePlain("cut_labels", LabelFile(3, kTinyLabels));
  const std::string compressed = Gzip(ImageFile(3, 2, 3, TinyPixels()));

  // Cut in the middle of the deflate data.
  const std::string half = WritePlain("cut_half.gz", compressed.substr(0, compressed.size() / 2));
  absl::StatusOr<Dataset> data = ReadMnist(half, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(half), HasSubstr("truncated"), HasSubstr("(decompressed)"),
                    HasSubstr("the gzip stream is cut short")));

  // Only the 8-byte trailer (CRC and length) missing: the data is all there, but unchecked.
  const std::string no_trailer =
      WritePlain("cut_trailer.gz", compressed.substr(0, compressed.size() - 8));
  data = ReadMnist(no_trailer, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(no_trailer), HasSubstr("truncated gzip stream"),
                    HasSubstr("after offset 34 (decompressed)")));

  // A flipped bit in the CRC.
  std::string bad_crc = compressed;
  bad_crc[bad_crc.size() - 8] ^= 1;
  const std::string crc = WritePlain("cut_crc.gz", bad_crc);
  data = ReadMnist(crc, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), AllOf(HasSubstr(crc), HasSubstr("corrupt gzip stream")));
}

TEST(ReadMnistTest, CountMismatchNamesBothFilesAndCounts) {
  const std::string images = WritePlain("cm_images", ImageFile(3, 2, 3, TinyPixels()));
  const std::string labels = WritePlain("cm_labels", LabelFile(2, kTinyLabels.substr(0, 2)));
  absl::StatusOr<Dataset> data = ReadMnist(images, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              HasSubstr(absl::StrCat("image count 3 in ", images,
                                     " (offset 4) does not match label count 2 in ", labels,
                                     " (offset 4)")));
}

TEST(ReadMnistTest, TrailingBytesAreAnError) {
  const std::string images = WritePlain("tb_images", ImageFile(3, 2, 3, TinyPixels() + "x"));
  const std::string labels = WritePlain("tb_labels", LabelFile(3, kTinyLabels));
  absl::StatusOr<Dataset> data = ReadMnist(images, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(images), HasSubstr("unexpected data after offset 34"),
                    HasSubstr("3 images of 2x3")));
}

TEST(ReadMnistTest, LabelOutsideTheClassesIsAnError) {
  const std::string images = WritePlain("lo_images", ImageFile(3, 2, 3, TinyPixels()));
  const std::string labels = WritePlain("lo_labels", LabelFile(3, {9, 10, 4}));
  absl::StatusOr<Dataset> data = ReadMnist(images, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(labels), HasSubstr("label 10 at offset 9 is not a class")));
}

TEST(ReadMnistTest, EmptyImageSizeIsAnError) {
  const std::string images = WritePlain("ez_images", ImageFile(3, 0, 3, ""));
  const std::string labels = WritePlain("ez_labels", LabelFile(3, kTinyLabels));
  absl::StatusOr<Dataset> data = ReadMnist(images, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(images), HasSubstr("image size 0x3 at offset 8 is empty")));
}

TEST(ReadMnistTest, MissingFileIsNotFound) {
  const std::string labels = WritePlain("nf_labels", LabelFile(3, kTinyLabels));
  const std::string missing = TempPath("does_not_exist");
  absl::StatusOr<Dataset> data = ReadMnist(missing, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr(missing));
}

TEST(ReadMnistTest, ReadsFourDimensionalImagesInTheFilesOrder) {
  // Two 2x2 images of 3 channels: the bytes are (row, column, channel) with channels fastest,
  // so image i's feature (y * 2 + x) * 3 + c is byte 12 i + (y * 2 + x) * 3 + c.
  std::string pixels;
  for (int i = 0; i < 2; ++i) {
    for (int y = 0; y < 2; ++y) {
      for (int x = 0; x < 2; ++x) {
        for (int c = 0; c < 3; ++c)
          pixels.push_back(static_cast<char>(100 * i + 10 * y + 5 * x + c));
      }
    }
  }
  const std::string images = WriteGzip("rgb_images", ImageFile4(2, 2, 2, 3, pixels));
  const std::string labels = WritePlain("rgb_labels", LabelFile(2, {3, 8}));
  absl::StatusOr<Dataset> data = ReadMnist(images, labels);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 2);
  EXPECT_EQ(data->dense_dim, 12);
  ASSERT_TRUE(data->image.has_value());
  EXPECT_EQ(*data->image, (ImageLayout{2, 2, 3}));
  EXPECT_EQ(data->dense, Scaled(pixels));
  // Image 1, row 1, column 0, channel 2: 100 + 10 + 0 + 2.
  EXPECT_EQ(data->dense[12 + (1 * 2 + 0) * 3 + 2], 112 / 255.0f);
  EXPECT_THAT(data->labels, ElementsAre(3, 8));
  EXPECT_TRUE(ValidateDataset(*data).ok());

  // A single channel in 4 dimensions reads as the 3-dimensional file does.
  const std::string gray = WritePlain("gray4_images", ImageFile4(3, 2, 3, 1, TinyPixels()));
  const std::string tiny_labels = WritePlain("gray4_labels", LabelFile(3, kTinyLabels));
  data = ReadMnist(gray, tiny_labels);
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectTinyDataset(*data);
}

TEST(ReadMnistTest, FourDimensionalErrorsNameTheImageSize) {
  const std::string labels = WritePlain("rgb_err_labels", LabelFile(2, {3, 8}));
  const std::string truncated =
      WritePlain("rgb_cut_images", ImageFile4(2, 2, 2, 3, std::string(20, 'x')));
  absl::StatusOr<Dataset> data = ReadMnist(truncated, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(truncated), HasSubstr("truncated pixel data: the file ends at "
                                                    "offset 40 of expected 44 bytes")));

  const std::string extra =
      WritePlain("rgb_extra_images", ImageFile4(2, 2, 2, 3, std::string(25, 'x')));
  data = ReadMnist(extra, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(extra), HasSubstr("unexpected data after offset 44"),
                    HasSubstr("2 images of 2x2x3")));

  const std::string no_channels = WritePlain("rgb_zero_images", ImageFile4(2, 2, 2, 0, ""));
  data = ReadMnist(no_channels, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(no_channels), HasSubstr("image size 2x2x0 at offset 8 is empty")));

  const std::string huge = WritePlain("rgb_huge_images", ImageFile4(1, 65536, 65536, 65536, ""));
  data = ReadMnist(huge, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(huge), HasSubstr("image size 65536x65536x65536 at offset 8 is too "
                                               "large")));
}

TEST(ReadMnistTest, WrongTypeByteOrDimensionCountSaysWhatWasExpected) {
  const std::string labels = WritePlain("wt_labels", LabelFile(1, {0}));
  // Floats (type byte 0x0d) in 3 dimensions.
  const std::string floats =
      WritePlain("wt_float_images", BigEndian32(0x00000d03) + BigEndian32(1) + BigEndian32(1) +
                                        BigEndian32(1) + std::string(4, '\0'));
  absl::StatusOr<Dataset> data = ReadMnist(floats, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(floats),
                    HasSubstr("wrong magic number 0x00000d03 at offset 0: "
                              "type byte 0x0d (float) at offset 2, expected "
                              "0x08 (unsigned byte)"),
                    HasSubstr("expected 0x00000803"), HasSubstr("or 0x00000804")));

  // Unsigned bytes in 5 dimensions.
  const std::string five =
      WritePlain("wt_five_images", BigEndian32(0x00000805) + std::string(20, '\1') + "x");
  data = ReadMnist(five, labels);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(five), HasSubstr("wrong magic number 0x00000805 at offset 0: 5 "
                                               "dimensions (byte at offset 3), expected 3 (N, "
                                               "rows, columns) or 4 (N, rows, columns, "
                                               "channels)")));

  // A 3-dimensional file given as the labels.
  const std::string images = WritePlain("wt_images", ImageFile(1, 1, 1, std::string(1, '\0')));
  data = ReadMnist(images, images);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(images), HasSubstr("3 dimensions (byte at offset 3, that of an "
                                                 "idx3 image file), expected 1 (N)")));
}

TEST(ReadMnistDirTest, FindsGzipAndPlainStandardNames) {
  const std::string dir = TempPath("dir");
  ASSERT_EQ(mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST, true);
  auto write = [&dir](const std::string& name, const std::string& contents, bool gzip) {
    const std::string path = absl::StrCat(dir, "/", name);
    const std::string bytes = gzip ? Gzip(contents) : contents;
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
  };
  write("train-images-idx3-ubyte.gz", ImageFile(3, 2, 3, TinyPixels()), true);
  write("train-labels-idx1-ubyte", LabelFile(3, kTinyLabels), false);
  absl::StatusOr<Dataset> data = ReadMnistDir(dir, /*train=*/true);
  ASSERT_TRUE(data.ok()) << data.status();
  ExpectTinyDataset(*data);

  data = ReadMnistDir(dir, /*train=*/false);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(),
              HasSubstr(absl::StrCat("neither ", dir, "/t10k-images-idx3-ubyte.gz nor ", dir,
                                     "/t10k-images-idx3-ubyte exists")));
}

constexpr char kFashionMnistDir[] = "/usr/share/datasets/fashion-mnist";

TEST(FashionMnistTest, ReadsTheRealTestSet) {
  struct stat st;
  ASSERT_EQ(stat(kFashionMnistDir, &st), 0)
      << "Fashion-MNIST is not installed at " << kFashionMnistDir
      << " (tools/setup.sh installs Debian's dataset-fashion-mnist)";
  absl::StatusOr<Dataset> data = ReadMnistDir(kFashionMnistDir, /*train=*/false);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 10000);
  EXPECT_EQ(data->dense_dim, 28 * 28);
  EXPECT_EQ(data->num_classes, 10);
  ASSERT_TRUE(ValidateDataset(*data).ok());
  float lowest = 1, highest = 0;
  for (const float p : data->dense) {
    lowest = std::min(lowest, p);
    highest = std::max(highest, p);
  }
  EXPECT_EQ(lowest, 0.0f);
  EXPECT_EQ(highest, 1.0f);
  // Checked against the file with zcat | xxd: the first label is 9 (ankle boot), the first
  // image's pixel bytes sum to 33456, and each class has 1000 examples.
  EXPECT_EQ(data->labels[0], 9.0f);
  EXPECT_EQ(data->labels[1], 2.0f);
  double first_image_sum = 0;
  for (int i = 0; i < 28 * 28; ++i) first_image_sum += data->dense[i] * 255.0;
  EXPECT_NEAR(first_image_sum, 33456, 0.5);
  std::vector<int> per_class(10, 0);
  for (const float label : data->labels) ++per_class[static_cast<int>(label)];
  for (const int count : per_class) EXPECT_EQ(count, 1000);
}

TEST(FashionMnistTest, ReadsAPrefixOfTheTrainingSet) {
  struct stat st;
  ASSERT_EQ(stat(kFashionMnistDir, &st), 0)
      << "Fashion-MNIST is not installed at " << kFashionMnistDir
      << " (tools/setup.sh installs Debian's dataset-fashion-mnist)";
  MnistOptions options;
  options.max_examples = 5;
  absl::StatusOr<Dataset> data = ReadMnistDir(kFashionMnistDir, /*train=*/true, options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 5);
  EXPECT_THAT(data->labels, ElementsAre(9, 0, 0, 3, 0));
}

}  // namespace
}  // namespace pscluster
