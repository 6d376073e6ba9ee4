#include "model/input.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Write(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/input_test_", name);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  std::fwrite(contents.data(), 1, contents.size(), f);
  std::fclose(f);
  return path;
}

// Criteo layout with 2 integer and 1 categorical column.
v1::DataConfig SmallCriteo() {
  v1::DataConfig config;
  config.set_kind(v1::DataConfig::CRITEO);
  config.set_path(Write("criteo_train", "1\t1\t2\ta\n0\t3\t\tb\n1\t\t\t\n"));
  config.set_test_path(Write("criteo_test", "0\t5\t6\tc\n"));
  config.set_criteo_int_columns(2);
  config.set_criteo_cat_columns(1);
  return config;
}

TEST(LoadDatasetTest, CriteoReadsPathForTrainingAndTestPathForTesting) {
  v1::DataConfig config = SmallCriteo();
  auto train = LoadDataset(config, 2, /*train=*/true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->num_examples, 3);
  EXPECT_EQ(train->dense_dim, 2);
  EXPECT_THAT(train->sparse_offsets, ElementsAre(0, 1, 2, 2));
  auto test = LoadDataset(config, 2, /*train=*/false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->num_examples, 1);

  config.set_max_train_examples(2);
  config.set_hash_buckets(7);
  train = LoadDataset(config, 2, /*train=*/true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->num_examples, 2);
  for (int64_t id : train->sparse_ids) EXPECT_LT(id, 7);
}

TEST(LoadDatasetTest, CriteoDefaultsToThirteenIntegerColumns) {
  v1::DataConfig config;
  config.set_kind(v1::DataConfig::CRITEO);
  EXPECT_TRUE(CheckDataConfig(config, 13).ok());
  absl::Status s = CheckDataConfig(config, 10);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("CRITEO data has 13 integer columns (dense features) but "
                                     "the model's input_dim is 10"));
  auto data = LoadDataset(SmallCriteo(), 3, true);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("input_dim is 3"));
}

TEST(LoadDatasetTest, CriteoErrorsNameTheFile) {
  v1::DataConfig config = SmallCriteo();
  config.set_path(Write("criteo_bad", "1\t1\t2\ta\n2\t3\t4\tb\n"));
  auto data = LoadDataset(config, 2, true);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr(config.path() + ":2: bad label '2'"));
}

v1::DataConfig SmallCsv() {
  v1::DataConfig config;
  config.set_kind(v1::DataConfig::CSV);
  config.set_path(Write("csv_train", "y|x|n|c\n1|0.5|3|p\n0|1.5||\n"));
  config.set_test_path(Write("csv_test", "y|x|n|c\n0|2|4|q\n"));
  auto columns = CsvColumnsFromSpec("y:label,x:float,n:int:0,c:string:");
  EXPECT_TRUE(columns.ok()) << columns.status();
  for (const v1::CsvColumn& c : *columns) *config.add_csv_columns() = c;
  config.set_csv_header(true);
  config.set_csv_delimiter("|");
  return config;
}

TEST(LoadDatasetTest, CsvReadsTheColumnsTheConfigDeclares) {
  const v1::DataConfig config = SmallCsv();
  auto train = LoadDataset(config, 2, true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->num_examples, 2);
  EXPECT_THAT(train->dense, ElementsAre(0.5f, 3.0f, 1.5f, 0.0f));
  EXPECT_THAT(train->labels, ElementsAre(1.0f, 0.0f));
  EXPECT_THAT(train->sparse_offsets, ElementsAre(0, 1, 1));
  auto test = LoadDataset(config, 2, false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ(test->num_examples, 1);
}

TEST(LoadDatasetTest, CsvConfigErrors) {
  v1::DataConfig config = SmallCsv();
  absl::Status s = CheckDataConfig(config, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("CSV data has 2 float and int columns (dense features) but "
                                     "the model's input_dim is 3"));
  config.set_csv_delimiter("||");
  s = CheckDataConfig(config, 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("CSV delimiter '||' is 2 characters, expected one"));
  config = SmallCsv();
  config.mutable_csv_columns(0)->set_type(v1::CsvColumn::FLOAT);
  s = CheckDataConfig(config, 3);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("0 label columns, expected exactly 1"));
}

TEST(CsvColumnsFromSpecTest, FillsTheProtoAndKeepsDefaultPresence) {
  auto columns = CsvColumnsFromSpec("y:label,x:float,c:string:,d:string:na,z:ignore,n:int:-1");
  ASSERT_TRUE(columns.ok()) << columns.status();
  ASSERT_EQ(columns->size(), 6u);
  EXPECT_EQ((*columns)[0].type(), v1::CsvColumn::LABEL);
  EXPECT_FALSE((*columns)[1].has_default_value());
  EXPECT_TRUE((*columns)[2].has_default_value());
  EXPECT_EQ((*columns)[2].default_value(), "");
  EXPECT_EQ((*columns)[3].default_value(), "na");
  EXPECT_EQ((*columns)[4].type(), v1::CsvColumn::IGNORE);
  EXPECT_EQ((*columns)[5].type(), v1::CsvColumn::INT);
  EXPECT_EQ((*columns)[5].default_value(), "-1");

  auto bad = CsvColumnsFromSpec("y:label,x:double");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("entry 2 'x:double': unknown type 'double'"));
}

std::string MakeDir(const std::string& name) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/input_test_", name);
  EXPECT_TRUE(mkdir(dir.c_str(), 0755) == 0 || errno == EEXIST) << dir;
  return dir;
}

// A CIFAR-10 record: the label, then 3072 pixel bytes (the planes R, G, B), every byte `fill`.
std::string CifarRecord(int label, char fill) {
  return std::string(1, static_cast<char>(label)) + std::string(3072, fill);
}

// A folder of CIFAR-10 batches: data_batch_b.bin holds one record of label b, test_batch.bin
// two.
v1::DataConfig SmallCifar10() {
  const std::string dir = MakeDir("cifar10");
  for (int b = 1; b <= 5; ++b) {
    Write(absl::StrCat("cifar10/data_batch_", b, ".bin"), CifarRecord(b, static_cast<char>(b)));
  }
  Write("cifar10/test_batch.bin", CifarRecord(0, 'a') + CifarRecord(9, 'b'));
  v1::DataConfig config;
  config.set_kind(v1::DataConfig::CIFAR10);
  config.set_path(dir);
  return config;
}

v1::ModelConfig ImageModel(int height, int width, int channels) {
  v1::ModelConfig model;
  model.set_input_dim(height * width * channels);
  model.mutable_input_shape()->set_height(height);
  model.mutable_input_shape()->set_width(width);
  model.mutable_input_shape()->set_channels(channels);
  return model;
}

TEST(LoadDatasetTest, Cifar10ReadsTheBatchesForTrainingAndTheTestBatchForTesting) {
  v1::DataConfig config = SmallCifar10();
  auto train = LoadDataset(config, ImageModel(32, 32, 3), /*train=*/true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ(train->num_examples, 5);
  EXPECT_EQ(train->dense_dim, 3072);
  EXPECT_THAT(train->labels, ElementsAre(1, 2, 3, 4, 5));
  EXPECT_EQ(train->dense[3072 * 2 + 5], 3 / 255.0f);
  auto test = LoadDataset(config, 3072, /*train=*/false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_THAT(test->labels, ElementsAre(0, 9));

  config.set_max_train_examples(2);
  config.set_max_test_examples(1);
  train = LoadDataset(config, 3072, /*train=*/true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_THAT(train->labels, ElementsAre(1, 2));
  test = LoadDataset(config, 3072, /*train=*/false);
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_THAT(test->labels, ElementsAre(0));
}

TEST(LoadDatasetTest, Cifar10MustFitTheModel) {
  v1::DataConfig config = SmallCifar10();
  EXPECT_TRUE(CheckDataConfig(config, 3072).ok());
  EXPECT_TRUE(CheckDataConfig(config, ImageModel(32, 32, 3)).ok());

  absl::Status s = CheckDataConfig(config, 784);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("CIFAR-10 gives 3072 features per example (32x32x3); the "
                                     "model's input_dim is 784"));
  auto data = LoadDataset(config, ImageModel(28, 28, 1), /*train=*/true);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("CIFAR-10 gives 3072 features per example "
                                                 "(32x32x3); the model's input_dim is 784"));

  // The same number of features in another layout.
  s = CheckDataConfig(config, ImageModel(3, 32, 32));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("CIFAR-10 gives 32x32x3 images (height x width x "
                                     "channels); the model's input_shape is 3x32x32"));
  data = LoadDataset(config, ImageModel(3, 32, 32), /*train=*/false);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("the model's input_shape is 3x32x32"));

  config.clear_path();
  s = CheckDataConfig(config, 3072);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("CIFAR10 data needs a path"));
}

TEST(LoadDatasetTest, Cifar10FileErrorsNameTheFile) {
  v1::DataConfig config = SmallCifar10();
  const std::string bad = Write("cifar10/data_batch_2.bin", CifarRecord(11, 'x'));
  auto data = LoadDataset(config, 3072, /*train=*/true);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              HasSubstr(bad + ": label 11 of record 0 at offset 0 is not a class in [0, 10)"));
  ASSERT_EQ(std::remove(bad.c_str()), 0);
  data = LoadDataset(config, 3072, /*train=*/true);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr(bad + " exists"));
}

std::string BigEndian32(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

// A folder of idx files of two 2x2 images of 3 channels (idx4), as the training and test sets.
v1::DataConfig SmallColorIdx() {
  const std::string dir = MakeDir("idx4");
  const std::string images = BigEndian32(0x00000804) + BigEndian32(2) + BigEndian32(2) +
                             BigEndian32(2) + BigEndian32(3) + std::string(24, '\x33');
  const std::string labels = BigEndian32(0x00000801) + BigEndian32(2) + std::string{1, 7};
  for (const char* set : {"train", "t10k"}) {
    Write(absl::StrCat("idx4/", set, "-images-idx3-ubyte"), images);
    Write(absl::StrCat("idx4/", set, "-labels-idx1-ubyte"), labels);
  }
  v1::DataConfig config;
  config.set_kind(v1::DataConfig::FASHION_MNIST);
  config.set_path(dir);
  return config;
}

TEST(LoadDatasetTest, IdxImagesWithChannelsMustFitTheModel) {
  const v1::DataConfig config = SmallColorIdx();
  auto data = LoadDataset(config, ImageModel(2, 2, 3), /*train=*/true);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->dense_dim, 12);
  EXPECT_THAT(data->labels, ElementsAre(1, 7));
  EXPECT_TRUE(LoadDataset(config, 12, /*train=*/false).ok());

  data = LoadDataset(config, 784, /*train=*/true);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              HasSubstr(absl::StrCat("the idx data in ", config.path(),
                                     " gives 12 features per example (2x2x3); the model's "
                                     "input_dim is 784")));
  data = LoadDataset(config, ImageModel(2, 3, 2), /*train=*/false);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              AllOf(HasSubstr(config.path()),
                    HasSubstr("gives 2x2x3 images (height x width x channels); the model's "
                              "input_shape is 2x3x2")));
}

}  // namespace
}  // namespace pscluster
