#include "model/data/csv.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/data/feature_hash.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Type = CsvColumn::Type;

std::string Write(const std::string& name, const std::string& contents) {
  const std::string path = absl::StrCat(::testing::TempDir(), "/csv_test_", name);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  std::fwrite(contents.data(), 1, contents.size(), f);
  std::fclose(f);
  return path;
}

CsvColumn Column(const std::string& name, Type type) { return CsvColumn{name, type, {}}; }
CsvColumn Column(const std::string& name, Type type, const std::string& default_value) {
  return CsvColumn{name, type, default_value};
}

// label, age (float, default 0), visits (int, default 0), city (string, default ""), note
// (ignored).
CsvOptions People() {
  CsvOptions options;
  options.columns = {Column("clicked", Type::kLabel), Column("age", Type::kFloat, "0"),
                     Column("visits", Type::kInt, "0"), Column("city", Type::kString, ""),
                     Column("note", Type::kIgnore)};
  return options;
}

TEST(ReadCsvTest, TypedColumnsBecomeDenseFeaturesSparseIdsAndTheLabel) {
  auto data = ReadCsv(Write("people",
                            "1,31.5,4,Paris,whatever\n"
                            "0,,,,\n"
                            "1,-2e1,-7,\"New York, NY\",\"a \"\"quoted\"\" note\"\n"),
                      People());
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 3);
  EXPECT_EQ(data->dense_dim, 2);
  EXPECT_EQ(data->num_classes, 0);
  EXPECT_THAT(data->labels, ElementsAre(1, 0, 1));
  EXPECT_THAT(data->dense, ElementsAre(31.5f, 4.0f, 0.0f, 0.0f, -20.0f, -7.0f));
  // The empty city (default "") gives no id; ids are hashed with the column index (3).
  EXPECT_THAT(data->sparse_offsets, ElementsAre(0, 1, 1, 2));
  EXPECT_THAT(data->sparse_ids,
              ElementsAre(CategoricalId(3, "Paris", 0), CategoricalId(3, "New York, NY", 0)));
  EXPECT_TRUE(ValidateDataset(*data).ok()) << ValidateDataset(*data);
}

TEST(ReadCsvTest, HeaderDelimiterQuotesLineEndsAndBuckets) {
  CsvOptions options;
  options.columns = {Column("city", Type::kString, "unknown"), Column("x", Type::kFloat),
                     Column("y", Type::kLabel)};
  options.header = true;
  options.delimiter = ';';
  options.hash_buckets = 10;
  auto data = ReadCsv(Write("semicolons",
                            "city;x;y\r\n"
                            "\"Lyon; Rhone\";1.5;1\r\n"
                            "\r\n"
                            ";2;0.0\r\n"
                            "\"\";3;1"),
                      options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 3);
  EXPECT_THAT(data->dense, ElementsAre(1.5f, 2.0f, 3.0f));
  EXPECT_THAT(data->labels, ElementsAre(1, 0, 1));
  // An empty field, quoted or not, takes the default.
  EXPECT_THAT(data->sparse_ids,
              ElementsAre(CategoricalId(0, "Lyon; Rhone", 10), CategoricalId(0, "unknown", 10),
                          CategoricalId(0, "unknown", 10)));
  for (int64_t id : data->sparse_ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 10);
  }
}

TEST(ReadCsvTest, WithoutStringColumnsThereAreNoSparseFeatures) {
  CsvOptions options;
  options.columns = {Column("x", Type::kFloat), Column("y", Type::kLabel)};
  options.delimiter = '\t';
  auto data = ReadCsv(Write("tabs", "0.5\t1\n-1\t0\n"), options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_FALSE(data->has_sparse());
  EXPECT_THAT(data->dense, ElementsAre(0.5f, -1.0f));
}

TEST(ReadCsvTest, MaxExamplesReadsAPrefix) {
  CsvOptions options = People();
  options.max_examples = 2;
  auto data = ReadCsv(Write("prefix", "1,1,1,a,\n0,2,2,b,\nnot a record\n"), options);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_examples, 2);
}

struct BadRecord {
  std::string contents;
  std::string message;
};

TEST(ReadCsvTest, BadRecordsNameFileLineColumnAndWhatWasExpected) {
  const std::string good = "1,31,4,Paris,x\n";
  const std::vector<BadRecord> cases = {
      {good + "1,31,4,Paris\n", ":2: expected 5 columns separated by ',', got 4"},
      {good + good + "1,31,4,Paris,x,y\n", ":3: expected 5 columns separated by ',', got 6"},
      {"1,abc,4,Paris,x\n",
       ":1: column 2 (age): bad float 'abc': expected a finite decimal number"},
      {"1,inf,4,Paris,x\n", ":1: column 2 (age): bad float 'inf'"},
      {"1,31,4.5,Paris,x\n", ":1: column 3 (visits): bad int '4.5': expected a decimal integer"},
      {"2,31,4,Paris,x\n", ":1: column 1 (clicked): bad label '2': expected 0 or 1"},
      {",31,4,Paris,x\n", ":1: column 1 (clicked) is empty and has no default"},
      {"1,31,4,\"Paris,x\n",
       ":1: column 4 (city): unterminated quoted field (a quoted field cannot span lines)"},
      {"1,31,4,\"Par\"is,x\n",
       ":1: column 4 (city): 'i' after the closing quote: expected the delimiter ',' or the end "
       "of the line"},
      {"1,31,4,Pa\"ris,x\n", ":1: column 4 (city): '\"' inside the unquoted field 'Pa\"ris'"},
      // Past the declared columns, the column has no name.
      {"1,31,4,Paris,x,\"y\n", ":1: column 6: unterminated quoted field"},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = Write(absl::StrCat("bad", i), cases[i].contents);
    auto data = ReadCsv(path, People());
    ASSERT_FALSE(data.ok()) << cases[i].contents;
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument) << cases[i].contents;
    EXPECT_THAT(data.status().message(), HasSubstr(path + cases[i].message));
  }
}

TEST(ReadCsvTest, TheHeaderMustHaveAsManyColumns) {
  CsvOptions options = People();
  options.header = true;
  const std::string path = Write("header", "clicked,age,visits,city\n1,2,3,a,b\n");
  auto data = ReadCsv(path, options);
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(data.status().message(),
              HasSubstr(path + ":1: the header has 4 columns separated by ',', expected 5"));
}

TEST(ReadCsvTest, MissingFileIsNotFound) {
  const std::string missing = absl::StrCat(::testing::TempDir(), "/csv_test_none");
  auto data = ReadCsv(missing, People());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(data.status().message(), HasSubstr(missing));
}

TEST(ValidateCsvOptionsTest, NamesWhatIsWrong) {
  struct Case {
    CsvOptions options;
    std::string message;
  };
  std::vector<Case> cases;
  cases.push_back({CsvOptions(), "no columns"});
  {
    CsvOptions o;
    o.columns = {Column("x", Type::kFloat)};
    cases.push_back({o, "0 label columns, expected exactly 1"});
    o.columns = {Column("y", Type::kLabel), Column("z", Type::kLabel)};
    cases.push_back({o, "2 label columns, expected exactly 1"});
    o.columns = {Column("y", Type::kLabel), Column("y", Type::kFloat)};
    cases.push_back({o, "CSV column 2 (y): the name is used by an earlier column too"});
    o.columns = {Column("y", Type::kLabel), Column("", Type::kFloat)};
    cases.push_back({o, "CSV column 2 has no name"});
    o.columns = {Column("y", Type::kLabel), Column("x", Type::kFloat, "zero")};
    cases.push_back(
        {o,
         "CSV column 2 (x): bad default 'zero' for a float column: expected a finite decimal "
         "number"});
    o.columns = {Column("y", Type::kLabel, "0.5")};
    cases.push_back({o, "CSV column 1 (y): bad default '0.5' for a label column"});
  }
  {
    CsvOptions o = People();
    o.delimiter = '"';
    cases.push_back({o, "bad delimiter"});
    o = People();
    o.hash_buckets = -1;
    cases.push_back({o, "hash_buckets is -1, expected >= 0"});
    o = People();
    o.hash_buckets = int64_t{1} << 62;
    cases.push_back({o, "columns * hash_buckets fits in int64"});
  }
  for (const Case& c : cases) {
    absl::Status s = ValidateCsvOptions(c.options);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_THAT(s.message(), HasSubstr(c.message));
  }
  EXPECT_TRUE(ValidateCsvOptions(People()).ok());
}

TEST(ParseCsvColumnsTest, ReadsNamesTypesAndDefaults) {
  auto columns =
      ParseCsvColumns("click:label,age:float:0,n:int,city:string:,note:ignore,t:string:a:b");
  ASSERT_TRUE(columns.ok()) << columns.status();
  ASSERT_EQ(columns->size(), 6u);
  EXPECT_EQ((*columns)[0].name, "click");
  EXPECT_EQ((*columns)[0].type, Type::kLabel);
  EXPECT_FALSE((*columns)[0].default_value.has_value());
  EXPECT_EQ((*columns)[1].type, Type::kFloat);
  EXPECT_EQ((*columns)[1].default_value, "0");
  EXPECT_EQ((*columns)[2].type, Type::kInt);
  EXPECT_FALSE((*columns)[2].default_value.has_value());
  EXPECT_EQ((*columns)[3].type, Type::kString);
  EXPECT_EQ((*columns)[3].default_value, "");
  EXPECT_EQ((*columns)[4].type, Type::kIgnore);
  EXPECT_EQ((*columns)[5].default_value, "a:b");
}

TEST(ParseCsvColumnsTest, ErrorsNameTheEntry) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"click:label,age", "entry 2 'age': no type (expected name:type or name:type:default"},
      {"click:label,:float", "entry 2 ':float': no name"},
      {"click:label,city:str", "entry 2 'city:str': unknown type 'str'"},
      {"click:label,,x:float", "entry 2 '': no type"},
      {"age:float", "0 label columns, expected exactly 1"},
      {"click:label,age:float:x", "CSV column 2 (age): bad default 'x' for a float column"},
  };
  for (const auto& [spec, message] : cases) {
    auto columns = ParseCsvColumns(spec);
    EXPECT_EQ(columns.status().code(), absl::StatusCode::kInvalidArgument) << spec;
    EXPECT_THAT(columns.status().message(), HasSubstr(message)) << spec;
  }
}

}  // namespace
}  // namespace pscluster
