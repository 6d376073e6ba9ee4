#include "model/data/libsvm.h"

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

std::string WriteFile(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/libsvm_test_", name);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  std::fwrite(contents.data(), 1, contents.size(), f);
  std::fclose(f);
  return path;
}

TEST(ReadLibsvmTest, SplitsDenseAndSparseByIndex) {
  const std::string path = WriteFile("mixed.svm",
                                     "1 0:0.5 2:-1.25 3:1 17:1\n"
                                     "# a comment line\n"
                                     "\n"
                                     "-1 1:2e-1 5:1.0   # trailing comment\n"
                                     "+1\r\n"
                                     "0\t0:3\t4:1\n");
  absl::StatusOr<Dataset> data = ReadLibsvm(path, /*dense_dim=*/3);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 4);
  EXPECT_EQ(data->dense_dim, 3);
  EXPECT_EQ(data->num_classes, 0);
  EXPECT_THAT(data->dense, ElementsAre(0.5f, 0, -1.25f,  //
                                       0, 0.2f, 0,       //
                                       0, 0, 0,          //
                                       3, 0, 0));
  EXPECT_THAT(data->sparse_offsets, ElementsAre(0, 2, 3, 3, 4));
  EXPECT_THAT(data->sparse_ids, ElementsAre(3, 17, 5, 4));
  EXPECT_THAT(data->labels, ElementsAre(1, 0, 1, 0));
  EXPECT_TRUE(ValidateDataset(*data).ok());
}

TEST(ReadLibsvmTest, AllDenseFileHasNoSparseFeatures) {
  const std::string path = WriteFile("dense.svm", "1 0:1 1:2\n0 1:3");
  absl::StatusOr<Dataset> data = ReadLibsvm(path, 2);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 2);
  EXPECT_FALSE(data->has_sparse());
  EXPECT_THAT(data->dense, ElementsAre(1, 2, 0, 3));
}

TEST(ReadLibsvmTest, EmptyFileIsAnEmptyDataset) {
  absl::StatusOr<Dataset> data = ReadLibsvm(WriteFile("empty.svm", ""), 4);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 0);
  EXPECT_TRUE(ValidateDataset(*data).ok());
}

struct BadLine {
  std::string line;
  std::string message;
};

TEST(ReadLibsvmTest, ErrorsNameFileLineAndToken) {
  const BadLine cases[] = {
      {"2 0:1", ":3: bad label '2': expected 0, 1, -1 or +1"},
      {"yes 0:1", ":3: bad label 'yes'"},
      {"1 0:1 7", ":3: bad feature '7': expected <index>:<value>"},
      {"1 a:1", ":3: bad feature 'a:1': the index is not a non-negative integer"},
      {"1 -2:1", ":3: bad feature '-2:1': the index is not a non-negative integer"},
      {"1 0:abc", ":3: bad feature '0:abc': the value is not a finite number"},
      {"1 0:", ":3: bad feature '0:': the value is not a finite number"},
      {"1 0:nan", ":3: bad feature '0:nan': the value is not a finite number"},
      {"1 2:1 1:1",
       ":3: bad feature '1:1': indices must increase strictly along a line; the "
       "previous was 2"},
      {"1 1:1 1:2", ":3: bad feature '1:2': indices must increase"},
      {"1 9:0.5",
       ":3: bad feature '9:0.5': index >= dense_dim (4) makes it a sparse id, whose "
       "value must be 1"},
  };
  for (const BadLine& c : cases) {
    const std::string path = WriteFile("bad.svm", "1 0:1\n\n" + c.line + "\n0 1:1\n");
    absl::StatusOr<Dataset> data = ReadLibsvm(path, 4);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << c.line;
    EXPECT_THAT(data.status().message(), HasSubstr(path + c.message)) << c.line;
  }
}

TEST(ReadLibsvmTest, BadArgumentsAndMissingFile) {
  absl::StatusOr<Dataset> data = ReadLibsvm(WriteFile("ok.svm", "1 0:1\n"), -1);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("dense_dim must be >= 0, got -1"));

  const std::string missing = absl::StrCat(::testing::TempDir(), "/libsvm_test_missing.svm");
  data = ReadLibsvm(missing, 1);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), AllOf(HasSubstr("cannot open"), HasSubstr(missing)));
}

}  // namespace
}  // namespace pscluster
