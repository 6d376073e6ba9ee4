#include "model/data/cifar10.h"

#include <sys/stat.h>
#include <zlib.h>

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

// The pixel byte of record `seed` at (y, x, channel c): distinct enough that a wrong layout
// shows.
unsigned char Pixel(int seed, int y, int x, int c) {
  return static_cast<unsigned char>((seed * 31 + y * 7 + x * 3 + c * 101) % 256);
}

// One CIFAR-10 record as the binary version lays it out: the label, then the red plane, the
// green plane and the blue plane, each 32x32 row-major.
std::string Record(int label, int seed) {
  std::string record(1, static_cast<char>(label));
  for (int c = 0; c < 3; ++c) {
    for (int y = 0; y < 32; ++y) {
      for (int x = 0; x < 32; ++x) record.push_back(static_cast<char>(Pixel(seed, y, x, c)));
    }
  }
  return record;
}

// The floats the reader should give for Record(_, seed): height x width x channels.
std::vector<float> ExpectedImage(int seed) {
  std::vector<float> out;
  for (int y = 0; y < 32; ++y) {
    for (int x = 0; x < 32; ++x) {
      for (int c = 0; c < 3; ++c) out.push_back(Pixel(seed, y, x, c) / 255.0f);
    }
  }
  return out;
}

std::string TempDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/cifar10_test_", name);
  EXPECT_TRUE(mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) << dir;
  return dir;
}

std::string Write(const std::string& path, const std::string& contents, bool gzip = false) {
  if (gzip) {
    gzFile gz = gzopen(path.c_str(), "wb");
    EXPECT_NE(gz, nullptr) << path;
    EXPECT_EQ(gzwrite(gz, contents.data(), contents.size()), static_cast<int>(contents.size()));
    EXPECT_EQ(gzclose(gz), Z_OK);
    return path;
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  std::fwrite(contents.data(), 1, contents.size(), f);
  std::fclose(f);
  return path;
}

// A folder in the layout of cifar-10-batches-bin: data_batch_b.bin holds records with labels
// b - 1 and b (seeds 10 b and 10 b + 1), data_batch_3.bin gzipped (as .bin.gz), test_batch.bin
// three records.
std::string WriteBatches(const std::string& name) {
  const std::string dir = TempDir(name);
  for (int b = 1; b <= 5; ++b) {
    const bool gzip = b == 3;
    Write(absl::StrCat(dir, "/data_batch_", b, ".bin", gzip ? ".gz" : ""),
          Record(b - 1, 10 * b) + Record(b, 10 * b + 1), gzip);
  }
  Write(dir + "/test_batch.bin", Record(9, 1) + Record(0, 2) + Record(7, 3));
  return dir;
}

TEST(ReadCifar10Test, ReadsTheBatchesInOrderAsHeightWidthChannels) {
  const std::string dir = WriteBatches("layout");
  absl::StatusOr<Dataset> train = ReadCifar10Dir(dir, /*train=*/true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->num_examples, 10);
  EXPECT_EQ(train->dense_dim, 3072);
  EXPECT_EQ(train->num_classes, 10);
  ASSERT_TRUE(train->image.has_value());
  EXPECT_EQ(*train->image, (ImageLayout{32, 32, 3}));
  EXPECT_THAT(train->labels, ElementsAre(0, 1, 1, 2, 2, 3, 3, 4, 4, 5));
  EXPECT_FALSE(train->has_sparse());
  EXPECT_TRUE(ValidateDataset(*train).ok());
  for (int b = 1; b <= 5; ++b) {
    for (int r = 0; r < 2; ++r) {
      const int example = 2 * (b - 1) + r;
      const std::vector<float> got(train->dense.begin() + example * 3072,
                                   train->dense.begin() + (example + 1) * 3072);
      EXPECT_EQ(got, ExpectedImage(10 * b + r)) << "example " << example;
    }
  }
  // Spot checks against the file layout: feature (y * 32 + x) * 3 + c is byte
  // 1 + c * 1024 + y * 32 + x of the record.
  const std::string record = Record(0, 10);
  EXPECT_EQ(train->dense[(5 * 32 + 7) * 3 + 2],
            static_cast<unsigned char>(record[1 + 2 * 1024 + 5 * 32 + 7]) / 255.0f);
  EXPECT_EQ(train->dense[1], static_cast<unsigned char>(record[1 + 1024]) / 255.0f);

  absl::StatusOr<Dataset> test = ReadCifar10Dir(dir, /*train=*/false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->num_examples, 3);
  EXPECT_THAT(test->labels, ElementsAre(9, 0, 7));
  EXPECT_EQ(std::vector<float>(test->dense.begin() + 2 * 3072, test->dense.end()),
            ExpectedImage(3));
}

TEST(ReadCifar10Test, MaxExamplesReadsAPrefix) {
  const std::string dir = WriteBatches("prefix");
  Cifar10Options options;
  options.max_examples = 3;
  absl::StatusOr<Dataset> data = ReadCifar10Dir(dir, /*train=*/true, options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 3);
  EXPECT_EQ(data->dense.size(), 3u * 3072);
  EXPECT_THAT(data->labels, ElementsAre(0, 1, 1));

  options.max_examples = 100;
  data = ReadCifar10Dir(dir, /*train=*/true, options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 10);

  options.max_examples = -1;
  data = ReadCifar10Dir(dir, /*train=*/true, options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("max_examples must be >= 0"));
}

TEST(ReadCifar10Test, MissingBatchIsNotFoundNamingBothNames) {
  const std::string dir = WriteBatches("missing");
  ASSERT_EQ(std::remove((dir + "/data_batch_4.bin").c_str()), 0);
  absl::StatusOr<Dataset> data = ReadCifar10Dir(dir, /*train=*/true);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(),
              HasSubstr(absl::StrCat("neither ", dir, "/data_batch_4.bin.gz nor ", dir,
                                     "/data_batch_4.bin exists")));

  const std::string empty_dir = TempDir("no_test");
  data = ReadCifar10Dir(empty_dir, /*train=*/false);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr(empty_dir + "/test_batch.bin exists"));

  const std::string missing = empty_dir + "/nothing.bin";
  data = ReadCifar10({missing});
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr("cannot open " + missing));
}

TEST(ReadCifar10Test, SizeNotAMultipleOfTheRecordIsAnError) {
  const std::string dir = TempDir("size");
  const std::string plain =
      Write(dir + "/cut.bin", Record(1, 1) + Record(2, 2) + Record(3, 3).substr(0, 100));
  absl::StatusOr<Dataset> data = ReadCifar10({plain});
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(plain), HasSubstr("the file ends at offset 6246, 100 bytes into "
                                                "record 2: its size is not a multiple of the "
                                                "3073-byte CIFAR-10 record")));

  const std::string gz =
      Write(dir + "/cut.bin.gz", Record(1, 1) + Record(2, 2).substr(0, 3072), /*gzip=*/true);
  data = ReadCifar10({gz});
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(gz), HasSubstr("the file ends at offset 6145 (decompressed), 3072 "
                                             "bytes into record 1: its size is not a multiple")));

  const std::string empty = Write(dir + "/empty.bin", "");
  data = ReadCifar10({Write(dir + "/one.bin", Record(4, 4)), empty});
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(empty), HasSubstr("the file is empty, expected 3073-byte CIFAR-10 "
                                                "records")));
}

TEST(ReadCifar10Test, LabelAboveNineIsAnError) {
  const std::string dir = TempDir("label");
  const std::string path = Write(dir + "/bad_label.bin", Record(9, 1) + Record(10, 2));
  absl::StatusOr<Dataset> data = ReadCifar10({path});
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(path),
                    HasSubstr("label 10 of record 1 at offset 3073 is not a class in [0, 10)")));

  const std::string gz = Write(dir + "/bad_label.bin.gz", Record(255, 1), /*gzip=*/true);
  data = ReadCifar10({gz});
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(gz), HasSubstr("label 255 of record 0 at offset 0 (decompressed)")));
}

TEST(ReadCifar10Test, CutGzipStreamIsAnError) {
  const std::string dir = TempDir("cut_gzip");
  const std::string whole = Write(dir + "/whole.bin.gz", Record(1, 1) + Record(2, 2), true);
  std::string compressed;
  {
    std::FILE* f = std::fopen(whole.c_str(), "rb");
    ASSERT_NE(f, nullptr);
    char buffer[4096];
    size_t got;
    while ((got = std::fread(buffer, 1, sizeof(buffer), f)) > 0) compressed.append(buffer, got);
    std::fclose(f);
  }
  // Only the 8-byte trailer missing: every record is there, but unchecked.
  const std::string no_trailer =
      Write(dir + "/no_trailer.bin.gz", compressed.substr(0, compressed.size() - 8));
  absl::StatusOr<Dataset> data = ReadCifar10({no_trailer});
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(no_trailer), HasSubstr("truncated gzip stream")));
}

}  // namespace
}  // namespace pscluster
