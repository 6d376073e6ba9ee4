#include "model/data/synthetic_criteo.h"

#include <cmath>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/data/criteo.h"
#include "model/data/feature_hash.h"
#include "model/data/metrics.h"

namespace pscluster {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/synthetic_criteo_test_", name);
}

std::string ReadAll(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  EXPECT_NE(f, nullptr) << path;
  std::string text;
  char buffer[1 << 16];
  size_t got;
  while ((got = std::fread(buffer, 1, sizeof(buffer), f)) > 0) text.append(buffer, got);
  std::fclose(f);
  return text;
}

SyntheticCriteoOptions Small() {
  SyntheticCriteoOptions options;
  options.num_examples = 4000;
  options.num_int = 4;
  options.num_cat = 5;
  options.ids_per_field = 50;
  options.id_weight_stddev = 0.6;
  options.seed = 3;
  return options;
}

CriteoOptions ReaderFor(const SyntheticCriteoOptions& options) {
  CriteoOptions read;
  read.num_int = options.num_int;
  read.num_cat = options.num_cat;
  read.hash_buckets = options.hash_buckets;
  return read;
}

// What the generator printed is what a reader of its file measures: the planted model's AUC on
// the examples read back equals the AUC computed while writing them, and is well above chance.
TEST(SyntheticCriteoTest, ThePlantedAucOfTheFileReadBackIsTheOneWritten) {
  for (const int64_t hash_buckets : {int64_t{0}, int64_t{20}}) {
    SyntheticCriteoOptions options = Small();
    options.hash_buckets = hash_buckets;
    const std::string path = TempPath(absl::StrCat("planted", hash_buckets));
    auto summary = WriteSyntheticCriteo(options, path);
    ASSERT_TRUE(summary.ok()) << summary.status();
    EXPECT_EQ(summary->num_examples, 4000);
    auto back = ReadCriteo(path, ReaderFor(options));
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->num_examples, 4000);
    auto model = PlantedCriteoModel::Create(options);
    ASSERT_TRUE(model.ok()) << model.status();
    const double auc = Auc(model->PredictAll(*back), back->labels);
    EXPECT_EQ(auc, summary->planted_auc);
    EXPECT_GT(auc, 0.7) << "hash_buckets " << hash_buckets;
    double positives = 0;
    for (float label : back->labels) positives += label;
    EXPECT_EQ(positives, summary->positives);
    // About 30% clicks with the default bias.
    EXPECT_GT(positives / 4000, 0.15);
    EXPECT_LT(positives / 4000, 0.45);
    EXPECT_GT(summary->planted_log_loss, 0.2);
    EXPECT_LT(summary->planted_log_loss, std::log(2.0));
  }
}

TEST(SyntheticCriteoTest, LinesLookLikeCriteos) {
  SyntheticCriteoOptions options = Small();
  options.num_examples = 500;
  options.missing_rate = 0.2;
  const std::string path = TempPath("look");
  ASSERT_TRUE(WriteSyntheticCriteo(options, path).ok());
  const std::string text = ReadAll(path);
  int empty_int = 0, negative = 0, empty_cat = 0, lines = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    ++lines;
    const std::vector<absl::string_view> columns = absl::StrSplit(line, '\t');
    ASSERT_EQ(columns.size(), 10u) << line;
    EXPECT_TRUE(columns[0] == "0" || columns[0] == "1") << line;
    for (int j = 1; j <= 4; ++j) {
      if (columns[j].empty()) ++empty_int;
      if (columns[j] == "-1") ++negative;
    }
    for (int f = 5; f < 10; ++f) {
      if (columns[f].empty()) {
        ++empty_cat;
      } else {
        EXPECT_EQ(columns[f].size(), 8u) << line;
        EXPECT_EQ(columns[f].find_first_not_of("0123456789abcdef"), absl::string_view::npos);
      }
    }
  }
  EXPECT_EQ(lines, 500);
  // 20% of the 2000 integer and 2500 categorical fields are empty.
  EXPECT_NEAR(empty_int, 400, 80);
  EXPECT_NEAR(empty_cat, 500, 100);
  EXPECT_GT(negative, 0);
}

TEST(SyntheticCriteoTest, DeterministicAndASmallerFileIsAPrefix) {
  SyntheticCriteoOptions options = Small();
  options.num_examples = 300;
  const std::string big = TempPath("big");
  ASSERT_TRUE(WriteSyntheticCriteo(options, big).ok());
  options.num_examples = 100;
  const std::string small = TempPath("small");
  ASSERT_TRUE(WriteSyntheticCriteo(options, small).ok());
  const std::string big_text = ReadAll(big);
  const std::string small_text = ReadAll(small);
  EXPECT_EQ(big_text.substr(0, small_text.size()), small_text);
  // Another stream of the same model is other examples.
  options.example_stream = 1;
  const std::string other = TempPath("other");
  ASSERT_TRUE(WriteSyntheticCriteo(options, other).ok());
  EXPECT_NE(ReadAll(other), small_text);
  // Gzip by name, the same lines.
  options.example_stream = 0;
  const std::string gz = TempPath("small.gz");
  ASSERT_TRUE(WriteSyntheticCriteo(options, gz).ok());
  auto a = ReadCriteo(small, ReaderFor(options));
  auto b = ReadCriteo(gz, ReaderFor(options));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->dense, b->dense);
  EXPECT_EQ(a->sparse_ids, b->sparse_ids);
  EXPECT_EQ(a->labels, b->labels);
  EXPECT_NE(ReadAll(gz), small_text);
}

TEST(SyntheticCriteoTest, BadOptionsAndUnwritablePath) {
  SyntheticCriteoOptions options = Small();
  options.missing_rate = 1.5;
  auto summary = WriteSyntheticCriteo(options, TempPath("never"));
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(summary.status().message(),
              HasSubstr("SyntheticCriteoOptions.missing_rate is 1.5, expected in [0, 1]"));
  options = Small();
  options.ids_per_field = 0;
  summary = WriteSyntheticCriteo(options, TempPath("never"));
  EXPECT_THAT(summary.status().message(), HasSubstr("ids_per_field is 0"));
  const std::string unwritable = TempPath("no_such_dir/file");
  summary = WriteSyntheticCriteo(Small(), unwritable);
  EXPECT_EQ(summary.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(summary.status().message(), HasSubstr("cannot create " + unwritable));
}

}  // namespace
}  // namespace pscluster
