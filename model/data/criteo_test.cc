#include "model/data/criteo.h"

#include <zlib.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/data/feature_hash.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::FloatEq;
using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/criteo_test_", name);
}

std::string Write(const std::string& name, const std::string& contents) {
  const std::string path = TempPath(name);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  std::fwrite(contents.data(), 1, contents.size(), f);
  std::fclose(f);
  return path;
}

std::string WriteGzip(const std::string& name, const std::string& contents) {
  const std::string path = TempPath(name);
  gzFile gz = gzopen(path.c_str(), "wb");
  EXPECT_NE(gz, nullptr) << path;
  EXPECT_EQ(gzwrite(gz, contents.data(), contents.size()), static_cast<int>(contents.size()));
  EXPECT_EQ(gzclose(gz), Z_OK);
  return path;
}

// A line of `label`, then the integer and categorical fields.
std::string Line(const std::string& label, const std::vector<std::string>& ints,
                 const std::vector<std::string>& cats) {
  return absl::StrCat(label, "\t", absl::StrJoin(ints, "\t"), "\t", absl::StrJoin(cats, "\t"),
                      "\n");
}

CriteoOptions Small(int64_t hash_buckets = 0) {
  CriteoOptions options;
  options.num_int = 2;
  options.num_cat = 3;
  options.hash_buckets = hash_buckets;
  return options;
}

// Two lines in the layout of Small(): empty, negative and large counts, an empty categorical.
const std::string& TwoLines() {
  static const std::string* text =
      new std::string(Line("1", {"3", ""}, {"68fd1e64", "80e26c9b", ""}) +
                      Line("0", {"-1", "1000000"}, {"05db9164", "68fd1e64", "fb936136"}));
  return *text;
}

TEST(CriteoDenseValueTest, IsLog1pOfTheCountClippedAtZero) {
  EXPECT_EQ(CriteoDenseValue(0), 0.0f);
  EXPECT_EQ(CriteoDenseValue(-2), 0.0f);
  EXPECT_THAT(CriteoDenseValue(1), FloatEq(std::log(2.0f)));
  EXPECT_THAT(CriteoDenseValue(1000000), FloatEq(static_cast<float>(std::log1p(1e6))));
}

TEST(ReadCriteoTest, TransformsCountsAndHashesCategoricals) {
  auto data = ReadCriteo(Write("two", TwoLines()), Small());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 2);
  EXPECT_EQ(data->dense_dim, 2);
  EXPECT_EQ(data->num_classes, 0);
  EXPECT_THAT(data->labels, ElementsAre(1.0f, 0.0f));
  EXPECT_THAT(data->dense, ElementsAre(FloatEq(std::log(4.0f)), 0.0f, 0.0f,
                                       FloatEq(static_cast<float>(std::log1p(1e6)))));
  EXPECT_THAT(data->sparse_offsets, ElementsAre(0, 2, 5));
  EXPECT_THAT(data->sparse_ids,
              ElementsAre(CategoricalId(0, "68fd1e64", 0), CategoricalId(1, "80e26c9b", 0),
                          CategoricalId(0, "05db9164", 0), CategoricalId(1, "68fd1e64", 0),
                          CategoricalId(2, "fb936136", 0)));
  EXPECT_TRUE(ValidateDataset(*data).ok()) << ValidateDataset(*data);
}

TEST(ReadCriteoTest, HashBucketsGiveEachFieldItsOwnIdRange) {
  auto data = ReadCriteo(Write("buckets", TwoLines()), Small(100));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_THAT(data->sparse_offsets, ElementsAre(0, 2, 5));
  const std::vector<int> fields = {0, 1, 0, 1, 2};
  for (size_t k = 0; k < fields.size(); ++k) {
    EXPECT_GE(data->sparse_ids[k], fields[k] * 100) << k;
    EXPECT_LT(data->sparse_ids[k], (fields[k] + 1) * 100) << k;
  }
  EXPECT_EQ(data->sparse_ids[0], CategoricalId(0, "68fd1e64", 100));
}

TEST(ReadCriteoTest, WindowsLineEndsGzipAndEmptyLinesReadTheSame) {
  auto plain = ReadCriteo(Write("plain", TwoLines()), Small());
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::string crlf;
  for (char c : TwoLines()) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  for (const std::string& path :
       {Write("crlf", crlf), Write("blank", "\n" + TwoLines() + "\r\n\n"),
        WriteGzip("gzip.gz", TwoLines()), WriteGzip("gzip_named_txt", crlf),
        // No line end after the last line.
        Write("no_final_newline", TwoLines().substr(0, TwoLines().size() - 1))}) {
    auto data = ReadCriteo(path, Small());
    ASSERT_TRUE(data.ok()) << path << ": " << data.status();
    EXPECT_EQ(data->labels, plain->labels) << path;
    EXPECT_EQ(data->dense, plain->dense) << path;
    EXPECT_EQ(data->sparse_offsets, plain->sparse_offsets) << path;
    EXPECT_EQ(data->sparse_ids, plain->sparse_ids) << path;
  }
}

TEST(ReadCriteoTest, TheDefaultsAreTheCriteoLayout) {
  std::vector<std::string> ints(13, "5"), cats(26, "deadbeef");
  ints[1] = "";
  cats[25] = "";
  auto data = ReadCriteo(Write("full", Line("1", ints, cats)));
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->dense_dim, 13);
  EXPECT_EQ(data->num_examples, 1);
  EXPECT_THAT(data->sparse_offsets, ElementsAre(0, 25));
  EXPECT_EQ(data->dense[1], 0.0f);
  EXPECT_THAT(data->dense[0], FloatEq(std::log(6.0f)));
}

TEST(ReadCriteoTest, MaxExamplesReadsAPrefix) {
  CriteoOptions options = Small();
  options.max_examples = 1;
  // The second line is malformed: a prefix never reads it.
  auto data =
      ReadCriteo(Write("prefix", Line("1", {"1", "2"}, {"a", "b", "c"}) + "junk\n"), options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 1);
  EXPECT_THAT(data->sparse_offsets, ElementsAre(0, 3));
}

TEST(ReadCriteoTest, NoCategoricalFieldsMeansNoSparseFeatures) {
  CriteoOptions options = Small();
  options.num_cat = 0;
  auto data = ReadCriteo(Write("dense_only", "1\t2\t3\n0\t\t\n"), options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 2);
  EXPECT_FALSE(data->has_sparse());
}

TEST(ReadCriteoTest, EmptyFileIsAnEmptyDataset) {
  auto data = ReadCriteo(Write("empty", ""), Small());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 0);
  EXPECT_TRUE(ValidateDataset(*data).ok());
}

struct BadLine {
  std::string contents;
  std::string message;
};

TEST(ReadCriteoTest, ErrorsNameFileLineWhatAndWhatWasExpected) {
  const std::string good = Line("1", {"1", "2"}, {"a", "b", "c"});
  const std::vector<BadLine> cases = {
      {good + "1\t1\t2\ta\tb\n",
       ":2: expected 6 tab-separated columns (label, 2 integer, 3 categorical), got 5 (no label "
       "column?"},
      {good + "1,1,2,a,b,c\n",
       ":2: expected 6 tab-separated columns (label, 2 integer, 3 "
       "categorical), got 1 (the columns must be separated by tabs)"},
      {good + good + "1\t1\t2\ta\tb\tc\td\n", ":3: expected 6 tab-separated columns"},
      {Line("yes", {"1", "2"}, {"a", "b", "c"}), ":1: bad label 'yes': expected 0 or 1"},
      {Line("", {"1", "2"}, {"a", "b", "c"}), ":1: bad label '': expected 0 or 1"},
      {Line("1.0", {"1", "2"}, {"a", "b", "c"}), ":1: bad label '1.0': expected 0 or 1"},
      {Line("0", {"1", "2.5"}, {"a", "b", "c"}),
       ":1: column 3 (I2): bad integer '2.5': expected a decimal integer or nothing"},
      {Line("0", {"x", "2"}, {"a", "b", "c"}), ":1: column 2 (I1): bad integer 'x'"},
      {Line("0", {"99999999999999999999", "2"}, {"a", "b", "c"}),
       ":1: column 2 (I1): bad integer '99999999999999999999'"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = Write(absl::StrCat("bad", i), cases[i].contents);
    auto data = ReadCriteo(path, Small());
    ASSERT_FALSE(data.ok()) << cases[i].contents;
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(data.status().message(), HasSubstr(path + cases[i].message));
  }
}

TEST(ReadCriteoTest, TheDefaultLayoutSaysFortyColumns) {
  const std::string path = Write("short", "1\t2\t3\n");
  auto data = ReadCriteo(path);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(data.status().message(),
              HasSubstr(path + ":1: expected 40 tab-separated columns (label, 13 integer, 26 "
                               "categorical), got 3"));
}

TEST(ReadCriteoTest, CutGzipStreamIsAnError) {
  std::string whole;
  for (int i = 0; i < 200; ++i) whole += TwoLines();
  const std::string gz = WriteGzip("whole.gz", whole);
  std::FILE* f = std::fopen(gz.c_str(), "rb");
  std::string bytes;
  char buffer[4096];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), f)) > 0) bytes.append(buffer, got);
  std::fclose(f);
  // Without its 8-byte trailer: the data may be whole, the stream is not.
  const std::string path = Write("cut.gz", bytes.substr(0, bytes.size() - 8));
  auto data = ReadCriteo(path, Small());
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr(path + ": truncated gzip stream"));
}

TEST(ReadCriteoTest, BadOptionsAndMissingFile) {
  CriteoOptions options = Small();
  options.num_int = -1;
  auto data = ReadCriteo(Write("any", ""), options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("CriteoOptions.num_int is -1, expected >= 0"));

  options = Small(int64_t{1} << 62);
  data = ReadCriteo(Write("any", ""), options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(), HasSubstr("num_cat * hash_buckets fits in int64"));

  const std::string missing = TempPath("no_such_file");
  data = ReadCriteo(missing, Small());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr(missing));
}

}  // namespace
}  // namespace pscluster
