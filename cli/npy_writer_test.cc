#include "cli/npy_writer.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cli/npy_reader.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pscluster {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(NpyWriterTest, HeaderIsVersion1WithTheDictPaddedTo64Bytes) {
  const std::string h = NpyHeader({64, 16});
  ASSERT_EQ(h.size() % 64, 0u);
  EXPECT_EQ(h.substr(0, 6), "\x93NUMPY");
  EXPECT_EQ(h[6], 1);
  EXPECT_EQ(h[7], 0);
  const size_t len = static_cast<unsigned char>(h[8]) | (static_cast<unsigned char>(h[9]) << 8);
  EXPECT_EQ(len, h.size() - 10);
  const std::string dict = h.substr(10);
  EXPECT_EQ(dict.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (64, 16), }", 0), 0u)
      << dict;
  EXPECT_EQ(dict.back(), '\n');
  // Only spaces between the dict and the newline.
  const size_t close = dict.find('}');
  EXPECT_EQ(dict.find_first_not_of(' ', close + 1), dict.size() - 1);
}

TEST(NpyWriterTest, OneDimensionalAndScalarShapesArePythonTuples) {
  EXPECT_THAT(NpyHeader({5}), HasSubstr("'shape': (5,), }"));
  EXPECT_THAT(NpyHeader({}), HasSubstr("'shape': (), }"));
  EXPECT_THAT(NpyHeader({2, 3, 4}), HasSubstr("'shape': (2, 3, 4), }"));
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{5}, {}, {2, 3, 4}, {123456789, 1}}) {
    EXPECT_EQ(NpyHeader(shape).size() % 64, 0u);
  }
}

TEST(NpyWriterTest, DataIsLittleEndianFloat32AfterTheHeader) {
  const std::vector<float> v = {1.0f, -2.5f};
  const std::string file = EncodeNpy({2}, v.data(), 2);
  const std::string data = file.substr(NpyHeader({2}).size());
  // 1.0f = 0x3f800000, -2.5f = 0xc0200000, least significant byte first.
  EXPECT_EQ(data, std::string("\x00\x00\x80\x3f\x00\x00\x20\xc0", 8));
}

TEST(NpyWriterTest, ParsesBackToTheSameShapeAndValues) {
  std::vector<float> v(3 * 4);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.25f * i - 1;
  v[5] = std::numeric_limits<float>::quiet_NaN();
  v[6] = -std::numeric_limits<float>::infinity();
  auto parsed = ParseNpy(EncodeNpy({3, 4}, v.data(), v.size()));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_THAT(parsed->shape, ElementsAre(3, 4));
  EXPECT_EQ(parsed->data_offset % 64, 0u);
  ASSERT_EQ(parsed->values.size(), v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    if (std::isnan(v[i])) {
      EXPECT_TRUE(std::isnan(parsed->values[i]));
    } else {
      EXPECT_EQ(parsed->values[i], v[i]) << i;
    }
  }
}

TEST(NpyWriterTest, WritesAFileAndRefusesAMismatchedShape) {
  const std::string path = absl::StrCat(getenv("TEST_TMPDIR"), "/w.npy");
  const std::vector<float> v = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(WriteNpyFile(path, {2, 3}, v.data(), 6).ok());
  auto read = ReadNpyFile(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_THAT(read->shape, ElementsAre(2, 3));
  EXPECT_EQ(read->values, v);
  std::ifstream tmp(path + ".tmp");
  EXPECT_FALSE(tmp.good()) << "the temporary file is renamed away";

  absl::Status s = WriteNpyFile(path, {4, 3}, v.data(), 6);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("6 elements do not fill shape (4, 3)"));

  s = WriteNpyFile("/nonexistent-dir/x.npy", {2, 3}, v.data(), 6);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent-dir/x.npy"));
}

TEST(NpyReaderTest, RefusesWhatIsNotFloat32Npy) {
  EXPECT_EQ(ParseNpy("hello").status().code(), absl::StatusCode::kInvalidArgument);
  std::string f = EncodeNpy({1}, std::vector<float>{1}.data(), 1);
  std::string bad_dtype = f;
  bad_dtype.replace(bad_dtype.find("<f4"), 3, "<f8");
  EXPECT_THAT(std::string(ParseNpy(bad_dtype).status().message()), HasSubstr("'<f8'"));
  EXPECT_THAT(std::string(ParseNpy(f.substr(0, f.size() - 1)).status().message()),
              HasSubstr("needs 4"));
}

// Written beside fuzz/npy_reader_fuzzer: the element count of these shapes overflowed int64
// (UBSan), and (2^62,) wrapped its byte count to 0, matched an empty data section and asked
// for 2^62 floats (std::length_error).
TEST(NpyReaderTest, RefusesAShapeTooLargeToCount) {
  for (const std::string shape : {"(4611686018427387904, 4)", "(4611686018427387904,)"}) {
    std::string f = EncodeNpy({1}, std::vector<float>{1}.data(), 1);
    f.replace(f.find("(1,)"), 4, shape);
    f.erase(f.size() - 4 - (shape.size() - 4), shape.size() - 4);  // same header length
    f.resize(f.size() - 4);                                        // no data
    f[f.size() - 1] = '\n';
    const absl::Status s = ParseNpy(f).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << shape;
    EXPECT_THAT(std::string(s.message()),
                HasSubstr(absl::StrCat("npy shape ", shape,
                                       " has more than 2305843009213693951 "
                                       "elements")));
  }
}

}  // namespace
}  // namespace pscluster
