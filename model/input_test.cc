#include "model/input.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

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

}  // namespace
}  // namespace pscluster
